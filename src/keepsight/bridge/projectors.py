"""Baseline bridges with the LIA-MTR interface: forward(x [B, N, d_vision]) -> [B, N, d_model],
and the factory build_bridge over all bridge kinds."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from keepsight.bridge.config import LiaMtrConfig, check_visual_tokens
from keepsight.bridge.lia_mtr import LiaMtrBridge
from keepsight.checks import number
from keepsight.ops import multiscale_retention


def _check_dims(**dims: object) -> None:
    for name, value in dims.items():
        number(name, value, 1, integer=True)


class MLPBridge(nn.Module):
    """LLaVA's mlp2x_gelu projector: Linear(d_vision, d_model) -> GELU -> Linear(d_model, d_model), per token."""

    def __init__(self, d_vision: int, d_model: int) -> None:
        super().__init__()
        _check_dims(d_vision=d_vision, d_model=d_model)
        self.d_vision, self.d_model = d_vision, d_model
        self.fc1 = nn.Linear(d_vision, d_model)
        self.fc2 = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_visual_tokens(x, self.d_vision)
        return self.fc2(F.gelu(self.fc1(x)))  # [B, N, d_model]


class AttentionBridge(nn.Module):
    """Input projection to d_model, bidirectional multi-head softmax self-attention over the patches,
    output projection.

    impl="naive" forms the [B, H, N, N] score matrix explicitly; impl="sdpa" calls
    torch.nn.functional.scaled_dot_product_attention. Same parameters, same outputs.
    """

    IMPLS = ("naive", "sdpa")

    def __init__(self, d_vision: int, d_model: int, n_heads: int = 8, impl: str = "sdpa") -> None:
        super().__init__()
        _check_dims(d_vision=d_vision, d_model=d_model, n_heads=n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if impl not in self.IMPLS:
            raise ValueError(f"impl must be one of {self.IMPLS}, got {impl!r}")
        self.d_vision, self.d_model, self.n_heads, self.impl = d_vision, d_model, n_heads, impl
        self.in_proj = nn.Linear(d_vision, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_visual_tokens(x, self.d_vision)
        B, N, _ = x.shape
        H = self.n_heads
        hd = self.d_model // H
        h = self.in_proj(x)  # [B, N, dm]
        qkv = self.qkv(h).view(B, N, 3, H, hd).permute(2, 0, 3, 1, 4)  # [3, B, H, N, hd]
        q, k, v = qkv[0], qkv[1], qkv[2]  # each [B, H, N, hd]
        if self.impl == "sdpa":
            a = F.scaled_dot_product_attention(q, k, v)  # [B, H, N, hd]
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)  # [B, H, N, N]
            a = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v  # [B, H, N, hd]
        a = a.transpose(1, 2).reshape(B, N, self.d_model)  # [B, N, dm]
        return self.out(a)


class LinearAttentionBridge(nn.Module):
    """Plain causal linear attention, elementwise form, no gate, no decay, no normalisation:

        y_t = W_o( q_t * sum_{j <= t} k_j * v_j ),  q, k = ELU + 1.

    Its scan is LIA-MTR's with S = 1, lambda = 1 and alpha = 1, but it puts ELU + 1 on q too, so the bridge is
    not LIA-MTR's Lemma-2 special case (which keeps q linear; see tests/bridge/test_paper_lia_mtr.py).
    """

    def __init__(self, d_vision: int, d_model: int, d_inner: int | None = None, chunk_size: int = 64) -> None:
        super().__init__()
        d_inner = d_model if d_inner is None else d_inner
        _check_dims(d_vision=d_vision, d_model=d_model, d_inner=d_inner, chunk_size=chunk_size)
        self.d_vision, self.d_model, self.d_inner, self.chunk_size = d_vision, d_model, d_inner, chunk_size
        self.qkv = nn.Linear(d_vision, 3 * d_inner)
        self.out = nn.Linear(d_inner, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_visual_tokens(x, self.d_vision)
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each [B, N, di]
        q, k = F.elu(q) + 1.0, F.elu(k) + 1.0
        alpha = x.new_ones(x.shape[0], x.shape[1], 1)  # [B, N, 1]
        no_decay = torch.ones(1, device=x.device)  # [1]: lambda = 1 (a constant, not a buffer: meta-init safe)
        m = multiscale_retention(k * v, alpha, no_decay, chunk_size=self.chunk_size)  # [B, N, di]
        return self.out(q * m)  # [B, N, dm]


BRIDGE_KINDS = ("mlp", "lia_mtr", "attention", "attention_sdpa", "linear_attention")


def build_bridge(kind: str, d_vision: int, d_model: int, **kw) -> nn.Module:
    """Build a bridge by name. Extra keywords go to the class (LiaMtrConfig fields for "lia_mtr";
    n_heads for the attention kinds, where "attention" is the naive implementation)."""
    if kind == "mlp":
        return MLPBridge(d_vision, d_model, **kw)
    if kind == "lia_mtr":
        return LiaMtrBridge(LiaMtrConfig(d_vision=d_vision, d_model=d_model, **kw))
    if kind in ("attention", "attention_sdpa"):
        if "impl" in kw:
            raise ValueError(f"kind {kind!r} fixes impl; pass kind='attention' (naive) or 'attention_sdpa'")
        return AttentionBridge(d_vision, d_model, impl="naive" if kind == "attention" else "sdpa", **kw)
    if kind == "linear_attention":
        return LinearAttentionBridge(d_vision, d_model, **kw)
    raise ValueError(f"unknown bridge kind {kind!r}; choose one of {', '.join(BRIDGE_KINDS)}")
