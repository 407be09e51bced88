"""Adapter files: ``pvm_config.json`` + ``pvm.safetensors``, written atomically."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..atomic import make_temp_dir, mark, use_umask
from ..methods import register_method
from ..models.arch import signature, signature_mismatch
from .attach import attach_pvm, detach_pvm, pvm_state_dict
from .config import PVMConfig

CONFIG_FILE = "pvm_config.json"
WEIGHTS_FILE = "pvm.safetensors"
ADAPTER_KIND = "pvm-adapter"  # keepsight's marker in an adapter directory


def save_pvm(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write the attached PVM's config, base-model description and weights to ``directory``."""
    st = model._keepsight_pvm if getattr(model, "_keepsight_pvm", None) is not None else None
    if st is None:
        raise ValueError("no PVM attached to this model: nothing to save")
    meta = {"pvm": st.config.to_dict(), "layers": st.layers, "base": signature(model)}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(directory, ".pvm.tmp")
    try:
        tensors = {k: v.contiguous().cpu() for k, v in pvm_state_dict(model).items()}
        save_file(tensors, str(tmp / WEIGHTS_FILE))
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
        use_umask(tmp)
        for name in (WEIGHTS_FILE, CONFIG_FILE):  # weights first: a config never points at missing weights
            os.replace(tmp / name, directory / name)
        mark(directory, ADAPTER_KIND)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def load_pvm(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """Attach the adapter in ``directory`` to ``model`` after checking it fits; says what differs."""
    directory = Path(directory)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} is not a PVM adapter: {name} is missing")
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    try:
        meta = json.loads(config_path.read_text())
        base, recorded = dict(meta["base"]), [int(i) for i in meta["layers"]]
        config = PVMConfig.from_dict(meta["pvm"])
    except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{config_path} is not a valid PVM adapter config ({type(e).__name__}: {e})") from None
    detail = signature_mismatch(base, model)
    if detail:
        raise ValueError(f"PVM adapter {directory} does not fit this model ({detail})")
    depth = signature(model)["num_layers"]
    if config.resolve_layers(depth) != recorded:
        raise ValueError(f"{config_path}: its config resolves to layers {config.resolve_layers(depth)} "
                         f"but it records layers {recorded}")
    try:
        weights = load_file(str(weights_path))
    except Exception as e:  # safetensors raises its own SafetensorError
        raise ValueError(f"{weights_path}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    ints = sorted(k for k, v in weights.items() if not v.is_floating_point())
    if ints:
        raise ValueError(f"{weights_path}: tensors {ints} are not floating point ({weights[ints[0]].dtype}); a PVM "
                         "adapter's weights are")
    bad = sorted(k for k, v in weights.items() if not bool(torch.isfinite(v).all()))
    if bad:
        raise ValueError(f"{weights_path}: tensors {bad} hold NaN or inf values")
    attach_pvm(model, config)
    try:
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


# the model-side method: keepsight.inference.Pipeline(method="pvm", pvm=DIR) loads the checkpoint, then this adapter
register_method("pvm", stage="load", needs="a PVM adapter directory (pvm_config.json + pvm.safetensors)",
                takes=("pvm",), requires=("pvm",), attach=lambda model, pipe: load_pvm(model, pipe.pvm_dir))
