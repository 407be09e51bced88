"""Diagnostics: visual attention mass / TVR per layer and step (autoregressive VLMs), LogitLens, and where
masked-diffusion generation slots attend by distance and RoPE band."""

from .attention import VisualAttentionProbe
from .logit_lens import LogitLens
from .rope_attention import RoPEAttentionProbe

__all__ = ["LogitLens", "RoPEAttentionProbe", "VisualAttentionProbe"]
