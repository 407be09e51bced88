"""Fingerprints of what an output was made from (a model directory, a dataset, settings), recorded beside the
output so that reusing it, or resuming it, can check it is the same request."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin")


def digest(obj, length: int = 16) -> str:
    """A short stable hash of a JSON-able object: the first ``length`` hex digits of the SHA-256 of its JSON
    with sorted keys (what every cache key and dataset fingerprint in keepsight is made from)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:length]


def dir_fingerprint(path: str | os.PathLike) -> dict:
    """A model / adapter directory: where it is, its config files' hashes and its weight files' sizes (cheap
    for multi-GB checkpoints; a retrained model in the same place changes its config or its sizes rarely, so
    the caller's own settings are compared as well)."""
    path = Path(path)
    out: dict = {"path": str(path.resolve())}
    if path.is_dir():
        for f in sorted(path.iterdir()):
            if f.is_file() and f.suffix == ".json" and f.name.endswith(("config.json", "pvm_config.json")):
                out[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
            elif f.is_file() and f.suffix in WEIGHT_SUFFIXES:
                out[f.name] = f.stat().st_size
    return out


def data_fingerprint(dataset) -> str:
    """``dataset.fingerprint()`` when the dataset offers one, else a hash of its length and every item's id and
    text (``Sample``s) or repr."""
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        return own()
    if isinstance(own, str):
        return own
    h = hashlib.sha256(str(len(dataset)).encode())
    for i in range(len(dataset)):
        item = dataset[i]
        messages = getattr(item, "messages", None)
        h.update(json.dumps([getattr(item, "id", None), messages], sort_keys=True, default=str).encode()
                 if messages is not None else repr(item).encode())
    return h.hexdigest()[:16]


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Human-readable list of the fields where two recorded requests differ."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {json.dumps(a, default=str)[:60]} -> {json.dumps(b, default=str)[:60]}")
    return out
