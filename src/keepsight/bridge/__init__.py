"""Vision -> LLM bridges (projectors): LIA-MTR and its baselines, behind one factory."""

from __future__ import annotations

from keepsight.bridge.config import LiaMtrConfig, check_visual_tokens
from keepsight.bridge.lia_mtr import LiaMtrBridge, LiaMtrState
from keepsight.bridge.projectors import (
    BRIDGE_KINDS,
    AttentionBridge,
    LinearAttentionBridge,
    MLPBridge,
    build_bridge,
)
from keepsight.bridge.swap import LlavaBridgeConfig, LlavaBridgeForConditionalGeneration, replace_projector

__all__ = [
    "BRIDGE_KINDS",
    "AttentionBridge",
    "LiaMtrBridge",
    "LiaMtrConfig",
    "LiaMtrState",
    "LinearAttentionBridge",
    "LlavaBridgeConfig",
    "LlavaBridgeForConditionalGeneration",
    "MLPBridge",
    "build_bridge",
    "check_visual_tokens",
    "replace_projector",
]
