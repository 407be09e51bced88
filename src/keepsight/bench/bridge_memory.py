"""``keepsight bench bridge-memory``: forward time and peak memory of each bridge against the number of
patches N (1,024 .. 262,144) at width 1,024, each configuration in a fresh subprocess.

Peak memory is the child's peak resident set (``ru_maxrss``) minus its resident set just before the input
is allocated (torch, the bridge's weights and the interpreter are excluded), so it counts the input, the
output and every activation. A configuration predicted to exceed the memory or time limit is skipped and
recorded as skipped, with the prediction.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..bridge import build_bridge
from . import write_result

KINDS = ("lia_mtr", "mlp", "attention", "attention_sdpa")
SIZES = tuple(1024 * 2**i for i in range(9))  # 1,024 .. 262,144
GIB = 1024**3


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _child(kind: str, n: int, width: int, repeats: int) -> dict:
    torch.manual_seed(0)
    bridge = build_bridge(kind, d_vision=width, d_model=width).eval()
    with torch.inference_mode():  # warm-up on a short input (allocator, kernels)
        bridge(torch.randn(1, 256, width))
    base = _rss_bytes()
    x = torch.randn(1, n, width)
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            t0 = time.perf_counter()
            y = bridge(x)
            times.append(time.perf_counter() - t0)
            del y
    return {"time_s": min(times), "peak_bytes": _rss_bytes() - base, "input_bytes": x.numel() * 4}


def _predict_bytes(kind: str, n: int, width: int, heads: int = 8) -> float:
    io = 2 * n * width * 4  # input + output, fp32
    if kind == "attention":
        return io + 3 * heads * n * n * 4 + 4 * n * width * 4  # scores, softmax, a copy; q, k, v, context
    return io + 6 * n * width * 4  # a few [N, width] activations


def run(out: str | Path = "runs/bench", width: int = 1024, sizes=SIZES, kinds=KINDS, mem_limit_gib: float = 16.0,
        time_limit_s: float = 120.0, timeout_s: float = 900.0) -> dict:
    rows = []
    for kind in kinds:
        last_time = None
        for n in sizes:
            row = {"kind": kind, "n": n, "width": width}
            pred_mem = _predict_bytes(kind, n, width)
            # time grows ~2x per doubling (linear kinds) or ~4x (attention); extrapolate from the last run
            growth = 4.0 if kind.startswith("attention") else 2.0
            pred_time = last_time * growth if last_time is not None else 0.0
            if pred_mem > mem_limit_gib * GIB or pred_time > time_limit_s:
                row.update(skipped=True, predicted_gib=pred_mem / GIB, predicted_s=pred_time)
                rows.append(row)
                print(f"{kind:15s} N={n:>7,d}  skipped (predicted {pred_mem / GIB:.1f} GiB, {pred_time:.0f} s)")
                continue
            repeats = 3 if n <= 16384 else 1
            cmd = [sys.executable, "-m", "keepsight.bench.bridge_memory", "--child", kind, str(n), str(width),
                   str(repeats)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                row.update(skipped=True, error=f"timed out after {timeout_s:.0f} s")
                rows.append(row)
                last_time = timeout_s
                continue
            if proc.returncode != 0:
                row.update(skipped=True, error=proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed")
                rows.append(row)
                print(f"{kind:15s} N={n:>7,d}  failed: {row['error']}")
                continue
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            row.update(skipped=False, **res, peak_gib=res["peak_bytes"] / GIB)
            last_time = res["time_s"]
            rows.append(row)
            print(f"{kind:15s} N={n:>7,d}  {res['time_s']:8.3f} s  peak {row['peak_gib']:6.2f} GiB")
    done = {k: [r for r in rows if r["kind"] == k and not r["skipped"]] for k in kinds}
    ratios = {k: [b["time_s"] / a["time_s"] for a, b in zip(v, v[1:]) if b["n"] == 2 * a["n"] and a["n"] >= 16384]
              for k, v in done.items()}
    lia = {r["n"]: r for r in done.get("lia_mtr", [])}
    result = {
        "benchmark": "bridge-memory", "width": width, "threads": torch.get_num_threads(),
        "mem_limit_gib": mem_limit_gib, "time_limit_s": time_limit_s, "rows": rows,
        "doubling_time_ratio_from_16k": ratios,
        "targets": {"lia_mtr_262144_peak_gib_max": 6.0, "doubling_ratio": [1.7, 2.3]},
        "lia_mtr_262144_peak_gib": lia[262144]["peak_gib"] if 262144 in lia else None,
        "paper": {"lia_mtr_262144_gib": 11.2, "mha_oom_at": 16384, "paper_gpu_gib": 32},
    }
    print("time ratio per doubling of N (N >= 16,384; target 1.7-2.3 for LIA-MTR): "
          + ", ".join(f"{k} {' '.join(f'{x:.2f}' for x in v)}" for k, v in ratios.items()))
    write_result(out, "bridge_memory", result)
    return result


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "--child":
    print(json.dumps(_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))))
