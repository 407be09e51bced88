"""Masked-diffusion VLMs (LLaDA / LLaDA-V style): the LLaDA-style sampler and the two training-free fixes of
the MPS / MRS paper (arXiv 2605.14530): Mask Prior Suppression (``mps``) and Monotonic RoPE Scaling (``mrs``), with their settings
(``MPSConfig`` / ``MRSConfig``, the papers' defaults) and the NTK / YaRN baselines; our earlier readings of the paper
in ``keepsight.diffusion.readings``. The LLaDA model classes
and loader live in ``keepsight.models``, the attention-by-distance probe in ``keepsight.probes``."""

from keepsight.diffusion.config import MPSConfig, MRSConfig
from keepsight.diffusion.mps import (
    MaskPriorSuppression,
    lone_mask_logits,
    lone_mask_top_tokens,
    prior_cosine,
)
from keepsight.diffusion.mrs import FlashPathSpans, MonotonicRoPEScaling, RoPEBaseline
from keepsight.diffusion.sampler import (
    DiffusionOutput,
    SamplerConfig,
    StepTrace,
    generate,
    guided_logits,
    resolve_mask_token_id,
    transfer_schedule,
)

__all__ = [
    "DiffusionOutput",
    "MPSConfig",
    "MRSConfig",
    "MaskPriorSuppression",
    "FlashPathSpans",
    "MonotonicRoPEScaling",
    "RoPEBaseline",
    "SamplerConfig",
    "StepTrace",
    "generate",
    "guided_logits",
    "lone_mask_logits",
    "lone_mask_top_tokens",
    "prior_cosine",
    "resolve_mask_token_id",
    "transfer_schedule",
]
