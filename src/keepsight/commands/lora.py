"""``keepsight lora train``: the parameter-matched LoRA control for PVM, on a world or the user's own data."""

from __future__ import annotations

from ..atomic import check_output_dir
from ..pvm import PVMConfig
from ..train.lora_control import LoRARecipe, LoRATrainConfig, train_lora_control
from ..world.tasks import instruct_data
from .config_options import add_config_options, given_settings
from .options import data_args, print_stopped, read_samples, short_options, training_args, user_data


def add_parser(sub) -> None:
    lo = sub.add_parser("lora", help="the parameter-matched LoRA control for PVM").add_subparsers(
        dest="lora_command", required=True)
    lt = lo.add_parser("train", help="train a LoRA with PVM's layers and (nearest) parameter count")
    lt.add_argument("--model", required=True, help="base model directory")
    data_args(lt)
    lt.add_argument("--out", required=True, help="adapter directory (PEFT format)")
    training_args(lt)
    add_config_options(lt, "pvm", PVMConfig, short=short_options("layers", "pvm_hidden_size", training=False),
                       title="the PVM block to match (--layers, --pvm-hidden-size and --pvm.FIELD)",
                       note="keepsight.pvm.PVMConfig")
    add_config_options(lt, "train", LoRATrainConfig, short=short_options(),
                       title="training (--steps ... and --train.FIELD)",
                       note="keepsight.train.lora_control.LoRATrainConfig")
    lt.set_defaults(func=run_train)


def run_train(args) -> int:
    check_output_dir(args.out, "--out", kinds=(LoRARecipe.kind,), inputs=[args.model, args.data])
    pvm_cfg = PVMConfig(**given_settings(args, "pvm", PVMConfig))
    cfg = LoRATrainConfig(**given_settings(args, "train", LoRATrainConfig))
    own = user_data(args, cfg.skip_bad_rows)
    data = instruct_data(read_samples(args.data), cfg.seed) if own is None else own
    summary = train_lora_control(args.model, data, args.out, pvm_cfg,
                                 cfg, stop_after=args.stop_after, grad_accum=args.grad_accum, overwrite=args.overwrite)
    if summary is None:
        return print_stopped(args.stop_after)
    print(f"LoRA rank {summary['rank']} on layers {summary['layers']}: {summary['lora_parameters']} parameters "
          f"(PVM: {summary['pvm_parameters']}); loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; "
          f"adapter in {args.out}")
    return 0
