"""Benchmarks: printed tables + JSON, never timed tests."""

from __future__ import annotations

import time
from pathlib import Path

from ..atomic import write_json


def write_result(out: str | Path, name: str, result: dict) -> Path:
    """Write ``result`` as ``<out>/<name>.json`` (atomically) and say where."""
    path = write_json(Path(out) / f"{name}.json", result)
    print(f"wrote {path}")
    return path


def best_time(fn, repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``fn()``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
