"""Diagnostics: visual attention mass / TVR per layer and step, LogitLens."""

from .arch import arch_info, check_layers
from .attention import VisualAttentionProbe

__all__ = ["VisualAttentionProbe", "arch_info", "check_layers"]
from .logit_lens import LogitLens  # noqa: E402

__all__ += ["LogitLens"]
