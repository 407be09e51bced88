"""The PVM block as its authors released it (``PVMMemoryBlock`` of github.com/huaixuheqing/PVM,
``modeling_file/modeling_qwen3_vl.py``): a bottleneck adapter beside the FFN of a decoder layer.

    q_lat = input_norm(text_reducer h)                 [B, T, p]   h: the residual stream after self-attention
    v_lat = vision_reducer V                           [B, M, p]   V: inputs_embeds at the visual positions
    Q = q_norm(q_proj q_lat)  K = k_norm(k_proj v_lat)  Vv = v_proj v_lat     per head (head_dim: the backbone's)
    m_raw = o_proj softmax(Q K^T / sqrt(head_dim) + mask) Vv                  (fp32 softmax over visual keys only)
    m = m_raw + mlp(post_attn_norm m_raw)              SwiGLU, intermediate int(p * I / d)
    out = gate_alpha * rmsnorm(output_expander m) * (1 - visual query)       affine-free RMSNorm, [B, T, d]

``out`` is added to the FFN's output. Parameter names are the release's (``text_reducer``, ``cross_attn.q_proj``,
``gate_alpha``, ...), so its checkpoint layout maps one to one. Two departures, both documented choices, and one named ablation:

- initialisation: the released file zeroes both ``output_expander`` and ``gate_alpha``, so neither gets a gradient
  (a dead branch). Here the expander starts at the backbone's initialisation (normal, ``initializer_range``) and the
  gate at 0: the model starts as the base and the gate has a gradient. ``expander_init="zero"`` rebuilds the
  released construction (to show the trap; tested).
- ``output_norm=False`` (an ablation, not the default) drops the RMSNorm on the expander's output: with the norm the
  update's RMS is the gate's whatever was retrieved; without it, its size follows the retrieval.
- numerics: the parameters are kept in fp32 (master weights) whatever the backbone's dtype; the block computes in
  its parameters' dtype and returns the backbone's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers.activations import ACT2FN

from .config import PVMConfig


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def rms_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Qwen-style RMSNorm: computed in (at least) fp32, cast back, then scaled (``weight``: None for the affine-free
    norm). In fp32 with no gradient recorded (decoding) it is torch's ``rms_norm``: one call instead of eight (its steps
    run inside ATen; about 13 us against 17-21 us on a decode step's tensors on the CPU), equal bit for bit in fp32
    (tested); training keeps the steps below, whose backward the pinned runs were made with."""
    if x.dtype == torch.float32 and not torch.is_grad_enabled():
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    dtype = x.dtype
    h = x.to(_at_least_fp32(dtype))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = h.to(dtype)
    return h if weight is None else weight * h


def visual_masks(visual_mask: torch.Tensor, dtype: torch.dtype, drop_trivial: bool = False
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """What the block derives from ``visual_mask [B, M]``, the same at every decode step of a request: the additive
    attention bias over the visual keys [B, 1, 1, M] (0, or the dtype's lowest at padding) and whether each row has
    a visual token at all [B, 1, 1] (1 or 0). ``drop_trivial`` (once per request, when decoding): None for a bias of
    zeros (no padding) and for rows that all have one, so no step adds 0 or multiplies by 1 (the same bits, fewer
    operations)."""
    bias = torch.zeros(visual_mask.shape, dtype=dtype, device=visual_mask.device)
    bias = bias.masked_fill(~visual_mask, torch.finfo(dtype).min)[:, None, None, :]
    rows = visual_mask.any(-1)
    if drop_trivial:
        return (None if bool(visual_mask.all()) else bias), (None if bool(rows.all()) else rows.to(dtype)[:, None, None])
    return bias, rows.to(dtype)[:, None, None]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.eps, self.weight)


class CrossAttention(nn.Module):
    """Text queries over the visual memory in the latent width ``p``: ``p / head_dim`` query heads, KV heads from the
    backbone's grouped-query ratio, per-head q / k RMSNorm, no RoPE."""

    def __init__(self, p: int, head_dim: int, gqa_ratio: int, bias: bool, eps: float, dropout: float):
        super().__init__()
        if p % head_dim:
            raise ValueError(f"pvm_hidden_size {p} must be a multiple of the backbone's head_dim {head_dim}")
        self.head_dim, self.heads = head_dim, p // head_dim
        self.kv_heads = max(1, self.heads // gqa_ratio)
        if self.heads % self.kv_heads:
            raise ValueError(f"pvm_hidden_size {p}: {self.heads} query heads do not group over {self.kv_heads} KV heads")
        self.q_proj = nn.Linear(p, self.heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(p, self.kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(p, self.kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * head_dim, p, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        self.dropout = dropout

    def keys_values(self, v_lat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """v_lat [B, M, p] -> keys, values [B, kv_heads, M, head_dim] (keys k-normed)."""
        b, m, _ = v_lat.shape
        k = self.k_norm(self.k_proj(v_lat).view(b, m, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(v_lat).view(b, m, self.kv_heads, self.head_dim).transpose(1, 2)
        return k, v

    def forward(self, q_lat: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None):
        """q_lat [B, T, p], keys / values [B, kvh, M, hd], bias: ``visual_masks``' additive bias over the keys
        [B, 1, 1, M] (None: no padding) -> ([B, T, p], weights [B, h, T, M]).
        Query head i reads KV head i // groups (as ``repeat_interleave`` would expand them): the heads of a group are
        stacked along the query axis and read their KV head once, with no copy of the keys and values."""
        b, t, _ = q_lat.shape
        q = self.q_norm(self.q_proj(q_lat).view(b, t, self.heads, self.head_dim)).transpose(1, 2)  # [B, h, T, hd]
        groups, m = self.heads // self.kv_heads, keys.shape[2]
        q = q.reshape(b, self.kv_heads, groups * t, self.head_dim)  # [B, kvh, g * T, hd]
        scores = (q @ keys.transpose(-1, -2)).view(b, self.heads, t, m) * self.head_dim**-0.5  # [B, h, T, M]
        if bias is not None:
            scores = scores + bias
        weights = scores.softmax(-1, dtype=_at_least_fp32(scores.dtype)).to(q.dtype)
        weights_used = F.dropout(weights, p=self.dropout, training=True) if self.training and self.dropout else weights
        out = weights_used.view(b, self.kv_heads, groups * t, m) @ values  # [B, kvh, g * T, hd]
        out = out.view(b, self.heads, t, self.head_dim).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.o_proj(out), weights


def ffn_width(text_config) -> int:
    """The backbone's FFN width: ``intermediate_size``, or one expert's (``moe_intermediate_size``) in a sparse MoE
    stack that names no dense width."""
    for key in ("intermediate_size", "moe_intermediate_size"):
        width = getattr(text_config, key, None)
        if isinstance(width, int) and width > 0:
            return width
    raise ValueError(f"{type(text_config).__name__} names no FFN width (intermediate_size or moe_intermediate_size)")


class SwiGLU(nn.Module):
    def __init__(self, p: int, intermediate: int, act: str):
        super().__init__()
        self.gate_proj = nn.Linear(p, intermediate, bias=False)
        self.up_proj = nn.Linear(p, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, p, bias=False)
        self.act_fn = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class PVMMemoryBlock(nn.Module):
    """The released block for a backbone whose text config is ``text_config`` (width, heads, FFN ratio, eps)."""

    def __init__(self, text_config, config: PVMConfig):
        super().__init__()
        d = text_config.hidden_size
        heads = text_config.num_attention_heads
        head_dim = getattr(text_config, "head_dim", None) or d // heads
        kv = getattr(text_config, "num_key_value_heads", None) or heads
        eps = getattr(text_config, "rms_norm_eps", 1e-6)
        p = config.resolve_pvm_hidden_size(d, head_dim)
        self.hidden, self.pvm_hidden_size, self.eps, self.output_norm = d, p, eps, config.output_norm
        self.text_reducer = nn.Linear(d, p, bias=False)
        self.vision_reducer = nn.Linear(d, p, bias=False)
        self.output_expander = nn.Linear(p, d, bias=False)
        self.input_norm = RMSNorm(p, eps)
        self.post_attn_norm = RMSNorm(p, eps)
        self.cross_attn = CrossAttention(p, head_dim, max(1, heads // kv), bool(getattr(text_config, "attention_bias",
                                                                                       False)), eps, config.dropout)
        self.mlp = SwiGLU(p, int(p * ffn_width(text_config) / d), getattr(text_config, "hidden_act", "silu"))
        self.gate_alpha = nn.Parameter(torch.zeros(1))
        std = getattr(text_config, "initializer_range", 0.02)
        for module in self.modules():  # the backbone's initialisation (its _init_weights: normal Linear, unit norms)
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if config.expander_init == "zero":  # the released file's construction: a branch with no gradient
            nn.init.zeros_(self.output_expander.weight)

    @property
    def gate(self) -> torch.Tensor:
        return self.gate_alpha

    def project_visual(self, visual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The visual side, once per sequence: visual [B, M, d] -> keys, values [B, kv_heads, M, head_dim]."""
        return self.cross_attn.keys_values(self.vision_reducer(visual.to(self.vision_reducer.weight.dtype)))

    def forward(self, query: torch.Tensor, visual: torch.Tensor, visual_mask: torch.Tensor,
                text_mask: torch.Tensor | None, projected: tuple[torch.Tensor, torch.Tensor] | None = None,
                return_weights: bool = False, masks: tuple[torch.Tensor | None, torch.Tensor | None] | None = None):
        """query [B, T, d] (the residual stream after self-attention), visual [B, M, d], visual_mask [B, M] bool,
        text_mask [B, T] (0: no update here; None: every position is updated) -> the update [B, T, d] in the query's
        dtype (and the retrieval weights [B, heads, T, M] with ``return_weights``). Rows with no visual token get
        zeros. ``projected`` / ``masks``: ``project_visual(visual)`` / ``visual_masks(visual_mask, dtype)`` computed
        once per request (decoding)."""
        dtype = self.text_reducer.weight.dtype
        keys, values = projected if projected is not None else self.project_visual(visual)
        bias, rows = masks if masks is not None else visual_masks(visual_mask, dtype)
        q_lat = self.input_norm(self.text_reducer(query.to(dtype)))  # [B, T, p]
        m_raw, weights = self.cross_attn(q_lat, keys, values, bias)  # [B, T, p]
        m = m_raw + self.mlp(self.post_attn_norm(m_raw))  # [B, T, p]
        out = self.output_expander(m)  # [B, T, d]
        out = self.gate_alpha * (rms_norm(out, self.eps) if self.output_norm else out)
        keep = None if text_mask is None else text_mask.to(dtype)[..., None]  # [B, T, 1]
        if rows is not None:
            keep = rows if keep is None else keep * rows
        if keep is not None:
            out = out * keep
        out = out.to(query.dtype)
        return (out, weights) if return_weights else out
