"""The PVM branch (``PVMConfig(variant="branch")``): our earlier reading of the paper, before the authors released
their block (``keepsight.pvm.block``). Latent cross-attention from text hidden states to the visual embeddings:

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

import torch
from torch import nn

from .config import PVMConfig


class PVMBranch(nn.Module):
    def __init__(self, hidden: int, config: PVMConfig):
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
