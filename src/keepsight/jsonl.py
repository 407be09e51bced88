"""The one JSONL reader: every non-blank line a JSON object, or an error naming ``path:line``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path


def read_jsonl(path: str | os.PathLike, what: str = "JSONL") -> Iterator[tuple[str, dict]]:
    """``(where, object)`` for every non-blank line of ``path`` (``where`` is ``"path:line"``). A missing file is a
    FileNotFoundError naming ``what``; text that is not UTF-8, a line that is not JSON or not an object, a
    ValueError naming the file (and line). A byte-order mark and CRLF line ends are read as text editors write
    them."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    try:
        with open(path, encoding="utf-8-sig", newline=None) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
                if not isinstance(rec, dict):
                    raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
                yield where, rec
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
