"""``keepsight diffusion train``: a LLaDA-V-style VLM trained with the masked-diffusion objective: a tiny one from a
world base, or a LLaDA-V checkpoint fine-tuned, on a world or the user's own data."""

from __future__ import annotations

from ..atomic import check_output_dir
from ..models import load_checkpoint
from ..train.diffusion import DiffusionRecipe, DiffusionTrainConfig, train_diffusion
from ..world.base import llada_v_init
from ..world.tasks import VLMDataset
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

# config fields with their own short option
TRAIN_SHORT = {"steps", "lr", "batch_size", "answer_length", "seed", "max_length", "skip_bad_rows"}


def add_parser(sub) -> None:
    df = sub.add_parser("diffusion", help="masked-diffusion VLMs").add_subparsers(dest="diffusion_command",
                                                                                  required=True)
    dtr = df.add_parser("train", help="train a LLaDA-V-style VLM with the masked-diffusion objective")
    start = dtr.add_mutually_exclusive_group(required=True)
    start.add_argument("--base", help="a world base directory: a new tiny VLM (its vision stage gives the tower)")
    start.add_argument("--model", help="a LLaDA-V checkpoint directory to fine-tune")
    dtr.add_argument("--language-model-from", metavar="DIR", help="with --base: an autoregressive world model (the "
                     "base, or one fine-tuned from it) whose language model and projector the new VLM starts from "
                     "(as Dream 7B starts from Qwen2.5); default: fresh ones")
    data_args(dtr)
    dtr.add_argument("--out", required=True)
    dtr.add_argument("--steps", type=positive_int, help=f"default: {DiffusionTrainConfig.steps}")
    dtr.add_argument("--lr", type=positive_float, help=f"default: {DiffusionTrainConfig.lr}")
    dtr.add_argument("--batch-size", type=positive_int, help=f"default: {DiffusionTrainConfig.batch_size}")
    dtr.add_argument("--answer-length", type=positive_int, help="generation window (answers cut / eos-filled; "
                     f"default: {DiffusionTrainConfig.answer_length})")
    dtr.add_argument("--seed", type=nonneg_int, default=DiffusionTrainConfig.seed,
                    help="model initialisation, data order and the objective's randomness (default: %(default)s)")
    training_args(dtr)
    add_config_options(dtr, "train", DiffusionTrainConfig, skip=TRAIN_SHORT, title="training (--train.FIELD)",
                       note="every field of keepsight.train.diffusion.DiffusionTrainConfig not set above")
    dtr.set_defaults(func=run_train)


def run_train(args) -> int:
    source = args.base or args.model
    if args.language_model_from and not args.base:
        raise ValueError("--language-model-from starts a new VLM from --base; --model fine-tunes a diffusion model "
                         "as it is")
    check_output_dir(args.out, "--out", kinds=(DiffusionRecipe.kind,),
                     inputs=[source, args.data, *([args.language_model_from] if args.language_model_from else [])])
    short = {k: v for k, v in dict(steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                                   answer_length=args.answer_length).items() if v is not None}
    cfg = DiffusionTrainConfig(**short, **given_settings(args, "train", DiffusionTrainConfig), seed=args.seed,
                               skip_bad_rows=args.skip_bad_rows, max_length=args.max_length)
    data = user_data(args)
    if data is None:
        data = VLMDataset(read_samples(args.data), ("describe",), cfg.seed)
    if args.base:
        init = lambda: llada_v_init(args.base, cfg.seed, language_model_from=args.language_model_from)  # noqa: E731
    else:
        init = lambda: load_checkpoint(args.model, dtype=None, device="cpu", expect="diffusion")  # noqa: E731
    summary = train_diffusion(init, data, args.out, cfg, stop_after=args.stop_after, grad_accum=args.grad_accum,
                              source=str(source), overwrite=args.overwrite,
                              language_model_from=args.language_model_from or "")
    if summary is None:
        return print_stopped(args.stop_after)
    print(f"masked-diffusion loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; model in {args.out}")
    return 0
