"""``keepsight bridge train``: LIA-MTR (or a baseline bridge) in the paper's two phases, on a world or the user's
own data (phase 1: captions such as LLaVA-Pretrain; phase 2: instructions such as LLaVA-Instruct)."""

from __future__ import annotations

from ..atomic import check_output_dir
from ..bridge import BRIDGE_KINDS, LiaMtrConfig
from ..train.bridge import PHASE_DEFAULTS, BridgeRecipe, BridgeTrainConfig, train_bridge
from ..world.base import backbone_init, is_world_base
from ..world.tasks import caption_data, instruct_data
from .config_options import add_config_options, given_settings, option_names
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

# config fields with their own short option (bridge_options: the --lia_mtr.* options)
TRAIN_SHORT = {"phase", "steps", "lr", "batch_size", "bridge", "bridge_options", "lm_lr", "seed", "max_length",
               "skip_bad_rows"}


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
    btr.add_argument("--steps", type=positive_int, help=f"default: {BridgeTrainConfig.steps} (phase 1), "
                     f"{PHASE_DEFAULTS[2]['steps']} (phase 2)")
    btr.add_argument("--lr", type=positive_float, help=f"default: {BridgeTrainConfig.lr}")
    btr.add_argument("--lm-lr", type=positive_float, help="phase 2: the language model's lr (default: --lr)")
    btr.add_argument("--batch-size", type=positive_int, help=f"default: {BridgeTrainConfig.batch_size}")
    btr.add_argument("--seed", type=nonneg_int, help=f"default: {BridgeTrainConfig.seed} (the world base's "
                     "align-stage seed)")
    training_args(btr)
    add_config_options(btr, "train", BridgeTrainConfig, skip=TRAIN_SHORT, title="training (--train.FIELD)",
                       note="every field of keepsight.train.bridge.BridgeTrainConfig not set above")
    add_config_options(btr, "lia_mtr", LiaMtrConfig, skip={"d_vision", "d_model"},
                       title="phase 1, --bridge lia_mtr: the projector (--lia_mtr.FIELD)",
                       note="every field of keepsight.bridge.LiaMtrConfig (its widths come from the model)")
    btr.set_defaults(func=run_train)


def run_train(args) -> int:
    check_output_dir(args.out, "--out", kinds=(BridgeRecipe.kind,), inputs=[args.model, args.data])
    options = given_settings(args, "lia_mtr", LiaMtrConfig, skip={"d_vision", "d_model"})
    if options and (args.phase != 1 or args.bridge != "lia_mtr"):
        raise ValueError(f"{option_names('lia_mtr', options)} set the LIA-MTR projector of phase 1 with --bridge "
                         f"lia_mtr (this run: phase {args.phase}, --bridge {args.bridge})")
    if options:  # checked now, before the model loads (the widths are placeholders here)
        LiaMtrConfig(d_vision=8, d_model=8, **options)
    short = {k: v for k, v in dict(steps=args.steps, lr=args.lr, batch_size=args.batch_size, seed=args.seed,
                                   lm_lr=args.lm_lr).items() if v is not None}
    cfg = BridgeTrainConfig.for_phase(args.phase, bridge=args.bridge, bridge_options=options, **short,
                                      **given_settings(args, "train", BridgeTrainConfig),
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
