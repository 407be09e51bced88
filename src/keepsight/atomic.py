"""Atomic file and directory writes: a reader never sees half a file (write to a sibling, then rename)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path


def write_json(path: str | os.PathLike, obj) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)
    return path


def atomic_save_dir(out: str | os.PathLike, write) -> Path:
    """Call ``write(tmpdir)`` then rename tmpdir to ``out`` (replacing it): readers never see a half dir."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp", dir=out.parent))
    try:
        write(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
