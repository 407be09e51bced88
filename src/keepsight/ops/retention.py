"""Multi-scale retention scan, chunked: O(N) time and memory.

For u [B, N, d], mixing weights alpha [B, N, S] and fixed decays lambdas [S]:

    M_{t,s} = lambda_s * M_{t-1,s} + u_t          (state [B, S, d]; M_0 = initial_state or 0)
    m_t     = sum_s alpha_{t,s} * M_{t,s}          (output [B, N, d])

The sequence is cut into chunks of C tokens. Inside a chunk the scan is a masked decay matrix
D_s[i, j] = lambda_s^(i - j) (i >= j, else 0); the S scales are folded into one [C, C] weight matrix
per token before it touches u, so no [.., S, d] tensor is formed per token. Between chunks only the
[B, S, d] state is carried (one small Python step per chunk). Decay powers are built as
exp(log(lambda) * k) with k in [0, C], never as lambda^-t, so nothing overflows.
Accumulation is fp32 for fp32/bf16/fp16 inputs (fp64 for fp64 inputs); the output comes back in u's dtype,
the state in the accumulation dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..checks import number


def check_lambdas(lambdas: torch.Tensor | Sequence[float], *, allow_one: bool = True,
                  device: torch.device | None = None) -> torch.Tensor:
    """Validate decays and return them as a 1-D tensor [S] (fp64 if given in fp64, else fp32).
    Each must lie in (0, 1] ((0, 1) if not allow_one)."""
    lam = torch.as_tensor(lambdas, device=device)
    if lam.dtype != torch.float64:
        lam = lam.to(torch.float32)
    if lam.dim() != 1 or lam.numel() == 0:
        raise ValueError(f"lambdas must be a non-empty 1-D tensor [S], got shape {tuple(lam.shape)}")
    upper_ok = (lam <= 1.0) if allow_one else (lam < 1.0)
    if not bool((torch.isfinite(lam) & (lam > 0.0) & upper_ok).all()):
        interval = "(0, 1]" if allow_one else "(0, 1)"
        raise ValueError(f"lambdas must each lie in {interval}, got {lam.tolist()}")
    return lam


def _acc_dtype(u: torch.Tensor) -> torch.dtype:
    """fp32 accumulation, fp64 for fp64 inputs."""
    return torch.float64 if u.dtype == torch.float64 else torch.float32


def _check_inputs(u: torch.Tensor, alpha: torch.Tensor, lambdas: torch.Tensor | Sequence[float],
                  initial_state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared validation. Returns (lambdas [S], initial state [B, S, d]), both in the accumulation dtype."""
    if not isinstance(u, torch.Tensor) or u.dim() != 3:
        raise ValueError(f"u must be a tensor [B, N, d], got shape {tuple(getattr(u, 'shape', ()))}")
    if not isinstance(alpha, torch.Tensor) or alpha.dim() != 3:
        raise ValueError(f"alpha must be a tensor [B, N, S], got shape {tuple(getattr(alpha, 'shape', ()))}")
    B, N, d = u.shape
    if N == 0:
        raise ValueError(f"empty sequence: u has N = 0 tokens (shape {tuple(u.shape)})")
    if alpha.shape[:2] != u.shape[:2]:
        raise ValueError(f"alpha shape {tuple(alpha.shape)} does not match u shape {tuple(u.shape)} in [B, N]")
    if not u.is_floating_point():
        raise ValueError(f"u must be a floating-point tensor, got dtype {u.dtype}")
    acc = _acc_dtype(u)
    lam = check_lambdas(lambdas, device=u.device).to(acc)
    S = alpha.shape[2]
    if lam.numel() != S:
        raise ValueError(f"lambdas has {lam.numel()} scales but alpha shape {tuple(alpha.shape)} has S = {S}")
    if initial_state is None:
        state = u.new_zeros((B, S, d), dtype=acc)
    else:
        if tuple(initial_state.shape) != (B, S, d):
            raise ValueError(
                f"initial_state shape {tuple(initial_state.shape)} does not match expected [B, S, d] = {(B, S, d)}"
            )
        state = initial_state.to(acc)
    return lam, state


def _decay_powers(log_lam: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """lambda_s^k for k >= 0: [S] x [...] -> [S, ...]."""
    return torch.exp(log_lam.view(-1, *([1] * exponents.dim())) * exponents.clamp(min=0))


def multiscale_retention(
    u: torch.Tensor,
    alpha: torch.Tensor,
    lambdas: torch.Tensor | Sequence[float],
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
    return_final_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Chunked multi-scale retention scan.

    Args:
        u: writes [B, N, d] (any float dtype).
        alpha: per-token scale weights [B, N, S].
        lambdas: decays [S], each in (0, 1].
        initial_state: [B, S, d] state before token 1 (zeros if None).
        chunk_size: tokens per chunk C (>= 1); shorter sequences use one chunk of N.
        return_final_state: also return the state after token N.

    Returns:
        m [B, N, d] in u's dtype, or (m, final_state [B, S, d] fp32; fp64 for fp64 u).
    Differentiable w.r.t. u, alpha and initial_state.
    """
    lam, state = _check_inputs(u, alpha, lambdas, initial_state)
    chunk_size = number("chunk_size", chunk_size, 1, integer=True)
    B, N, d = u.shape
    S = lam.numel()
    C = min(chunk_size, N)
    n_chunks = -(-N // C)
    pad = n_chunks * C - N
    last_len = C - pad  # tokens in the last chunk

    acc = lam.dtype
    uf, af = u.to(acc), alpha.to(acc)
    if pad:  # zero writes and zero weights in the padding: padded outputs are 0 and are cut off below
        uf = F.pad(uf, (0, 0, 0, pad))
        af = F.pad(af, (0, 0, 0, pad))
    uc = uf.reshape(B, n_chunks, C, d)  # [B, n, C, d]
    ac = af.reshape(B, n_chunks, C, S)  # [B, n, C, S]

    log_lam = torch.log(lam)  # [S]
    pos = torch.arange(C, device=u.device, dtype=acc)  # [C]
    diff = pos[:, None] - pos[None, :]  # [C, C], i - j
    decay = _decay_powers(log_lam, diff) * (diff >= 0).to(acc)  # [S, C, C], lambda^(i-j) masked causal

    # Intra-chunk: fold scales into the token weights first, W[b,n,i,j] = sum_s alpha[b,n,i,s] D_s[i,j].
    weights = torch.einsum("bnis,sij->bnij", ac, decay)  # [B, n, C, C]
    m = weights @ uc  # [B, n, C, d]

    if n_chunks > 1 or return_final_state or initial_state is not None:
        # State entering each chunk. Chunk-local end sums: sum_j lambda^(C-1-j) u_j -> [B, n, S, d].
        to_end = _decay_powers(log_lam, (C - 1) - pos)  # [S, C]
        chunk_decay = torch.exp(log_lam * C)[:, None]  # [S, 1], lambda^C
        prevs = [state]
        if n_chunks > 1:
            ends = torch.einsum("sj,bnjd->bnsd", to_end, uc[:, :-1])  # [B, n-1, S, d]
            for end in ends.unbind(dim=1):  # unbind, not ends[:, c]: one backward stack, not n zero-filled grads
                state = chunk_decay * state + end  # [B, S, d]
                prevs.append(state)
        starts = torch.stack(prevs, dim=1)  # [B, n, S, d]
        # Carried contribution: sum_s alpha[b,n,i,s] lambda_s^(i+1) M_prev[b,n,s,:].
        carry = ac * _decay_powers(log_lam, pos + 1).T  # [B, n, C, S]
        m = m + carry @ starts  # [B, n, C, S] @ [B, n, S, d] -> [B, n, C, d]
        if return_final_state:
            tail = pos[:last_len]  # [L]
            to_last = _decay_powers(log_lam, (last_len - 1) - tail)  # [S, L]
            last_sum = torch.einsum("sj,bjd->bsd", to_last, uc[:, -1, :last_len])  # [B, S, d]
            state = torch.exp(log_lam * last_len)[:, None] * starts[:, -1] + last_sum  # [B, S, d]

    out = m.reshape(B, n_chunks * C, d)[:, :N].to(u.dtype)  # [B, N, d]
    if return_final_state:
        return out, state
    return out


def retention_step(
    u_t: torch.Tensor,
    alpha_t: torch.Tensor,
    lambdas: torch.Tensor | Sequence[float],
    state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One recurrent step. u_t [B, d], alpha_t [B, S], state [B, S, d] (zeros if None).

    Returns (m_t [B, d] in u_t's dtype, new_state [B, S, d] fp32; fp64 for fp64 u_t).
    """
    if not isinstance(u_t, torch.Tensor) or u_t.dim() != 2:
        raise ValueError(f"u_t must be a tensor [B, d], got shape {tuple(getattr(u_t, 'shape', ()))}")
    if not isinstance(alpha_t, torch.Tensor) or alpha_t.dim() != 2:
        raise ValueError(f"alpha_t must be a tensor [B, S], got shape {tuple(getattr(alpha_t, 'shape', ()))}")
    lam, state = _check_inputs(u_t[:, None], alpha_t[:, None], lambdas, state)
    new_state = lam[:, None] * state + u_t.to(lam.dtype)[:, None, :]  # [B, S, d]
    m_t = torch.einsum("bs,bsd->bd", alpha_t.to(lam.dtype), new_state)  # [B, d]
    return m_t.to(u_t.dtype), new_state
