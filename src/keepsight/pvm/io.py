"""Adapter files: ``pvm_config.json`` + ``pvm.safetensors``, written atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn

from ..models.arch import arch_info
from .attach import attach_pvm, detach_pvm, pvm_state_dict
from .config import PVMConfig

CONFIG_FILE = "pvm_config.json"
WEIGHTS_FILE = "pvm.safetensors"


def save_pvm(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write the attached PVM's config, base-model description and weights to ``directory``."""
    st = model._keepsight_pvm if getattr(model, "_keepsight_pvm", None) is not None else None
    if st is None:
        raise ValueError("no PVM attached to this model: nothing to save")
    info = arch_info(model)
    meta = {
        "pvm": st.config.to_dict(),
        "layers": st.layers,
        "base": {"model_type": info.model_type, "hidden_size": info.language_model.config.hidden_size,
                 "num_layers": len(info.layers)},
    }
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".pvm.tmp", dir=directory))
    try:
        tensors = {k: v.contiguous().cpu() for k, v in pvm_state_dict(model).items()}
        save_file(tensors, str(tmp / WEIGHTS_FILE))
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
        for name in (WEIGHTS_FILE, CONFIG_FILE):  # weights first: a config never points at missing weights
            os.replace(tmp / name, directory / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def load_pvm(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """Attach the adapter in ``directory`` to ``model`` after checking it fits; says what differs."""
    directory = Path(directory)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} is not a PVM adapter: {name} is missing")
    meta = json.loads((directory / CONFIG_FILE).read_text())
    info = arch_info(model)
    have = {"model_type": info.model_type, "hidden_size": info.language_model.config.hidden_size,
            "num_layers": len(info.layers)}
    diff = {k: (meta["base"][k], have[k]) for k in have if meta["base"].get(k) != have[k]}
    if diff:
        detail = ", ".join(f"{k}: adapter {a} vs model {b}" for k, (a, b) in diff.items())
        raise ValueError(f"PVM adapter {directory} does not fit this model ({detail})")
    attach_pvm(model, PVMConfig(**meta["pvm"]))
    try:
        weights = load_file(str(directory / WEIGHTS_FILE))
        params = dict(model.named_parameters())
        expected = set(pvm_state_dict(model))
        if set(weights) != expected:
            raise ValueError(f"PVM adapter {directory}: tensors {sorted(set(weights) ^ expected)} differ "
                             "from its config")
        for k, v in weights.items():
            if params[k].shape != v.shape:
                raise ValueError(f"PVM adapter {directory}: {k} has shape {tuple(v.shape)}, "
                                 f"model expects {tuple(params[k].shape)}")
            params[k].data.copy_(v.to(params[k].dtype))
    except BaseException:
        detach_pvm(model)  # leave the model as it was
        raise
    return model
