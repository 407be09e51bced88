"""``keepsight bench NAME``: benchmarks (a printed table + JSON under ``--out``)."""

from __future__ import annotations

from ..atomic import check_output_dir, mark
from ..bench import baselines, bridge_memory, data, diffusion, needle, probe_overhead, pvm_decode, scan
from .options import bounded_int, positive_float

KIND = "bench"

# name -> run(args): each benchmark takes the options it uses
BENCHMARKS = {
    "probe-overhead": lambda a: probe_overhead.run(a.out, batch=a.batch or 8, new_tokens=a.new_tokens,
                                                   repeats=a.repeats or 3),
    "pvm-decode": lambda a: pvm_decode.run(a.out, batches=a.batch or (1, 4, 8), new_tokens=min(a.new_tokens, 16),
                                           repeats=a.repeats or 5),
    "bridge-memory": lambda a: bridge_memory.run(a.out, mem_limit_gib=a.mem_limit_gib),
    "needle": lambda a: needle.run(a.out),
    "needle-model": lambda a: needle.run_model(a.out),
    "scan": lambda a: scan.run(a.out),
    "diffusion": lambda a: diffusion.run(a.out, pairs=a.repeats or 20),
    "data": lambda a: data.run(a.out, rows=a.rows, batch=a.batch or 16),
    "baselines": lambda a: baselines.run(a.out, batch=a.batch or 4, new_tokens=min(a.new_tokens, 64),
                                         pairs=a.repeats or 9),
}


def add_parser(sub) -> None:
    bn = sub.add_parser("bench", help="benchmarks (printed table + JSON)")
    bn.add_argument("name", choices=list(BENCHMARKS))
    bn.add_argument("--out", default="runs/bench")
    bn.add_argument("--batch", type=bounded_int(1, 1024), help="probe-overhead: default 8; pvm-decode: default 1, 4 "
                    "and 8; data: 16")
    bn.add_argument("--new-tokens", type=bounded_int(1, 4096), default=128)
    bn.add_argument("--repeats", type=bounded_int(1, 1000),
                    help="default: 3 (probe-overhead), 5 interleaved runs (pvm-decode), 20 (diffusion)")
    bn.add_argument("--rows", type=bounded_int(1, 10_000_000), default=100_000, help="data: rows of the synthetic "
                    "LLaVA JSON")
    bn.add_argument("--mem-limit-gib", type=positive_float, default=16.0, help="bridge-memory: skip configurations "
                    "predicted to need more")
    bn.set_defaults(func=run)


def run(args) -> int:
    out = check_output_dir(args.out, "--out", kinds=(KIND,))
    out.mkdir(parents=True, exist_ok=True)
    mark(out, KIND)
    BENCHMARKS[args.name](args)
    return 0
