"""Options shared by several command groups, and how a command reads the data it is given."""

from __future__ import annotations

from ..models import DTYPE_CHOICES
from ..train.distributed import PRECISIONS
from ..world.config import world_config
from ..world.dataset import read_world
from ..world.tasks import WorldSamples


def world_args(sp) -> None:
    """``--difficulty`` and the overrides of a world preset."""
    sp.add_argument("--difficulty", default="default", help="world preset: easy | default | hard")
    sp.add_argument("--image-size", type=int, help="override the preset's image size (pixels)")
    sp.add_argument("--grid", type=int, nargs=2, metavar=("ROWS", "COLS"), help="override the grid")
    sp.add_argument("--max-objects", type=int, help="override the most objects per scene")


def world_from_args(args):
    """The ``WorldConfig`` the ``world_args`` options name."""
    overrides = {}
    if getattr(args, "image_size", None):
        overrides["image_size"] = args.image_size
    if getattr(args, "grid", None):
        overrides["grid"] = tuple(args.grid)
    if getattr(args, "max_objects", None):
        overrides["max_objects"] = args.max_objects
    return world_config(args.difficulty, **overrides)


def placement_args(sp) -> None:
    """``--dtype`` / ``--device`` of commands that load ``--model`` for inference."""
    sp.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                    help="weights dtype (auto: bf16 on a CUDA GPU that has it, else fp16 there, fp32 on CPU)")
    sp.add_argument("--device", default="auto", help="auto (cuda when present) | cpu | cuda | cuda:N | mps")


def training_args(sp) -> None:
    """Options of every training command: ``--batch-size`` is the global batch of one optimizer step."""
    sp.add_argument("--grad-accum", type=int, default=1, help="gradient-accumulation steps: the batch size "
                    "(global, per optimizer step) is split over them and the `accelerate launch` processes")
    sp.add_argument("--precision", default="no", choices=list(PRECISIONS),
                    help="mixed precision (autocast over fp32 master weights); bf16 on GPUs that have it")
    sp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="auto: each process's GPU when there is one (accelerate assigns them), else the CPU")
    sp.add_argument("--stop-after", type=int, help="stop after this many steps (resume later)")


def read_samples(path, limit: int | None = None) -> WorldSamples:
    """The scenes (and images) of a world directory, the first ``limit`` when given."""
    cfg, records = read_world(path)
    return WorldSamples.from_records(cfg, records[:limit] if limit else records)


def print_stopped(step) -> int:
    print(f"stopped at step {step}; run the same command to resume")
    return 0
