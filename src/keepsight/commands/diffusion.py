"""``keepsight diffusion train``: a LLaDA-V-style VLM trained with the masked-diffusion objective: a tiny one from a
world base, or a LLaDA-V checkpoint fine-tuned, on a world or the user's own data."""

from __future__ import annotations

from ..atomic import check_output_dir
from ..models import load_checkpoint
from ..train.diffusion import DiffusionRecipe, DiffusionTrainConfig, train_diffusion
from ..world.base import llada_v_init
from ..world.tasks import VLMDataset
from .config_options import add_config_options, given_settings
from .options import data_args, print_stopped, read_samples, short_options, training_args, user_data


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
    training_args(dtr)
    add_config_options(dtr, "train", DiffusionTrainConfig, short=short_options("answer_length"),
                       title="training (--steps ... and --train.FIELD)",
                       note="keepsight.train.diffusion.DiffusionTrainConfig")
    dtr.set_defaults(func=run_train)


def run_train(args) -> int:
    source = args.base or args.model
    if args.language_model_from and not args.base:
        raise ValueError("--language-model-from starts a new VLM from --base; --model fine-tunes a diffusion model "
                         "as it is")
    check_output_dir(args.out, "--out", kinds=(DiffusionRecipe.kind,),
                     inputs=[source, args.data, *([args.language_model_from] if args.language_model_from else [])])
    cfg = DiffusionTrainConfig(**given_settings(args, "train", DiffusionTrainConfig))
    data = user_data(args, cfg.skip_bad_rows)
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
