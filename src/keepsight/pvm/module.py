"""The PVM branch: latent cross-attention from text hidden states to the visual embeddings.

    x_lat = W_down x              [B, T, d']     (x: hidden state entering the FFN)
    V_lat = W_down V              [B, M, d']     (V: visual embeddings as inserted into the LLM input)
    r     = softmax(x_lat V_lat^T / sqrt(d'_h)) V_lat    per head, over the M visual tokens only
    h_pvm = W_up r                [B, T, d]
    out   = FFN(x) + lambda * mask * h_pvm   (lambda = 0 at init; mask = 0 at visual positions)

Normalising over visual tokens only makes h_pvm independent of how much text precedes a position.
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
        self.down = nn.Linear(hidden, self.latent, bias=False)
        self.down_v = None if config.shared_down else nn.Linear(hidden, self.latent, bias=False)
        self.up = nn.Linear(self.latent, hidden, bias=False)
        self.gate = nn.Parameter(torch.zeros(1 if config.gate == "scalar" else hidden))
        self.dropout = nn.Dropout(config.dropout)

    def retrieve(self, x: torch.Tensor, visual: torch.Tensor, visual_mask: torch.Tensor) -> torch.Tensor:
        """h_pvm before the gate. x [B, T, d], visual [B, M, d], visual_mask [B, M] bool -> [B, T, d].
        Rows with no visual token get zeros."""
        b, t, _ = x.shape
        m = visual.shape[1]
        h, dh = self.heads, self.latent // self.heads
        q = self.down(x).view(b, t, h, dh).transpose(1, 2)  # [B, h, T, dh]
        kv = (self.down_v or self.down)(visual.to(x.dtype)).view(b, m, h, dh).transpose(1, 2)  # [B, h, M, dh]
        scores = q @ kv.transpose(-1, -2) / dh**0.5  # [B, h, T, M]
        scores = scores.masked_fill(~visual_mask[:, None, None, :], torch.finfo(scores.dtype).min)
        attn = self.dropout(scores.softmax(-1))
        r = (attn @ kv).transpose(1, 2).reshape(b, t, self.latent)  # [B, T, d']
        has_visual = visual_mask.any(-1).to(r.dtype)[:, None, None]  # [B, 1, 1]
        return self.up(r) * has_visual

    def forward(self, x, visual, visual_mask, text_mask) -> torch.Tensor:
        """lambda * mask * h_pvm: [B, T, d]; ``text_mask`` [B, T] is 0 where no output may go."""
        return self.gate * text_mask[..., None].to(x.dtype) * self.retrieve(x, visual, visual_mask)
