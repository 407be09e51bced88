"""Atomic file writes: a reader never sees half a file (write to a sibling, then rename)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: str | os.PathLike, obj) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)
    return path
