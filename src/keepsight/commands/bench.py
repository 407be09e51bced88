"""``keepsight bench NAME``: benchmarks (a printed table + JSON under ``--out``)."""

from __future__ import annotations

import inspect
import shutil

from ..atomic import MARKER, check_output_dir, mark
from ..bench import (
    baselines,
    bridge_memory,
    data,
    diffusion,
    needle,
    probe_overhead,
    pvm_decode,
    scan,
    threads,
)
from .options import bounded_int, positive_float

KIND = "bench"

# name -> (its function, {CLI option: the function's parameter}); every default is the function's own, and an option
# a benchmark does not take is refused
BENCHMARKS = {
    "probe-overhead": (probe_overhead.run, {"batch": "batch", "new_tokens": "new_tokens", "repeats": "repeats"}),
    "pvm-decode": (pvm_decode.run, {"batch": "batches", "new_tokens": "new_tokens", "repeats": "repeats",
                                    "shape": "shape"}),
    "bridge-memory": (bridge_memory.run, {"mem_limit_gib": "mem_limit_gib"}),
    "needle": (needle.run, {}),
    "needle-model": (needle.run_model, {}),
    "scan": (scan.run, {}),
    "diffusion": (diffusion.run, {"repeats": "pairs"}),
    "mps-mrs": (diffusion.run_overhead, {"repeats": "pairs", "batch": "batch"}),
    "data": (data.run, {"rows": "rows", "batch": "batch"}),
    "baselines": (baselines.run, {"batch": "batch", "new_tokens": "new_tokens", "repeats": "pairs"}),
    "threads": (threads.run, {"repeats": "repeats"}),
}
OPTIONS = ("batch", "new_tokens", "repeats", "rows", "mem_limit_gib", "shape")


def defaults(option: str) -> str:
    """The help text's defaults of ``option``: each benchmark that takes it, with its function's default."""
    parts = []
    for name, (fn, takes) in BENCHMARKS.items():
        if option in takes:
            default = inspect.signature(fn).parameters[takes[option]].default
            shown = (", ".join(map(str, default)) if isinstance(default, tuple) else default
                     if isinstance(default, str) else f"{default:,}")
            parts.append(f"{name} {shown}")
    return "default: " + "; ".join(parts)


def add_parser(sub) -> None:
    bn = sub.add_parser("bench", help="benchmarks (printed table + JSON)")
    bn.add_argument("name", choices=list(BENCHMARKS))
    bn.add_argument("--out", default="runs/bench")
    bn.add_argument("--batch", type=bounded_int(1, 1024), help=defaults("batch"))
    bn.add_argument("--new-tokens", type=bounded_int(1, 4096), help=f"{defaults('new_tokens')} (pvm-decode measures "
                    f"at most {pvm_decode.MAX_NEW_TOKENS}, baselines at most {baselines.MAX_NEW_TOKENS})")
    bn.add_argument("--repeats", type=bounded_int(1, 1000), help=f"interleaved runs or pairs; {defaults('repeats')}")
    bn.add_argument("--rows", type=bounded_int(1, 10_000_000), help=f"data: rows of the synthetic LLaVA JSON; "
                    f"{defaults('rows')}")
    bn.add_argument("--shape", choices=sorted(pvm_decode.SHAPES), help="pvm-decode: the model timed (mid: width "
                    "512, 12 layers, 256 visual tokens; qwen3-vl-8b: its width and vocabulary, 4 of its layers, "
                    f"1,024 visual tokens, about an hour on 2 cores); {defaults('shape')}")
    bn.add_argument("--mem-limit-gib", type=positive_float, help="bridge-memory: skip configurations predicted to "
                    f"need more; {defaults('mem_limit_gib')}")
    bn.set_defaults(func=run)


def run(args) -> int:
    fn, takes = BENCHMARKS[args.name]
    extra = [o for o in OPTIONS if getattr(args, o) is not None and o not in takes]
    if extra:
        names = ", ".join("--" + o.replace("_", "-") for o in extra)
        accepted = ", ".join("--" + o.replace("_", "-") for o in takes) or "none of them"
        raise ValueError(f"{names} do not apply to bench {args.name} (it takes {accepted})")
    out = check_output_dir(args.out, "--out", kinds=(KIND,))
    existed = out.exists()
    out.mkdir(parents=True, exist_ok=True)
    mark(out, KIND)
    try:
        fn(args.out, **{param: getattr(args, option) for option, param in takes.items()
                        if getattr(args, option) is not None})
    except Exception:
        if not existed and {p.name for p in out.iterdir()} <= {MARKER}:
            shutil.rmtree(out)  # a benchmark that failed its checks leaves no --out behind
        raise
    return 0
