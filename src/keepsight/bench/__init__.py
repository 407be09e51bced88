"""Benchmarks: printed tables + JSON, never timed tests."""

from __future__ import annotations

import json
from pathlib import Path


def write_result(out: str | Path, name: str, result: dict) -> Path:
    """Write ``result`` as ``<out>/<name>.json`` (atomically) and say where."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)
    print(f"wrote {path}")
    return path
