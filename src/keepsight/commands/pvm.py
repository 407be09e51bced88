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
from ..train.pvm_grpo import TRAINABLE, GRPOData, GRPOTrainConfig, train_pvm_grpo
from ..train.pvm_sft import PVMTrainConfig, train_pvm_sft
from ..train.rewards import load_reward
from ..world.grpo import GRPO_TASKS, world_grpo_data
from ..world.tasks import instruct_data
from .config_options import add_config_options, given_settings, option_names
from .options import (
    data_args,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    print_stopped,
    read_samples,
    training_args,
    user_data,
)

WORLD_TASKS = ("describe", "open")  # grpo on a world: the default prompts
REWARDS = ("exact",)  # grpo on a user's data: the default reward
# options of one stage only (the other stage refuses them)
SFT_ONLY = ("layers", "pvm_hidden_size", "batch_size")
GRPO_ONLY = ("init", "trainable", "beta", "num_generations", "prompts_per_step", "max_completion_length", "tasks",
             "reward")
# each stage's training config: --train.FIELD reaches the one of --stage
STAGE_CONFIGS = {"sft": PVMTrainConfig, "grpo": GRPOTrainConfig}
# config fields that have their own short option above (--layers, --steps, ...)
PVM_SHORT = {"layers", "pvm_hidden_size"}
TRAIN_SHORT = {"steps", "lr", "gate_lr", "batch_size", "seed", "max_length", "skip_bad_rows", "beta", "num_generations",
               "prompts_per_step", "max_completion_length", "trainable"}


def add_parser(sub) -> None:
    pv = sub.add_parser("pvm", help="Persistent Visual Memory").add_subparsers(dest="pvm_command", required=True)
    pt = pv.add_parser("train", help="stage 1 (sft, backbone frozen) or stage 2 (grpo) of a PVM adapter")
    pt.add_argument("--stage", default="sft", choices=["sft", "grpo"])
    pt.add_argument("--model", required=True, help="base model directory")
    data_args(pt)
    pt.add_argument("--out", required=True, help="adapter directory (pvm_config.json + pvm.safetensors)")
    pt.add_argument("--init", help="grpo: the stage-1 adapter to start from (also the KL reference)")
    pt.add_argument("--layers", type=int, nargs="+", help="sft: decoder layers (default: strided; the release: 8 16 24 "
                    "for Qwen3-VL-8B, 5 11 17 for 4B)")
    pt.add_argument("--pvm-hidden-size", type=positive_int, help="sft: the latent width (default: 512 as released, at "
                    "most width / 4 on narrower models)")
    sft, grpo, sft_r, grpo_r = PVMTrainConfig(), GRPOTrainConfig(), PVMTrainConfig.released(), GRPOTrainConfig.released()
    pt.add_argument("--recipe", default="ours", choices=["ours", "released"], help=f"the training settings: ours (sft "
                    f"lr {sft.lr:g}, gate {sft.gate_lr:g}, batch {sft.batch_size}; grpo lr {grpo.lr:g}, "
                    f"{grpo.trainable} trainable, KL {grpo.beta:g}) or the authors' (sft lr {sft_r.lr:g} "
                    f"{sft_r.schedule}, warm-up {sft_r.warmup_ratio:g}, batch {sft_r.batch_size}; grpo lr {grpo_r.lr:g} "
                    f"{grpo_r.schedule}, {grpo_r.num_generations} completions, {grpo_r.trainable} trainable, KL "
                    f"{grpo_r.beta:g}); the options below override either")
    pt.add_argument("--steps", type=positive_int, help=f"default: {sft.steps} (sft), {grpo.steps} (grpo)")
    pt.add_argument("--lr", type=positive_float, help="projections (grpo llm+pvm: the language model too)")
    pt.add_argument("--gate-lr", type=positive_float, help="the gate")
    pt.add_argument("--batch-size", type=positive_int, help=f"sft (default: {sft.batch_size} ours, {sft_r.batch_size} "
                    "released)")
    pt.add_argument("--trainable", choices=TRAINABLE, help="grpo: PVM only (an adapter comes out) or the language "
                    "model too (a whole checkpoint in the released layout); default: the recipe's")
    pt.add_argument("--beta", type=nonneg_float, help=f"grpo: KL coefficient (0 = no reference model; default "
                    f"{grpo.beta:g} ours, {grpo_r.beta:g} released)")
    pt.add_argument("--num-generations", type=positive_int, help=f"grpo: completions per prompt ({grpo.num_generations} "
                    f"ours, {grpo_r.num_generations} released)")
    pt.add_argument("--prompts-per-step", type=positive_int, help=f"grpo ({grpo.prompts_per_step} ours, "
                    f"{grpo_r.prompts_per_step} released)")
    pt.add_argument("--max-completion-length", type=positive_int, help="grpo (default: the world's description budget)")
    pt.add_argument("--tasks", nargs="+", choices=GRPO_TASKS, help=f"grpo on a world: its prompts (default: "
                    f"{' '.join(WORLD_TASKS)})")
    pt.add_argument("--reward", nargs="+", help=f"grpo on your data: rewards against each row's last assistant turn "
                    f"({' | '.join(KINDS)}), or module:function (TRL's reward signature; default: {REWARDS[0]})")
    pt.add_argument("--seed", type=nonneg_int, default=PVMTrainConfig.seed,
                    help="model initialisation, data order and the objective's randomness (default: %(default)s)")
    training_args(pt)
    add_config_options(pt, "pvm", PVMConfig, skip=PVM_SHORT, title="sft: the PVM block (--pvm.FIELD)",
                       note="every field of keepsight.pvm.PVMConfig not set above")
    add_config_options(pt, "train", STAGE_CONFIGS, skip=TRAIN_SHORT, title="training (--train.FIELD)",
                       note="every field of keepsight.train.pvm_sft.PVMTrainConfig (sft) and "
                       "keepsight.train.pvm_grpo.GRPOTrainConfig (grpo) not set above, for the --stage trained")
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
    own = user_data(args)
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
        make = GRPOTrainConfig.released if args.recipe == "released" else GRPOTrainConfig
        short = dict(steps=args.steps, lr=args.lr, gate_lr=args.gate_lr, beta=args.beta,
                     num_generations=args.num_generations, prompts_per_step=args.prompts_per_step,
                     trainable=args.trainable)
        given = {**{k: v for k, v in short.items() if v is not None}, **given_settings(args, "train", GRPOTrainConfig)}
        cfg = make(**given, seed=args.seed, max_completion_length=args.max_completion_length,
                   max_length=args.max_length, skip_bad_rows=args.skip_bad_rows)
        if own is None:
            data = world_grpo_data(samples, args.tasks or list(WORLD_TASKS), args.seed)
        else:
            data = GRPOData.from_samples(own, [load_reward(r) for r in args.reward or REWARDS],
                                         max_completion_length=args.max_completion_length or 128)
        summary = train_pvm_grpo(args.model, args.init, data, args.out, cfg, stop_after=args.stop_after,
                                 grad_accum=args.grad_accum, overwrite=args.overwrite)
        if summary is None:
            return print_stopped(args.stop_after)
        print_gates(summary["after"])
        first, last = summary["first_reward"] or {}, summary["last_reward"] or {}
        print(f"reward {first.get('reward', float('nan')):.3f} -> {last.get('reward', float('nan')):.3f}; "
              f"adapter in {args.out}")
        return 0
    pvm_cfg = PVMConfig(layers=args.layers or "strided", pvm_hidden_size=args.pvm_hidden_size,
                        **given_settings(args, "pvm", PVMConfig))
    make = PVMTrainConfig.released if args.recipe == "released" else PVMTrainConfig
    short = dict(steps=args.steps, lr=args.lr, gate_lr=args.gate_lr, batch_size=args.batch_size)
    given = {**{k: v for k, v in short.items() if v is not None}, **given_settings(args, "train", PVMTrainConfig)}
    train_cfg = make(**given, seed=args.seed, max_length=args.max_length, skip_bad_rows=args.skip_bad_rows)
    data = instruct_data(samples, args.seed) if own is None else own
    summary = train_pvm_sft(args.model, data, args.out, pvm_cfg, train_cfg,
                            stop_after=args.stop_after, grad_accum=args.grad_accum, overwrite=args.overwrite)
    if summary is None:
        return print_stopped(args.stop_after)
    print_gates(summary["after"])
    print(f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; adapter in {args.out}")
    return 0


def _refuse_options(args) -> None:
    """Options of the other stage, short or generated, are errors naming them (the adapter fixes the block's shape
    for grpo; sft starts a new adapter with the PVM blocks the only trainable part)."""
    other = GRPO_ONLY if args.stage == "sft" else SFT_ONLY
    given = [o for o in other if getattr(args, o) is not None]
    if given:
        names = ", ".join("--" + o.replace("_", "-") for o in given)
        why = ("stage 1 (sft) starts a new adapter and trains its blocks only" if args.stage == "sft" else
               "stage 2 (grpo) continues the --init adapter, whose blocks are fixed, with its own batch "
               "(--prompts-per-step x --num-generations)")
        raise ValueError(f"{names}: not for --stage {args.stage} ({why})")
    other = "grpo" if args.stage == "sft" else "sft"
    own = {f.name for f in dataclasses.fields(STAGE_CONFIGS[args.stage])}
    found = {k: v for k, v in given_settings(args, "train", STAGE_CONFIGS[other]).items() if k not in own}
    if found:
        raise ValueError(f"{option_names('train', found)} apply to --stage {other}; this run is --stage {args.stage}")
    found = given_settings(args, "pvm", PVMConfig) if args.stage == "grpo" else {}
    if found:
        raise ValueError(f"{option_names('pvm', found)} apply to --stage sft; this run is --stage grpo (the --init "
                         "adapter fixes the blocks)")
