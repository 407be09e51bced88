"""Benchmarks: printed tables + JSON, never timed tests."""

from __future__ import annotations

from pathlib import Path

from ..atomic import write_json


def write_result(out: str | Path, name: str, result: dict) -> Path:
    """Write ``result`` as ``<out>/<name>.json`` (atomically) and say where."""
    path = write_json(Path(out) / f"{name}.json", result)
    print(f"wrote {path}")
    return path
