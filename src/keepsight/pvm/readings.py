"""Our earlier reading of PVM, written before the authors released their block (``keepsight.pvm.block``): a branch
beside the FFN, kept for its tests and for adapters it trained, outside the default API (``keepsight pvm train``
trains the released block). ``attach_pvm(model, BranchConfig(...))`` attaches it; ``load_pvm`` reads its adapters.

Latent cross-attention from text hidden states to the visual embeddings:

    x_lat = W_down x              [B, T, d']     (x: hidden state entering the FFN)
    V_lat = W_down V'             [B, M, d']     (V: visual embeddings as inserted into the LLM input;
                                                  V' = V, or RMSNorm(V) with normalize_v="rms")
    K     = V_lat, or W_k V' with key_proj=True
    r     = softmax(x_lat K^T / (sqrt(d'_h) * temperature)) V_lat    per head, over the M visual tokens only
    h_pvm = W_up r                [B, T, d]
    out   = FFN(x) + lambda * mask * h_pvm   (lambda = 0 at init; mask = 0 at visual positions)

Normalising over visual tokens only makes h_pvm independent of how much text precedes a position. The
visual side (K, V_lat) depends only on V: ``project_visual`` computes it once per sequence and layer, and
``retrieve`` takes it from there on every decode step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..checks import number
from .config import CONFIG_READERS, PVMConfig


@dataclass
class BranchConfig(PVMConfig):
    """The branch's settings: the released block's placement and memory settings (``pvm_hidden_size`` is d', default
    width / 4), with its own retrieval options; the released block's ``expander_init`` and ``output_norm`` do not
    apply."""

    variant: ClassVar[str] = "branch"
    heads: int = 1  # d' split into heads for the latent retrieval
    shared_down: bool = True  # one W_down for text queries and visual keys/values (paper); False = separate
    gate: str = "scalar"  # "scalar" | "channel": lambda, initialised to 0 (model starts as the base)
    normalize_v: str = "none"  # "rms": V goes through an RMSNorm (learnable scale, init 1) before W_down
    key_proj: bool = False  # True: a separate key projection W_k V (values stay W_down V)
    temperature: float = 1.0  # retrieval logits / (sqrt(d'_h) * temperature)

    def __post_init__(self) -> None:
        super().__post_init__()
        stray = [k for k, v in (("expander_init", "backbone"), ("output_norm", True)) if getattr(self, k) != v]
        if stray:
            raise ValueError(f"{', '.join(stray)} {'applies' if len(stray) == 1 else 'apply'} only to the released "
                             "block, not the branch")
        self.heads = number("heads", self.heads, 1, integer=True)
        if self.pvm_hidden_size is not None and self.pvm_hidden_size % self.heads:
            raise ValueError(f"pvm_hidden_size {self.pvm_hidden_size} must be divisible by heads {self.heads}")
        if self.gate not in ("scalar", "channel"):
            raise ValueError(f"gate must be 'scalar' or 'channel', got {self.gate!r}")
        for name in ("shared_down", "key_proj"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.normalize_v not in ("none", "rms"):
            raise ValueError(f"normalize_v must be 'none' or 'rms', got {self.normalize_v!r}")
        self.temperature = number("temperature", self.temperature, 1e-3, 1e3)

    def resolve_latent(self, hidden: int) -> int:
        """d' for a model of width ``hidden``: at most ``hidden`` (W_down projects down)."""
        d = self.pvm_hidden_size if self.pvm_hidden_size is not None else max(self.heads, hidden // 4)
        if d > hidden:
            raise ValueError(f"pvm_hidden_size {d} exceeds the model width {hidden}; the branch's W_down projects "
                             "down (d' <= d; the paper: 1024 of 4096)")
        if d % self.heads:
            raise ValueError(f"pvm_hidden_size {d} must be divisible by heads {self.heads}")
        return d


def read_config(fields: dict) -> BranchConfig:
    """The branch's config from an adapter's recorded fields; adapters written before the released block existed
    record no ``variant`` and name d' ``latent_dim``."""
    fields = dict(fields)
    if "latent_dim" in fields:
        fields["pvm_hidden_size"] = fields.pop("latent_dim")
    return BranchConfig(**fields)


CONFIG_READERS.update({BranchConfig.variant: read_config, None: read_config})


class PVMBranch(nn.Module):
    def __init__(self, hidden: int, config: BranchConfig):
        super().__init__()
        self.latent = config.resolve_latent(hidden)
        self.heads = config.heads
        self.temperature = config.temperature
        self.down = nn.Linear(hidden, self.latent, bias=False)
        self.down_v = None if config.shared_down else nn.Linear(hidden, self.latent, bias=False)
        self.key = nn.Linear(hidden, self.latent, bias=False) if config.key_proj else None
        self.v_norm = nn.RMSNorm(hidden, eps=1e-6) if config.normalize_v == "rms" else None
        self.up = nn.Linear(self.latent, hidden, bias=False)
        self.gate = nn.Parameter(torch.zeros(1 if config.gate == "scalar" else hidden))
        self.dropout = nn.Dropout(config.dropout)

    def project_visual(self, visual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The visual side of the retrieval, once per sequence: visual [B, M, d] -> (keys, values), each
        [B, h, M, d'_h]."""
        b, m, _ = visual.shape
        h, dh = self.heads, self.latent // self.heads
        v = visual.to(self.down.weight.dtype)
        if self.v_norm is not None:
            v = self.v_norm(v)
        values = (self.down_v or self.down)(v).view(b, m, h, dh).transpose(1, 2)  # [B, h, M, dh]
        keys = values if self.key is None else self.key(v).view(b, m, h, dh).transpose(1, 2)  # [B, h, M, dh]
        return keys, values

    def retrieve(self, x: torch.Tensor, visual: torch.Tensor, visual_mask: torch.Tensor,
                 projected: tuple[torch.Tensor, torch.Tensor] | None = None, return_weights: bool = False):
        """h_pvm before the gate. x [B, T, d], visual [B, M, d], visual_mask [B, M] bool -> [B, T, d] (and the
        retrieval weights [B, h, T, M] with ``return_weights``). ``projected``: ``project_visual(visual)``
        computed before (the same value). Rows with no visual token get zeros."""
        b, t, _ = x.shape
        h, dh = self.heads, self.latent // self.heads
        keys, values = projected if projected is not None else self.project_visual(visual)
        q = self.down(x.to(self.down.weight.dtype)).view(b, t, h, dh).transpose(1, 2)  # [B, h, T, dh]
        scores = q @ keys.transpose(-1, -2) / (dh**0.5 * self.temperature)  # [B, h, T, M]
        scores = scores.masked_fill(~visual_mask[:, None, None, :], torch.finfo(scores.dtype).min)
        weights = scores.softmax(-1)  # [B, h, T, M]
        r = (self.dropout(weights) @ values).transpose(1, 2).reshape(b, t, self.latent)  # [B, T, d']
        has_visual = visual_mask.any(-1).to(r.dtype)[:, None, None]  # [B, 1, 1]
        out = self.up(r) * has_visual
        return (out, weights) if return_weights else out

    def forward(self, x, visual, visual_mask, text_mask, projected=None, return_weights: bool = False):
        """lambda * mask * h_pvm: [B, T, d] in x's dtype; ``text_mask`` [B, T] is 0 where no output may go (and the
        retrieval weights [B, h, T, M] with ``return_weights``)."""
        h, weights = self.retrieve(x, visual, visual_mask, projected, return_weights=True)
        out = (self.gate * text_mask[..., None].to(h.dtype) * h).to(x.dtype)
        return (out, weights) if return_weights else out
