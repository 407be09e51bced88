"""The released PVM checkpoint layout (github.com/huaixuheqing/PVM): a whole model directory whose ``config.json``
carries ``text_config.pvm_hidden_size`` and ``text_config.pvm_layers`` (and names ``PVMQwen3VLForConditionalGeneration``
with an ``auto_map`` into the directory's own Python files) and whose weights hold each block under
``model.language_model.layers.N.pvm_block.*``.

keepsight reads such a directory without running its Python files: the config without its PVM fields builds the
backbone's own transformers class, the ``pvm_block`` tensors load into released blocks attached on the named
layers. ``save_released`` writes the layout back from a model with the released block attached (a round trip), and
the adapter files (``keepsight.pvm.io``) convert to and from it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import CONFIG_MAPPING, AutoModelForImageTextToText

from ..atomic import atomic_save_dir
from ..models.arch import arch_info
from ..models.layouts import Layout
from .attach import PREFIX, attach_pvm, detach_pvm, pvm_state_dict
from .config import PVMConfig

PVM_FIELDS = ("pvm_hidden_size", "pvm_layers")
CHECKPOINT_KIND = "pvm-checkpoint"  # keepsight's marker in a directory it wrote in the released layout
BLOCK_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.pvm_block\.(.+)$")  # whatever prefix the family saves under


def released_pvm_config(config: dict) -> PVMConfig | None:
    """The PVM a ``config.json`` dict declares in the released layout (None when it declares none)."""
    text = config.get("text_config") or {}
    if not any(k in text for k in PVM_FIELDS):
        return None
    missing = [k for k in PVM_FIELDS if text.get(k) is None]
    if missing:
        raise ValueError(f"config.json declares a released PVM but text_config lacks {missing}")
    layers = text["pvm_layers"]
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"text_config.pvm_layers must be a non-empty list of layer indices, got {layers!r}")
    return PVMConfig(layers=layers, pvm_hidden_size=text["pvm_hidden_size"])


def backbone_config(config: dict):
    """The backbone's own transformers config from a released-layout ``config.json`` dict (PVM fields, the custom
    class and its ``auto_map`` removed)."""
    clean = json.loads(json.dumps(config))
    for k in PVM_FIELDS:
        clean.get("text_config", {}).pop(k, None)
    clean.pop("auto_map", None)
    model_type = clean.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"released PVM layout with model_type {model_type!r}: not a transformers model type")
    clean["architectures"] = [a.removeprefix("PVM") for a in clean.get("architectures") or []] or None
    return CONFIG_MAPPING[model_type].from_dict(clean)


def read_blocks(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The ``pvm_block`` tensors of a directory's safetensors files, under keepsight's names (``pvm.<layer>.*``)."""
    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            for key in fh.keys():
                m = BLOCK_KEY.search(key)
                if m:
                    out[f"{PREFIX}{m.group(1)}.{m.group(2)}"] = fh.get_tensor(key)
    return out


def load_released(path: str | os.PathLike, config: dict, dtype: torch.dtype | None):
    """The backbone of a released-layout directory with the released blocks attached and loaded (strictly: every
    block tensor present, none left over)."""
    pvm = released_pvm_config(config)
    backbone = backbone_config(config)
    cls = AutoModelForImageTextToText._model_mapping[type(backbone)]
    # the block tensors are read below (strictly); transformers is told not to report them as unexpected
    had = "_keys_to_ignore_on_load_unexpected" in cls.__dict__
    saved = cls.__dict__.get("_keys_to_ignore_on_load_unexpected")
    cls._keys_to_ignore_on_load_unexpected = [*(cls._keys_to_ignore_on_load_unexpected or []),
                                              r"\.pvm_block\."]
    try:
        model = cls.from_pretrained(path, config=backbone, dtype=dtype or "auto")
    finally:
        if had:
            cls._keys_to_ignore_on_load_unexpected = saved
        else:
            del cls._keys_to_ignore_on_load_unexpected
    attach_pvm(model, pvm)
    blocks = read_blocks(path)
    expected = pvm_state_dict(model)
    if set(blocks) != set(expected):
        detach_pvm(model)
        missing, extra = sorted(set(expected) - set(blocks)), sorted(set(blocks) - set(expected))
        raise ValueError(f"{path}: its pvm_block tensors do not match text_config.pvm_layers / pvm_hidden_size "
                         f"(missing {missing[:4]}, unexpected {extra[:4]})")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in blocks:
                if blocks[name].shape != param.shape:
                    detach_pvm(model)
                    raise ValueError(f"{path}: {name} has shape {tuple(blocks[name].shape)}, the block expects "
                                     f"{tuple(param.shape)}")
                param.copy_(blocks[name].to(param.dtype))
    return model


def save_released(model: torch.nn.Module, directory: str | os.PathLike, processor=None, extra=None) -> Path:
    """Write ``model`` (with the released block attached) in the released layout, atomically (an existing
    ``directory`` is replaced: check it is keepsight's first): the backbone's weights as ``save_pretrained`` writes
    them plus every block under ``<decoder>.layers.N.pvm_block.*``, a config with ``text_config.pvm_hidden_size`` /
    ``pvm_layers`` (without an ``auto_map``: keepsight needs no remote code), the processor when given, and
    whatever ``extra(tmpdir)`` writes (e.g. a training summary)."""
    st = getattr(model, "_keepsight_pvm", None)
    if st is None:
        raise ValueError("no PVM attached to this model: nothing to save in the released layout")
    if st.config.variant != "released":
        raise ValueError(f"the released layout holds the released block; this model carries variant "
                         f"{st.config.variant!r} (save it as an adapter with save_pvm)")
    if not st.config.output_norm:
        raise ValueError("the released layout's block normalises its output; this model carries output_norm=False "
                         "(an ablation: save it as an adapter with save_pvm)")
    sizes = {block.pvm_hidden_size for block in model.pvm.values()}
    decoder = arch_info(model).spec.decoder
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(PREFIX)}
    for name, tensor in pvm_state_dict(model).items():
        layer, rest = name[len(PREFIX):].split(".", 1)
        state[f"{decoder}.layers.{layer}.pvm_block.{rest}"] = tensor

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=state)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.setdefault("text_config", {}).update(pvm_hidden_size=next(iter(sizes)), pvm_layers=list(st.layers))
        cfg["architectures"] = [f"PVM{type(model).__name__}"]
        cfg_path.write_text(json.dumps(cfg, indent=2))
        if processor is not None:
            processor.save_pretrained(tmp)
        if extra is not None:
            extra(tmp)

    return atomic_save_dir(directory, write, kind=CHECKPOINT_KIND)


# the reader keepsight.models.load_checkpoint finds through the keepsight.layouts entry point (pyproject.toml)
LAYOUT = Layout("pvm", lambda config: released_pvm_config(config) is not None, load_released)
