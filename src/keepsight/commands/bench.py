"""``keepsight bench NAME``: benchmarks (a printed table + JSON under ``--out``)."""

from __future__ import annotations

import shutil

from ..atomic import MARKER, check_output_dir, mark
from ..bench import baselines, bridge_memory, data, diffusion, needle, probe_overhead, pvm_decode, scan
from .options import bounded_int, positive_float

KIND = "bench"

NEW_TOKENS, ROWS, MEM_LIMIT_GIB = 128, 100_000, 16.0  # the defaults of --new-tokens, --rows, --mem-limit-gib



def _new_tokens(a, limit: int) -> int:
    """--new-tokens for a benchmark that measures at most ``limit`` (its tiny models' positions): the default is the
    limit; more is refused, not quietly cut."""
    if a.new_tokens is not None and a.new_tokens > limit:
        raise ValueError(f"--new-tokens {a.new_tokens}: bench {a.name} measures at most {limit} new tokens")
    return a.new_tokens or min(NEW_TOKENS, limit)


# name -> (the options it takes, run(args)); any other option given is refused
BENCHMARKS = {
    "probe-overhead": (("batch", "new_tokens", "repeats"), lambda a: probe_overhead.run(
        a.out, batch=a.batch or 8, new_tokens=a.new_tokens or NEW_TOKENS, repeats=a.repeats or 3)),
    "pvm-decode": (("batch", "new_tokens", "repeats"), lambda a: pvm_decode.run(
        a.out, batches=a.batch or (1, 4, 8), new_tokens=_new_tokens(a, 16), repeats=a.repeats or 5)),
    "bridge-memory": (("mem_limit_gib",), lambda a: bridge_memory.run(a.out, mem_limit_gib=a.mem_limit_gib or
                                                                       MEM_LIMIT_GIB)),
    "needle": ((), lambda a: needle.run(a.out)),
    "needle-model": ((), lambda a: needle.run_model(a.out)),
    "scan": ((), lambda a: scan.run(a.out)),
    "diffusion": (("repeats",), lambda a: diffusion.run(a.out, pairs=a.repeats or 20)),
    "data": (("rows", "batch"), lambda a: data.run(a.out, rows=a.rows or ROWS, batch=a.batch or 16)),
    "baselines": (("batch", "new_tokens", "repeats"), lambda a: baselines.run(
        a.out, batch=a.batch or 4, new_tokens=_new_tokens(a, 64), pairs=a.repeats or 9)),
}
OPTIONS = ("batch", "new_tokens", "repeats", "rows", "mem_limit_gib")


def add_parser(sub) -> None:
    bn = sub.add_parser("bench", help="benchmarks (printed table + JSON)")
    bn.add_argument("name", choices=list(BENCHMARKS))
    bn.add_argument("--out", default="runs/bench")
    bn.add_argument("--batch", type=bounded_int(1, 1024), help="probe-overhead: default 8; pvm-decode: default 1, 4 "
                    "and 8; data: 16")
    bn.add_argument("--new-tokens", type=bounded_int(1, 4096), help=f"probe-overhead, pvm-decode (at most 16), "
                    f"baselines (at most 64): default {NEW_TOKENS}")
    bn.add_argument("--repeats", type=bounded_int(1, 1000),
                    help="default: 3 (probe-overhead), 5 interleaved runs (pvm-decode), 20 (diffusion)")
    bn.add_argument("--rows", type=bounded_int(1, 10_000_000), help=f"data: rows of the synthetic LLaVA JSON "
                    f"(default {ROWS:,d})")
    bn.add_argument("--mem-limit-gib", type=positive_float, help="bridge-memory: skip configurations predicted to "
                    f"need more (default {MEM_LIMIT_GIB})")
    bn.set_defaults(func=run)


def run(args) -> int:
    takes, bench = BENCHMARKS[args.name]
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
        bench(args)
    except Exception:
        if not existed and {p.name for p in out.iterdir()} <= {MARKER}:
            shutil.rmtree(out)  # a benchmark that failed its checks leaves no --out behind
        raise
    return 0
