"""Options shared by several command groups, the argparse types that check every number an option takes
(a bad value is argparse's error: exit code 2, naming the option and the accepted range), and how a command
reads the data it is given."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from ..checks import number, requirement
from ..data import open_dataset, preflight
from ..inference.arguments import json_object
from ..models import DTYPE_CHOICES
from ..train.distributed import PRECISIONS
from ..world.config import world_config
from ..world.dataset import is_world, read_world
from ..world.tasks import WorldSamples


def _parsed(convert, low, high=None, *, open_low: bool = False):
    """An argparse type: ``convert`` (int or float) the text, then check it with ``checks.number``."""
    integer = convert is int
    what = requirement(low, high, integer=integer, open_low=open_low)

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        try:
            return number("value", value, low, high, integer=integer, open_low=open_low)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}") from None

    parse.accepts = (convert.__name__, low, high if integer else open_low)  # read by the tests that try values outside the range
    return parse


def bounded_int(low: int, high: int):
    """An integer in [low, high] (options whose huge values are mistakes, e.g. a benchmark's repeats)."""
    return _parsed(int, low, high)


positive_int = _parsed(int, 1)
nonneg_int = _parsed(int, 0)
positive_float = _parsed(float, 0.0, open_low=True)
nonneg_float = _parsed(float, 0.0)


def threads(text: str) -> int | str:
    """``--threads``: an intra-op thread count in [1, 1024], or ``auto`` (the cores free when the command starts)."""
    if text == "auto":
        return text
    try:
        return bounded_int(1, 1024)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected an integer in [1, 1024] or auto, got {text!r}") from None


def run_name(text: str) -> str:
    """A run's name: one path component (letters, digits, ``. _ -``), so that it stays inside ``--runs``."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", text or "") or text in (".", ".."):
        raise argparse.ArgumentTypeError(f"expected a plain name (letters, digits, . _ -), got {text!r}")
    return text


def output_file_args(sp, help: str, *, required: bool = False) -> None:
    """``--out`` of a command that writes one file (predictions, scores, a result JSON) and its ``--overwrite``."""
    sp.add_argument("--out", type=Path, required=required, help=help)
    sp.add_argument("--overwrite", action="store_true",
                    help="replace --out even if it is not an unchanged output of keepsight's")


def world_args(sp) -> None:
    """``--difficulty`` and the overrides of a world preset."""
    sp.add_argument("--difficulty", default="default", help="world preset: easy | default | hard")
    sp.add_argument("--image-size", type=positive_int, help="override the preset's image size (pixels)")
    sp.add_argument("--grid", type=positive_int, nargs=2, metavar=("ROWS", "COLS"), help="override the grid")
    sp.add_argument("--max-objects", type=positive_int, help="override the most objects per scene")


def world_from_args(args):
    """The ``WorldConfig`` the ``world_args`` options name."""
    overrides = {}
    if getattr(args, "image_size", None) is not None:
        overrides["image_size"] = args.image_size
    if getattr(args, "grid", None) is not None:
        overrides["grid"] = tuple(args.grid)
    if getattr(args, "max_objects", None) is not None:
        overrides["max_objects"] = args.max_objects
    return world_config(args.difficulty, **overrides)


def placement_args(sp) -> None:
    """``--dtype`` / ``--device`` of commands that load ``--model`` for inference."""
    sp.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                    help="weights dtype (auto: bf16 on a CUDA GPU that has it, else fp16 there, fp32 on CPU)")
    sp.add_argument("--device", default="auto", help="auto (cuda when present) | cpu | cuda | cuda:N | mps")


# the range each training setting's short option checks when the command line is parsed (None: the field's own
# converter); the defaults and help are the training configs' (keepsight.train.*Config)
SHORT_TYPES = {"steps": positive_int, "lr": positive_float, "gate_lr": positive_float, "lm_lr": positive_float,
               "batch_size": positive_int, "seed": nonneg_int, "answer_length": positive_int, "max_length": positive_int,
               "beta": nonneg_float, "num_generations": positive_int, "prompts_per_step": positive_int,
               "max_completion_length": positive_int, "phase": bounded_int(1, 2), "pvm_hidden_size": positive_int,
               "layers": None, "skip_bad_rows": None, "trainable": None, "bridge": None,
               # decoding (keepsight.inference.settings.DecodeSettings)
               "max_new_tokens": positive_int, "system_prompt": None, "gen_length": positive_int,
               "block_length": positive_int, "cfg_scale": nonneg_float, "remasking": None}


def short_options(*names: str, training: bool = True) -> dict:
    """``{field: its argparse type}`` for a command's short options (``add_config_options(short=...)``): ``names``,
    after ``--steps --lr --batch-size --seed --max-length --skip-bad-rows`` for a training config."""
    every = ("steps", "lr", "batch_size", "seed", "max_length", "skip_bad_rows") if training else ()
    return {n: SHORT_TYPES[n] for n in (*every, *names)}


def training_args(sp) -> None:
    """Options of every training command: ``--batch-size`` is the global batch of one optimizer step."""
    sp.add_argument("--grad-accum", type=positive_int, default=1, help="gradient-accumulation steps: the batch size "
                    "(global, per optimizer step) is split over them and the `accelerate launch` processes")
    sp.add_argument("--precision", default="no", choices=list(PRECISIONS),
                    help="mixed precision (autocast over fp32 master weights); bf16 on GPUs that have it")
    sp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="auto: each process's GPU when there is one (accelerate assigns them), else the CPU")
    sp.add_argument("--stop-after", type=positive_int, help="stop after this many steps (resume later)")
    sp.add_argument("--overwrite", action="store_true", help="replace an existing output made from other settings "
                    "(without it such an output is refused; the same settings reuse or resume it)")


DATA_HELP = ("a world directory (keepsight world build), a LLaVA-format JSON / JSONL file, or a Hugging Face dataset "
             "(a save_to_disk directory, parquet or JSONL files with messages or question/answer columns)")


def data_args(sp, what: str = "") -> None:
    """``--data`` of any source and ``--image-folder`` (a training config's ``--skip-bad-rows`` and ``--max-length``
    go with them)."""
    sp.add_argument("--data", required=True, help=DATA_HELP + (f"; {what}" if what else ""))
    sp.add_argument("--image-folder", help="where relative image paths of --data resolve (default: its directory)")


def user_data(args, skip_bad_rows: bool, need_answers: bool = True):
    """``--data`` as a dataset of ``Sample``s after the pre-flight check (which prints what it found; rows it finds
    bad are left out with ``skip_bad_rows``, else an error), or None when ``--data`` is a world directory (the
    command then builds the world's own task mix)."""
    if is_world(args.data):
        if getattr(args, "image_folder", None):
            raise ValueError(f"--image-folder applies to a user's data; --data {args.data} is a keepsight world (its "
                             "images sit in it)")
        return None
    ds, report = preflight(open_dataset(args.data, args.image_folder), skip_bad_rows, need_answers)
    print(f"pre-flight of {args.data}: {report.line()}", flush=True)
    return ds


def json_settings(option: str, text: str | None) -> dict:
    """A JSON object of settings given to ``option`` ({} when not given); anything else is an error naming it."""
    return {} if text is None else json_object(option, text)


def read_samples(path, limit: int | None = None) -> WorldSamples:
    """The scenes (and images) of a world directory, the first ``limit`` when given."""
    cfg, records = read_world(path)
    return WorldSamples.from_records(cfg, records[:limit] if limit else records)


def print_stopped(step) -> int:
    print(f"stopped at step {step}; run the same command to resume")
    return 0
