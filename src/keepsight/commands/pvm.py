"""``keepsight pvm train``: stage 1 (SFT, backbone frozen) and stage 2 (GRPO) of a PVM adapter, on a world or on
the user's own data (LLaVA JSON / JSONL, Hugging Face datasets; see ``keepsight.data.sources``)."""

from __future__ import annotations

from ..atomic import check_output_dir
from ..metrics.answers import KINDS
from ..pvm import PVMConfig
from ..pvm.io import ADAPTER_KIND
from ..train.pvm_grpo import GRPOData, GRPOTrainConfig, train_pvm_grpo
from ..train.pvm_sft import PVMTrainConfig, train_pvm_sft
from ..train.rewards import load_reward
from ..world.grpo import GRPO_TASKS, world_grpo_data
from ..world.tasks import instruct_data
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


def add_parser(sub) -> None:
    pv = sub.add_parser("pvm", help="Persistent Visual Memory").add_subparsers(dest="pvm_command", required=True)
    pt = pv.add_parser("train", help="stage 1 (sft, backbone frozen) or stage 2 (grpo) of a PVM adapter")
    pt.add_argument("--stage", default="sft", choices=["sft", "grpo"])
    pt.add_argument("--model", required=True, help="base model directory")
    data_args(pt)
    pt.add_argument("--out", required=True, help="adapter directory (pvm_config.json + pvm.safetensors)")
    pt.add_argument("--init", help="grpo: the stage-1 adapter to start from (also the KL reference)")
    pt.add_argument("--layers", type=int, nargs="+", help="sft: decoder layers (default: strided)")
    pt.add_argument("--latent-dim", type=positive_int, help="sft: d' (default: hidden / 4)")
    pt.add_argument("--heads", type=positive_int, default=1, help="sft")
    pt.add_argument("--gate", default="scalar", choices=["scalar", "channel"], help="sft")
    pt.add_argument("--steps", type=positive_int, help="default: 600 (sft), 100 (grpo)")
    pt.add_argument("--lr", type=positive_float, help="projections; default: 1e-3 (sft), 2e-4 (grpo)")
    pt.add_argument("--gate-lr", type=positive_float, help="the gate; default: 1e-2 (sft), 2e-3 (grpo)")
    pt.add_argument("--batch-size", type=positive_int, default=16, help="sft")
    pt.add_argument("--beta", type=nonneg_float, default=0.04, help="grpo: KL coefficient (0 = no reference model)")
    pt.add_argument("--num-generations", type=positive_int, default=4, help="grpo: completions per prompt")
    pt.add_argument("--prompts-per-step", type=positive_int, default=4, help="grpo")
    pt.add_argument("--max-completion-length", type=positive_int, help="grpo (default: the world's description budget)")
    pt.add_argument("--tasks", nargs="+", default=["describe", "open"], help=f"grpo on a world: its prompts ({' '.join(GRPO_TASKS)})")
    pt.add_argument("--reward", nargs="+", default=["exact"], help=f"grpo on your data: rewards against each row's "
                    f"last assistant turn ({' | '.join(KINDS)}), or module:function (TRL's reward signature)")
    pt.add_argument("--seed", type=nonneg_int, default=0)
    training_args(pt)
    pt.set_defaults(func=run_train)


def print_gates(report: dict) -> None:
    for key, v in report.items():
        print(f"layer {key}: gate {v['gate_mean']:+.4f}, ||PVM|| / ||FFN|| {v['relative_norm']:.4f}")


def run_train(args) -> int:
    check_output_dir(args.out, "--out", kinds=(ADAPTER_KIND,), inputs=[args.model, args.data, args.init])
    own = user_data(args)
    samples = read_samples(args.data) if own is None else None
    if args.stage == "grpo":
        if not args.init:
            raise ValueError("--stage grpo needs --init: the stage-1 adapter directory it starts from")
        cfg = GRPOTrainConfig(steps=args.steps or 100, lr=args.lr or 2e-4, gate_lr=args.gate_lr or 2e-3,
                              beta=args.beta, num_generations=args.num_generations,
                              prompts_per_step=args.prompts_per_step, seed=args.seed,
                              max_completion_length=args.max_completion_length, max_length=args.max_length,
                              skip_bad_rows=args.skip_bad_rows)
        if own is None:
            data = world_grpo_data(samples, args.tasks, args.seed)
        else:
            data = GRPOData.from_samples(own, [load_reward(r) for r in args.reward],
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
    if args.init:
        raise ValueError("--init is for --stage grpo; stage 1 (sft) starts a new adapter")
    pvm_cfg = PVMConfig(layers=args.layers or "strided", latent_dim=args.latent_dim, heads=args.heads, gate=args.gate)
    train_cfg = PVMTrainConfig(steps=args.steps or 600, lr=args.lr or 1e-3, gate_lr=args.gate_lr or 1e-2,
                               batch_size=args.batch_size, seed=args.seed, max_length=args.max_length,
                               skip_bad_rows=args.skip_bad_rows)
    data = instruct_data(samples, args.seed) if own is None else own
    summary = train_pvm_sft(args.model, data, args.out, pvm_cfg, train_cfg,
                            stop_after=args.stop_after, grad_accum=args.grad_accum, overwrite=args.overwrite)
    if summary is None:
        return print_stopped(args.stop_after)
    print_gates(summary["after"])
    print(f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; adapter in {args.out}")
    return 0
