"""Masked-diffusion VLMs (LLaDA / LLaDA-V style) and the two training-free fixes of SPEC section C:
Mask Prior Suppression (``mps``) and Monotonic RoPE Scaling (``mrs``), plus a LLaDA-style sampler.

Importing this package registers ``model_type = "llada"`` with transformers' Auto classes.
"""

from keepsight.diffusion.attention import RoPEAttentionProbe
from keepsight.diffusion.model import (
    CHECKPOINT_KEY_MAP,
    LladaConfig,
    LladaForMaskedDiffusion,
    LladaModel,
    build_llada_lm,
    build_llada_v,
    decoder_stack,
    llada_config_from_olmo,
    llada_text_config,
    load_llada_v,
    load_mapped_state,
    map_checkpoint_keys,
)
from keepsight.diffusion.mps import (
    MaskPriorSuppression,
    layer_states,
    lone_mask_logits,
    lone_mask_top_tokens,
    pca_basis,
    prior_cosine,
)
from keepsight.diffusion.mrs import MonotonicRoPEScaling, RoPEBaseline
from keepsight.diffusion.sampler import (
    DiffusionOutput,
    StepTrace,
    generate,
    guided_logits,
    resolve_mask_token_id,
    transfer_schedule,
)

__all__ = [
    "RoPEAttentionProbe",
    "CHECKPOINT_KEY_MAP",
    "DiffusionOutput",
    "LladaConfig",
    "LladaForMaskedDiffusion",
    "LladaModel",
    "MaskPriorSuppression",
    "MonotonicRoPEScaling",
    "RoPEBaseline",
    "StepTrace",
    "build_llada_lm",
    "build_llada_v",
    "decoder_stack",
    "generate",
    "guided_logits",
    "layer_states",
    "llada_config_from_olmo",
    "llada_text_config",
    "load_llada_v",
    "load_mapped_state",
    "lone_mask_logits",
    "lone_mask_top_tokens",
    "map_checkpoint_keys",
    "pca_basis",
    "prior_cosine",
    "resolve_mask_token_id",
    "transfer_schedule",
]
