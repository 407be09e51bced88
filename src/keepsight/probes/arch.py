"""One table of where each supported VLM keeps its language model, decoder layers and image token.

An unknown architecture is a clear error, never a silent guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class ArchInfo:
    model_type: str
    language_model: nn.Module  # the decoder stack (has .layers, .norm, .config)
    layers: nn.ModuleList  # decoder layers, in order
    final_norm: nn.Module  # norm applied before lm_head
    lm_head: nn.Module
    image_token_id: int


# model_type -> how to reach the decoder stack from the ForConditionalGeneration model
_DECODER_PATHS = {
    "llava": "model.language_model",
    "keepsight_llava": "model.language_model",  # LLaVA with a keepsight bridge as projector
    "qwen3_vl": "model.language_model",
    "qwen2_5_vl": "model.language_model",
}


def arch_info(model: nn.Module) -> ArchInfo:
    """Locate decoder layers, final norm, lm_head and image token id of a supported VLM."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _DECODER_PATHS:
        raise ValueError(
            f"unsupported architecture {model_type!r} ({type(model).__name__}); keepsight supports "
            f"{sorted(_DECODER_PATHS)}"
        )
    lm: nn.Module = model
    for part in _DECODER_PATHS[model_type].split("."):
        lm = getattr(lm, part)
    image_token_id = getattr(config, "image_token_id", None)
    if image_token_id is None:
        image_token_id = getattr(config, "image_token_index", None)
    if image_token_id is None:
        raise ValueError(f"{type(model).__name__} config names no image token id")
    return ArchInfo(model_type, lm, lm.layers, lm.norm, model.lm_head, int(image_token_id))


def check_layers(layers, n_layers: int) -> list[int]:
    """Validate layer indices (negative indices count from the end); None means all layers."""
    if layers is None:
        return list(range(n_layers))
    out = []
    for i in layers:
        j = int(i) + n_layers if int(i) < 0 else int(i)
        if not 0 <= j < n_layers:
            raise ValueError(f"layer index {i} out of range for a model with {n_layers} decoder layers")
        out.append(j)
    if len(set(out)) != len(out):
        raise ValueError(f"layer indices repeat: {list(layers)}")
    return sorted(out)
