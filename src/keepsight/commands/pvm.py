"""``keepsight pvm train``: stage 1 (SFT, backbone frozen) and stage 2 (GRPO) of a PVM adapter, on a world or on
the user's own data (LLaVA JSON / JSONL, Hugging Face datasets; see ``keepsight.data.sources``); ``keepsight pvm
convert``: adapter files to and from the released checkpoint layout."""

from __future__ import annotations

import dataclasses

from ..atomic import check_output_dir
from ..metrics.answers import KINDS
from ..models import load_checkpoint
from ..pvm import PVMConfig, load_pvm, save_pvm
from ..pvm.io import ADAPTER_KIND
from ..pvm.layout import CHECKPOINT_KIND, save_released
from ..train.pvm_grpo import GRPOData, GRPOTrainConfig, train_pvm_grpo
from ..train.pvm_sft import PVMTrainConfig, train_pvm_sft
from ..train.rewards import load_reward
from ..world.grpo import GRPO_TASKS, world_grpo_data
from ..world.tasks import instruct_data
from .config_options import add_config_options, given_settings, option_names, short_option
from .options import data_args, print_stopped, read_samples, short_options, training_args, user_data

WORLD_TASKS = ("describe", "open")  # grpo on a world: the default prompts
REWARDS = ("exact",)  # grpo on a user's data: the default reward
GRPO_ONLY = ("init", "tasks", "reward")  # options of stage 2 that no config holds (the configs' fields are checked too)
# each stage's training config: --steps, --train.FIELD, ... reach the one of --stage
STAGE_CONFIGS = {"sft": PVMTrainConfig, "grpo": GRPOTrainConfig}


def add_parser(sub) -> None:
    pv = sub.add_parser("pvm", help="Persistent Visual Memory").add_subparsers(dest="pvm_command", required=True)
    pt = pv.add_parser("train", help="stage 1 (sft, backbone frozen) or stage 2 (grpo) of a PVM adapter")
    pt.add_argument("--stage", default="sft", choices=["sft", "grpo"])
    pt.add_argument("--model", required=True, help="base model directory")
    data_args(pt)
    pt.add_argument("--out", required=True, help="adapter directory (pvm_config.json + pvm.safetensors)")
    pt.add_argument("--init", help="grpo: the stage-1 adapter to start from (also the KL reference)")
    sft, grpo, sft_r, grpo_r = PVMTrainConfig(), GRPOTrainConfig(), PVMTrainConfig.released(), GRPOTrainConfig.released()
    pt.add_argument("--recipe", default="ours", choices=["ours", "released"], help=f"the training settings: ours (sft "
                    f"lr {sft.lr:g}, gate {sft.gate_lr:g}, batch {sft.batch_size}; grpo lr {grpo.lr:g}, "
                    f"{grpo.trainable} trainable, KL {grpo.beta:g}) or the authors' (sft lr {sft_r.lr:g} "
                    f"{sft_r.schedule}, warm-up {sft_r.warmup_ratio:g}, batch {sft_r.batch_size}; grpo lr {grpo_r.lr:g} "
                    f"{grpo_r.schedule}, {grpo_r.num_generations} completions, {grpo_r.trainable} trainable, KL "
                    f"{grpo_r.beta:g}); the options below override either (their defaults are ours)")
    pt.add_argument("--tasks", nargs="+", choices=GRPO_TASKS, help=f"grpo on a world: its prompts (default: "
                    f"{' '.join(WORLD_TASKS)})")
    pt.add_argument("--reward", nargs="+", help=f"grpo on your data: rewards against each row's last assistant turn "
                    f"({' | '.join(KINDS)}), or module:function (TRL's reward signature; default: {REWARDS[0]})")
    training_args(pt)
    add_config_options(pt, "pvm", PVMConfig, short=short_options("layers", "pvm_hidden_size", training=False),
                       title="sft: the PVM block (--layers, --pvm-hidden-size and --pvm.FIELD)",
                       note="keepsight.pvm.PVMConfig; the release: layers 8 16 24 for Qwen3-VL-8B, 5 11 17 for 4B")
    add_config_options(pt, "train", STAGE_CONFIGS, title="training (--steps ... and --train.FIELD)",
                       short=short_options("gate_lr", "beta", "num_generations", "prompts_per_step",
                                           "max_completion_length", "trainable"),
                       note="keepsight.train.pvm_sft.PVMTrainConfig (sft) and keepsight.train.pvm_grpo.GRPOTrainConfig "
                       "(grpo), for the --stage trained")
    pt.set_defaults(func=run_train)

    pc = pv.add_parser("convert", help="between keepsight's adapter files and the released PVM checkpoint layout")
    pc.add_argument("--model", required=True, help="a base model (with --pvm) or a checkpoint in the released layout")
    pc.add_argument("--pvm", help="an adapter (released variant) to write with --model as one released checkpoint")
    pc.add_argument("--out", required=True, help="the released checkpoint (with --pvm) or the adapter (without)")
    pc.add_argument("--overwrite", action="store_true", help="replace an existing output of keepsight's")
    pc.set_defaults(func=run_convert)


def print_gates(report: dict) -> None:
    for key, v in report.items():
        print(f"layer {key}: gate {v['gate_mean']:+.4f}, ||PVM|| / ||FFN|| {v['relative_norm']:.4f}")


def run_convert(args) -> int:
    """Adapter + base -> a released checkpoint (--pvm given), or a released checkpoint -> an adapter."""
    kind = CHECKPOINT_KIND if args.pvm else ADAPTER_KIND
    out = check_output_dir(args.out, "--out", kinds=(kind,), inputs=[args.model, args.pvm])
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise ValueError(f"--out {out} exists; pass --overwrite to replace it (keepsight's own outputs only)")
    model, processor = load_checkpoint(args.model, dtype=None, device="cpu", expect="autoregressive")
    if args.pvm:
        if getattr(model, "_keepsight_pvm", None) is not None:
            raise ValueError(f"--model {args.model} already carries PVM (a released checkpoint); give its base")
        load_pvm(model, args.pvm)
        save_released(model, out, processor)
        print(f"wrote {out}: the released PVM layout (layers {model._keepsight_pvm.layers})")
    else:
        if getattr(model, "_keepsight_pvm", None) is None:
            raise ValueError(f"--model {args.model} is not in the released PVM layout (text_config.pvm_layers); give "
                             "--pvm to write an adapter into that layout instead")
        save_pvm(model, out)
        print(f"wrote {out}: a PVM adapter (layers {model._keepsight_pvm.layers}) for the backbone of {args.model}")
    return 0


def run_train(args) -> int:
    check_output_dir(args.out, "--out", kinds=(ADAPTER_KIND, CHECKPOINT_KIND), inputs=[args.model, args.data, args.init])
    _refuse_options(args)
    config = STAGE_CONFIGS[args.stage]
    make = config.released if args.recipe == "released" else config
    cfg = make(**given_settings(args, "train", config))
    own = user_data(args, cfg.skip_bad_rows)
    samples = read_samples(args.data) if own is None else None
    if own is not None and args.tasks:
        raise ValueError("--tasks choose the prompts of a world; --data is your own dataset (its rows are the "
                         "prompts; --reward scores them)")
    if own is None and args.reward:
        raise ValueError("--reward scores the rows of your own dataset; on a world the rewards are the world's "
                         "(--tasks chooses its prompts)")
    if args.stage == "grpo":
        if not args.init:
            raise ValueError("--stage grpo needs --init: the stage-1 adapter directory it starts from")
        if own is None:
            data = world_grpo_data(samples, args.tasks or list(WORLD_TASKS), cfg.seed)
        else:
            data = GRPOData.from_samples(own, [load_reward(r) for r in args.reward or REWARDS],
                                         max_completion_length=cfg.max_completion_length or 128)
        summary = train_pvm_grpo(args.model, args.init, data, args.out, cfg, stop_after=args.stop_after,
                                 grad_accum=args.grad_accum, overwrite=args.overwrite)
        if summary is None:
            return print_stopped(args.stop_after)
        print_gates(summary["after"])
        first, last = summary["first_reward"] or {}, summary["last_reward"] or {}
        print(f"reward {first.get('reward', float('nan')):.3f} -> {last.get('reward', float('nan')):.3f}; "
              f"adapter in {args.out}")
        return 0
    pvm_cfg = PVMConfig(**given_settings(args, "pvm", PVMConfig))
    data = instruct_data(samples, cfg.seed) if own is None else own
    summary = train_pvm_sft(args.model, data, args.out, pvm_cfg, cfg,
                            stop_after=args.stop_after, grad_accum=args.grad_accum, overwrite=args.overwrite)
    if summary is None:
        return print_stopped(args.stop_after)
    print_gates(summary["after"])
    print(f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; adapter in {args.out}")
    return 0


def _refuse_options(args) -> None:
    """Options of the other stage, short or generated, are errors naming them (the adapter fixes the block's shape
    for grpo; sft starts a new adapter with the PVM blocks the only trainable part)."""
    given = [o for o in GRPO_ONLY if getattr(args, o) is not None] if args.stage == "sft" else []
    if given:
        names = ", ".join(short_option(o) for o in given)
        raise ValueError(f"{names}: not for --stage sft (stage 1 starts a new adapter and trains its blocks only)")
    other = "grpo" if args.stage == "sft" else "sft"
    own = {f.name for f in dataclasses.fields(STAGE_CONFIGS[args.stage]) if f.init}
    found = {k: v for k, v in given_settings(args, "train", STAGE_CONFIGS[other]).items() if k not in own}
    if found:
        why = ("" if other == "grpo" else " (stage 2 continues the --init adapter with its own batch: "
               "--prompts-per-step x --num-generations)")
        raise ValueError(f"{option_names('train', found, args)}: not for --stage {args.stage}; they apply to --stage "
                         f"{other}{why}")
    found = given_settings(args, "pvm", PVMConfig) if args.stage == "grpo" else {}
    if found:
        raise ValueError(f"{option_names('pvm', found, args)}: not for --stage grpo (the --init adapter fixes the "
                         "blocks; they apply to --stage sft)")
