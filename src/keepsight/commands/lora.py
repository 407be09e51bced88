"""``keepsight lora train``: the parameter-matched LoRA control for PVM, on a world or the user's own data."""

from __future__ import annotations

from ..atomic import check_output_dir
from ..pvm import PVMConfig
from ..train.lora_control import LoRARecipe, LoRATrainConfig, train_lora_control
from ..world.tasks import instruct_data
from .config_options import add_config_options, given_settings
from .options import (
    data_args,
    nonneg_int,
    positive_float,
    positive_int,
    print_stopped,
    read_samples,
    training_args,
    user_data,
)

PVM_SHORT = {"layers", "pvm_hidden_size"}  # config fields with their own short option
TRAIN_SHORT = {"steps", "lr", "batch_size", "seed", "max_length", "skip_bad_rows"}


def add_parser(sub) -> None:
    lo = sub.add_parser("lora", help="the parameter-matched LoRA control for PVM").add_subparsers(
        dest="lora_command", required=True)
    lt = lo.add_parser("train", help="train a LoRA with PVM's layers and (nearest) parameter count")
    lt.add_argument("--model", required=True, help="base model directory")
    data_args(lt)
    lt.add_argument("--out", required=True, help="adapter directory (PEFT format)")
    lt.add_argument("--layers", type=int, nargs="+", help="the PVM layers to match (default: strided)")
    lt.add_argument("--pvm-hidden-size", type=positive_int, help="the PVM latent width to match (default: PVM's)")
    lt.add_argument("--steps", type=positive_int, help=f"default: {LoRATrainConfig.steps}")
    lt.add_argument("--lr", type=positive_float, help=f"default: {LoRATrainConfig.lr}")
    lt.add_argument("--batch-size", type=positive_int, help=f"default: {LoRATrainConfig.batch_size}")
    lt.add_argument("--seed", type=nonneg_int, default=LoRATrainConfig.seed,
                    help="model initialisation, data order and the objective's randomness (default: %(default)s)")
    training_args(lt)
    add_config_options(lt, "pvm", PVMConfig, skip=PVM_SHORT, title="the PVM block to match (--pvm.FIELD)",
                       note="every field of keepsight.pvm.PVMConfig not set above")
    add_config_options(lt, "train", LoRATrainConfig, skip=TRAIN_SHORT, title="training (--train.FIELD)",
                       note="every field of keepsight.train.lora_control.LoRATrainConfig not set above")
    lt.set_defaults(func=run_train)


def run_train(args) -> int:
    check_output_dir(args.out, "--out", kinds=(LoRARecipe.kind,), inputs=[args.model, args.data])
    pvm_cfg = PVMConfig(layers=args.layers or "strided", pvm_hidden_size=args.pvm_hidden_size,
                        **given_settings(args, "pvm", PVMConfig))
    short = {k: v for k, v in dict(steps=args.steps, lr=args.lr, batch_size=args.batch_size).items() if v is not None}
    cfg = LoRATrainConfig(**short, **given_settings(args, "train", LoRATrainConfig), seed=args.seed,
                          max_length=args.max_length, skip_bad_rows=args.skip_bad_rows)
    own = user_data(args)
    data = instruct_data(read_samples(args.data), args.seed) if own is None else own
    summary = train_lora_control(args.model, data, args.out, pvm_cfg,
                                 cfg, stop_after=args.stop_after, grad_accum=args.grad_accum, overwrite=args.overwrite)
    if summary is None:
        return print_stopped(args.stop_after)
    print(f"LoRA rank {summary['rank']} on layers {summary['layers']}: {summary['lora_parameters']} parameters "
          f"(PVM: {summary['pvm_parameters']}); loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; "
          f"adapter in {args.out}")
    return 0
