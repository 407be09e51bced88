"""``keepsight bridge train``: LIA-MTR (or a baseline bridge) in the paper's two phases, on a world or the user's
own data (phase 1: captions such as LLaVA-Pretrain; phase 2: instructions such as LLaVA-Instruct)."""

from __future__ import annotations

from ..atomic import check_output_dir
from ..bridge import BRIDGE_KINDS, LiaMtrConfig
from ..train.bridge import PHASE_DEFAULTS, BridgeRecipe, BridgeTrainConfig, train_bridge
from ..world.base import backbone_init, is_world_base
from ..world.tasks import caption_data, instruct_data
from .config_options import add_config_options, given_settings, option_names
from .options import data_args, print_stopped, read_samples, short_options, training_args, user_data

LIA_MTR_SKIP = {"d_vision", "d_model"}  # the projector's widths come from the model


def add_parser(sub) -> None:
    br = sub.add_parser("bridge", help="LIA-MTR and baseline bridges").add_subparsers(dest="bridge_command",
                                                                                      required=True)
    btr = br.add_parser("train", help="phase 1 (alignment, bridge only) or phase 2 (instruction tuning)")
    btr.add_argument("--model", required=True, help="phase 1: a LLaVA-family model directory, or a world base "
                     "directory (backbone from its lm/vision stages); phase 2: a phase-1 output")
    data_args(btr, "phase 1 trains on captions, phase 2 on instructions")
    btr.add_argument("--out", required=True)
    training_args(btr)
    phase2 = ", ".join(f"{k} {v}" for k, v in PHASE_DEFAULTS[2].items())
    add_config_options(btr, "train", BridgeTrainConfig, skip={"bridge_options"},
                       short=short_options("phase", "bridge", "lm_lr"), title="training (--phase ... and --train.FIELD)",
                       note=f"keepsight.train.bridge.BridgeTrainConfig; phase 2 defaults to {phase2}; bridge: "
                       f"{' | '.join(BRIDGE_KINDS)}")
    add_config_options(btr, "lia_mtr", LiaMtrConfig, skip=LIA_MTR_SKIP,
                       title="phase 1, --bridge lia_mtr: the projector (--lia_mtr.FIELD)",
                       note="keepsight.bridge.LiaMtrConfig (its widths come from the model)")
    btr.set_defaults(func=run_train)


def run_train(args) -> int:
    check_output_dir(args.out, "--out", kinds=(BridgeRecipe.kind,), inputs=[args.model, args.data])
    given = given_settings(args, "train", BridgeTrainConfig)
    phase, bridge = given.pop("phase"), given.get("bridge", BridgeTrainConfig.bridge)
    options = given_settings(args, "lia_mtr", LiaMtrConfig, skip=LIA_MTR_SKIP)
    if options and (phase != 1 or bridge != "lia_mtr"):
        raise ValueError(f"{option_names('lia_mtr', options)} set the LIA-MTR projector of phase 1 with --bridge "
                         f"lia_mtr (this run: phase {phase}, --bridge {bridge})")
    if options:  # checked now, before the model loads (the widths are placeholders here)
        LiaMtrConfig(d_vision=8, d_model=8, **options)
    if given.get("lm_lr") is not None and phase == 1:
        raise ValueError("--lm-lr is for --phase 2 (phase 1 trains the bridge only)")
    cfg = BridgeTrainConfig.for_phase(phase, bridge_options=options, **given)
    data = user_data(args, cfg.skip_bad_rows)
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
    print(f"phase {cfg.phase}: {summary['bridge']['kind']} bridge ({summary['bridge_parameters']:,d} parameters), "
          f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; model in {args.out}")
    return 0
