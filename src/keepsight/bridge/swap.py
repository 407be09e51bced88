"""Swap the projector of a LLaVA-family model for a bridge, and reload such models with their bridge.

A bridged model is ``LlavaBridgeForConditionalGeneration``: LLaVA with the bridge named in its config
(``config.bridge = {"kind": ..., "d_vision": ..., "d_model": ..., **options}``) in place of
``multi_modal_projector``. ``register_bridged_llava()`` (called by ``keepsight.models.register_model_types``,
which the loader calls) registers the config and model classes with transformers' Auto classes (model type
``keepsight_llava``), so ``AutoModelForImageTextToText.from_pretrained(dir)`` rebuilds the bridge and loads
its weights. Parameter names outside the projector are LLaVA's own.
"""

from __future__ import annotations

from torch import nn
from transformers import AutoConfig, AutoModelForImageTextToText, LlavaConfig, LlavaForConditionalGeneration
from transformers.conversion_mapping import (
    get_checkpoint_conversion_mapping,
    register_checkpoint_conversion_mapping,
)

from ..methods import register_method
from .projectors import build_bridge

MODEL_TYPE = "keepsight_llava"


class LlavaBridgeConfig(LlavaConfig):
    model_type = MODEL_TYPE

    def __init__(self, bridge: dict | None = None, **kwargs):
        self.bridge = dict(bridge) if bridge else None
        super().__init__(**kwargs)


class LlavaBridgeForConditionalGeneration(LlavaForConditionalGeneration):
    config_class = LlavaBridgeConfig

    def __init__(self, config: LlavaBridgeConfig):
        super().__init__(config)
        if not config.bridge:
            raise ValueError("LlavaBridgeConfig.bridge is empty: name the bridge (kind, d_vision, d_model, ...)")
        self.model.multi_modal_projector = bridge_from_spec(config.bridge)
        self.post_init()


def register_bridged_llava() -> None:
    """Register model type ``keepsight_llava`` with transformers' Auto classes (idempotent)."""
    AutoConfig.register(MODEL_TYPE, LlavaBridgeConfig, exist_ok=True)
    AutoModelForImageTextToText.register(LlavaBridgeConfig, LlavaBridgeForConditionalGeneration, exist_ok=True)
    # A model loaded from a LLaVA checkpoint is saved with LLaVA's checkpoint key layout (transformers reverses
    # the renamings it applied on load); the bridged type must read that layout the same way.
    register_checkpoint_conversion_mapping(MODEL_TYPE, get_checkpoint_conversion_mapping("llava"), overwrite=True)


def bridge_from_spec(spec: dict) -> nn.Module:
    spec = dict(spec)
    kind = spec.pop("kind")
    return build_bridge(kind, **spec)


def _vision_width(model: LlavaForConditionalGeneration) -> int:
    cfg = model.config
    width = cfg.vision_config.hidden_size
    layers = cfg.vision_feature_layer
    return width * (len(layers) if isinstance(layers, (list, tuple)) else 1)


def replace_projector(model: nn.Module, kind: str, **options) -> LlavaBridgeForConditionalGeneration:
    """Put a fresh bridge of ``kind`` (see ``build_bridge``) where ``model``'s projector was, in place.

    ``model`` must be LLaVA-family (``LlavaForConditionalGeneration`` or an already bridged one); every
    other weight is kept. Returns the same object, now a ``LlavaBridgeForConditionalGeneration`` whose
    config records the bridge, so ``save_pretrained`` / ``from_pretrained`` round-trip it.
    """
    if not isinstance(model, LlavaForConditionalGeneration):
        kind_of = getattr(getattr(model, "config", None), "model_type", None)
        raise ValueError(f"replace_projector supports LLaVA-family models, got {type(model).__name__}"
                         + (f" (model_type {kind_of!r})" if kind_of else ""))
    text_type = getattr(getattr(model.config, "text_config", None), "model_type", "")
    if "llada" in str(text_type):
        raise ValueError(f"replace_projector: this LLaVA has a masked-diffusion language model ({text_type}); the "
                         "bridges are trained and evaluated autoregressively, not with the masked-diffusion objective")
    spec = {"kind": kind, "d_vision": _vision_width(model), "d_model": model.config.text_config.hidden_size,
            **options}
    ref = model.lm_head.weight
    bridge = bridge_from_spec(spec).to(ref.device, ref.dtype)
    cfg = model.config.to_dict()
    cfg.pop("model_type", None)
    cfg.pop("bridge", None)
    new_cfg = LlavaBridgeConfig(bridge=spec, **cfg)
    new_cfg._attn_implementation = model.config._attn_implementation
    model.model.multi_modal_projector = bridge
    model.__class__ = LlavaBridgeForConditionalGeneration  # same modules and weights, bridged config
    model.config = new_cfg
    model.model.config = new_cfg
    return model


def _bridged_checkpoint(spec, kind: str, where) -> None:
    if kind != "keepsight_llava":
        raise ValueError(f"method=bridge expects a bridge-converted checkpoint (model_type keepsight_llava, from "
                         f"`keepsight bridge train` or replace_projector + save_pretrained); {where} has model_type "
                         f"{kind!r}")


# the model-side method: keepsight.inference.Pipeline(method="bridge") checks the checkpoint is a bridged one
register_method("bridge", stage="load", needs="a bridge-converted checkpoint (model_type keepsight_llava)",
                check=_bridged_checkpoint)
