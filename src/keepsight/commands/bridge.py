"""``keepsight bridge train``: LIA-MTR (or a baseline bridge) in the paper's two phases, on a world or the user's
own data (phase 1: captions such as LLaVA-Pretrain; phase 2: instructions such as LLaVA-Instruct)."""

from __future__ import annotations

from ..atomic import check_output_dir
from ..bridge import BRIDGE_KINDS
from ..train.bridge import BridgeRecipe, BridgeTrainConfig, train_bridge
from ..world.base import backbone_init, is_world_base
from ..world.tasks import caption_data, instruct_data
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


def add_parser(sub) -> None:
    br = sub.add_parser("bridge", help="LIA-MTR and baseline bridges").add_subparsers(dest="bridge_command",
                                                                                      required=True)
    btr = br.add_parser("train", help="phase 1 (alignment, bridge only) or phase 2 (instruction tuning)")
    btr.add_argument("--phase", type=int, required=True, choices=[1, 2])
    btr.add_argument("--model", required=True, help="phase 1: a LLaVA-family model directory, or a world base "
                     "directory (backbone from its lm/vision stages); phase 2: a phase-1 output")
    data_args(btr, "phase 1 trains on captions, phase 2 on instructions")
    btr.add_argument("--out", required=True)
    btr.add_argument("--bridge", default="lia_mtr", help=f"phase 1: {' | '.join(BRIDGE_KINDS)}")
    btr.add_argument("--steps", type=positive_int, help="default: 200 (phase 1), 4000 (phase 2)")
    btr.add_argument("--lr", type=positive_float, help="default: 2e-3")
    btr.add_argument("--lm-lr", type=positive_float, help="phase 2: the language model's lr (default: --lr)")
    btr.add_argument("--batch-size", type=positive_int, default=16)
    btr.add_argument("--seed", type=nonneg_int, default=2)
    training_args(btr)
    btr.set_defaults(func=run_train)


def run_train(args) -> int:
    check_output_dir(args.out, "--out", kinds=(BridgeRecipe.kind,), inputs=[args.model, args.data])
    steps, lr = {1: (200, 2e-3), 2: (4000, 2e-3)}[args.phase]
    cfg = BridgeTrainConfig(phase=args.phase, bridge=args.bridge, seed=args.seed, steps=args.steps or steps,
                            lr=args.lr or lr, batch_size=args.batch_size, lm_lr=args.lm_lr,
                            max_length=args.max_length, skip_bad_rows=args.skip_bad_rows)
    if args.lm_lr is not None and cfg.phase == 1:
        raise ValueError("--lm-lr is for --phase 2 (phase 1 trains the bridge only)")
    data = user_data(args)
    if data is None:
        samples = read_samples(args.data)
        data = caption_data(samples, cfg.seed) if cfg.phase == 1 else instruct_data(samples, cfg.seed)
    init = None
    if cfg.phase == 1 and is_world_base(args.model):  # the backbone the base's own MLP was aligned on
        init = lambda: backbone_init(args.model, cfg.seed)  # noqa: E731
    summary = train_bridge(args.model, data, args.out, cfg, stop_after=args.stop_after, grad_accum=args.grad_accum,
                           init=init, overwrite=args.overwrite)
    if summary is None:
        return print_stopped(args.stop_after)
    print(f"phase {args.phase}: {summary['bridge']['kind']} bridge ({summary['bridge_parameters']:,d} parameters), "
          f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; model in {args.out}")
    return 0
