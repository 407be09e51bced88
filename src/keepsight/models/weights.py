"""Checks of a checkpoint's weights: before anything loads them, a truncated or zero-byte download or a missing shard
is an error naming the file, not a traceback from deep inside a loader; after loading, a weight holding NaN or inf (a
corrupt file whose header is intact, a diverged run) is an error naming the tensor, not a model that answers "" to
everything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn


def check_weights(path: str | os.PathLike, files: list[Path] | None = None) -> list[Path]:
    """The directory's weight files (or the given ``files``), each a readable safetensors file (header and data
    within the file); a clear error naming the file otherwise (a truncated or zero-byte download, a missing
    shard)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if files is None and index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{index} is corrupt: {e}") from None
        files = [path / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{path}: weight shards {missing} named in {index.name} are missing")
    elif files is None:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        if any(path.glob("pytorch_model*.bin")):
            return sorted(path.glob("pytorch_model*.bin"))
        raise FileNotFoundError(f"{path} holds no model weights (*.safetensors)")
    for f in files:
        try:
            with safe_open(f, "pt") as fh:
                keys = list(fh.keys())
                if keys:
                    fh.get_slice(keys[-1])  # the header's offsets are checked against the file's size
        except Exception as e:  # safetensors raises its own SafetensorError (and OSError for unreadable files)
            raise ValueError(f"{f}: not a readable safetensors file ({type(e).__name__}: {e}); the file is "
                             "truncated, empty or not safetensors") from None
    return files


def check_finite_weights(model: nn.Module, where: str | os.PathLike, chunk: int = 1 << 24) -> None:
    """A ValueError naming ``where`` and the first tensors when a floating parameter of ``model`` holds NaN or inf
    (read ``chunk`` elements at a time: no copy the size of the model)."""
    bad = []
    for name, p in model.named_parameters():
        if not p.is_floating_point() or p.device.type == "meta":
            continue
        flat = p.detach().reshape(-1)
        if any(not bool(torch.isfinite(flat[i:i + chunk]).all()) for i in range(0, flat.numel(), chunk)):
            bad.append(name)
            if len(bad) == 3:
                break
    if bad:
        raise ValueError(f"{where}: weights {bad}{' (and maybe more)' if len(bad) == 3 else ''} hold NaN or inf "
                         "values (a corrupt file or a diverged run); refusing to use them")
