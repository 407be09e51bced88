"""``keepsight diffusion train``: a tiny LLaDA-V-style VLM trained on the world (masked-diffusion objective)."""

from __future__ import annotations

from ..atomic import check_output_dir
from ..train.diffusion import DiffusionRecipe, DiffusionTrainConfig, train_diffusion
from ..world.base import llada_v_init
from ..world.tasks import VLMDataset
from .options import nonneg_int, positive_float, positive_int, print_stopped, read_samples, training_args


def add_parser(sub) -> None:
    df = sub.add_parser("diffusion", help="masked-diffusion VLMs").add_subparsers(dest="diffusion_command",
                                                                                  required=True)
    dtr = df.add_parser("train", help="train a tiny LLaDA-V-style VLM on the world (masked-diffusion objective)")
    dtr.add_argument("--base", required=True, help="a world base directory (its vision stage gives the tower)")
    dtr.add_argument("--data", required=True, help="a world directory")
    dtr.add_argument("--out", required=True)
    dtr.add_argument("--steps", type=positive_int, default=2500)
    dtr.add_argument("--lr", type=positive_float, default=2e-3)
    dtr.add_argument("--batch-size", type=positive_int, default=16)
    dtr.add_argument("--answer-length", type=positive_int, default=64, help="generation window (answers cut / eos-filled)")
    dtr.add_argument("--seed", type=nonneg_int, default=0)
    training_args(dtr)
    dtr.set_defaults(func=run_train)


def run_train(args) -> int:
    check_output_dir(args.out, "--out", kinds=(DiffusionRecipe.kind,), inputs=[args.base, args.data])
    cfg = DiffusionTrainConfig(steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                               answer_length=args.answer_length, seed=args.seed)
    data = VLMDataset(read_samples(args.data), ("describe",), cfg.seed)
    summary = train_diffusion(lambda: llada_v_init(args.base, cfg.seed), data, args.out, cfg,
                              stop_after=args.stop_after, grad_accum=args.grad_accum, source=str(args.base),
                              overwrite=args.overwrite)
    if summary is None:
        return print_stopped(args.stop_after)
    print(f"masked-diffusion loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; model in {args.out}")
    return 0
