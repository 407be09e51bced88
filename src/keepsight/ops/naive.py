"""For-loop reference of the multi-scale retention scan. For tests only: O(N) Python steps."""

from __future__ import annotations

import torch

from keepsight.ops.retention import _check_inputs


def naive_multiscale_retention(
    u: torch.Tensor,
    alpha: torch.Tensor,
    lambdas: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference scan, one token at a time, in fp32 (fp64 for fp64 inputs).

    u [B, N, d], alpha [B, N, S], lambdas [S], initial_state [B, S, d] (zeros if None).
    M_t[s] = lambdas[s] * M_{t-1}[s] + u_t and m_t = sum_s alpha_t[s] * M_t[s].
    Returns (m [B, N, d] in u's dtype, final_state [B, S, d] fp32 or fp64).
    """
    lam, state = _check_inputs(u, alpha, lambdas, initial_state)
    uf, af = u.to(lam.dtype), alpha.to(lam.dtype)
    lam_col = lam[:, None]  # [S, 1]
    outs = []
    for t in range(u.shape[1]):
        state = lam_col * state + uf[:, t, None, :]  # [B, S, d]
        outs.append((af[:, t, :, None] * state).sum(dim=1))  # [B, d]
    return torch.stack(outs, dim=1).to(u.dtype), state
