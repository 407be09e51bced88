"""``keepsight bench scan``: the chunked multi-timescale retention scan against the for-loop reference
(forward only, fp32, one sequence), and the chunk size's effect. Target: >= 50x at N = 16,384."""

from __future__ import annotations

from pathlib import Path

import torch

from ..ops import multiscale_retention
from ..ops.naive import naive_multiscale_retention
from . import best_time, write_result


@torch.inference_mode()
def run(out: str | Path = "runs/bench", n: int = 16384, widths=(64, 1024), scales: int = 4,
        chunks=(32, 64, 128, 256), repeats: int = 3) -> dict:
    lambdas = torch.logspace(torch.log10(torch.tensor(0.70)), torch.log10(torch.tensor(0.995)), scales)
    rows = []
    for d in widths:
        g = torch.Generator().manual_seed(0)
        u = torch.randn(1, n, d, generator=g)
        alpha = torch.softmax(torch.randn(1, n, scales, generator=g), -1)
        loop_s = best_time(lambda u=u, alpha=alpha: naive_multiscale_retention(u, alpha, lambdas), 1)
        ref, _ = naive_multiscale_retention(u, alpha, lambdas)
        for c in chunks:
            fast_s = best_time(lambda u=u, alpha=alpha, c=c: multiscale_retention(u, alpha, lambdas, chunk_size=c), repeats)
            err = float((multiscale_retention(u, alpha, lambdas, chunk_size=c) - ref).abs().max())
            rows.append({"n": n, "d": d, "scales": scales, "chunk": c, "loop_s": loop_s, "chunked_s": fast_s,
                         "speedup": loop_s / fast_s, "max_abs_err": err})
    print(f"{'N':>7s} {'d':>5s} {'chunk':>5s} {'for-loop s':>10s} {'chunked s':>10s} {'speed-up':>9s} {'max err':>9s}")
    for r in rows:
        print(f"{r['n']:>7,d} {r['d']:>5d} {r['chunk']:>5d} {r['loop_s']:10.3f} {r['chunked_s']:10.4f} "
              f"{r['speedup']:9.1f} {r['max_abs_err']:9.1e}")
    result = {"benchmark": "scan", "threads": torch.get_num_threads(), "target_speedup": 50, "rows": rows}
    write_result(out, "scan", result)
    return result
