"""LogitLens: read every decoder layer's hidden state through the final norm and lm_head.

Per layer l and step: KL(final || layer l), the rank of the final top-1 token in layer l's
distribution (0 = layer l also ranks it first), top-1 agreement, and the convergence layer: the first
layer whose top-1 equals the final top-1 for it and every later layer. Transformers' last hidden state
already has the final norm applied, so it is used as is; the others get the norm first.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.arch import arch_info


class LogitLens:
    def __init__(self, model: nn.Module):
        self.model = model
        self.info = arch_info(model)

    @torch.no_grad()
    def from_hidden_states(self, hidden_states, position: int = -1) -> dict[str, torch.Tensor]:
        """``hidden_states``: transformers' tuple of L + 1 tensors [B, T, d] (embeddings first).

        Returns kl [L, B], rank [L, B], top1_agree [L, B] (bool), convergence_layer [B] (0-based).
        """
        n = len(self.info.layers)
        if len(hidden_states) != n + 1:
            raise ValueError(f"expected {n + 1} hidden states (embeddings + {n} layers), got {len(hidden_states)}")
        hs = [h[:, position] for h in hidden_states[1:]]  # L x [B, d]
        normed = [self.info.final_norm(h) for h in hs[:-1]] + [hs[-1]]
        logp = torch.stack([self.info.lm_head(h).float() for h in normed]).log_softmax(-1)  # [L, B, V]
        final = logp[-1]  # [B, V]
        kl = (final.exp() * (final - logp)).sum(-1).clamp_min(0.0)  # [L, B]
        top = final.argmax(-1)  # [B]
        top_logp = logp.gather(-1, top[None, :, None].expand(n, -1, 1))  # [L, B, 1]
        rank = (logp > top_logp).sum(-1)  # [L, B]
        agree = logp.argmax(-1) == top[None]  # [L, B]
        # agrees from layer l on: reverse cumulative AND
        from_here = agree.flip(0).long().cumprod(0).flip(0).bool()  # [L, B]
        convergence = n - from_here.long().sum(0)  # [B]
        return {"kl": kl, "rank": rank, "top1_agree": agree, "convergence_layer": convergence}

    def steps(self, hidden_states) -> list[dict]:
        """The lens at the last position of every step of a generation: ``hidden_states`` is transformers' generate
        output's (one tuple of L + 1 tensors per step, prefill first; ``Pipeline.generate_ids(...,
        output_hidden_states=True, return_dict_in_generate=True)``). One dict (as ``from_hidden_states``) per step."""
        return [self.from_hidden_states(h) for h in hidden_states]
