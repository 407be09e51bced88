"""Rotary position embedding pieces in plain torch: frequency schedules and per-pair gains for
Monotonic RoPE Scaling (arXiv 2605.14530), and a reference RoPE for tests.

Layout is transformers' ``rotate_half``: a head vector of size D holds rotary pair i in dims
``(i, i + D/2)``, i = 0..D/2-1, with inverse frequency ``inv_freq_i = theta ** (-2i / D)`` - pair 0 is
the highest frequency. ``tau_i = i / (D/2 - 1)`` runs from 0 (highest) to 1 (lowest frequency).

Schedules ``s(tau)`` map [0, 1] onto [0, 1], monotone increasing, ``s(0) = 0`` and ``s(1) = 1``:
sigmoid ``(sig(eta (tau - tau0)) - sig(-eta tau0)) / (sig(eta (1 - tau0)) - sig(-eta tau0))``,
cosine ``(1 - cos(pi tau)) / 2``, exponential ``(exp(eta tau) - 1) / (exp(eta) - 1)``, linear ``tau``,
power ``tau ** eta``. The gain of pair i is ``g_i = 1 + beta * s(tau_i)`` (our readings, the amplitude and frequency
modes). The released MRS (``angle_scales``) multiplies the angles by ``1 + beta * y(tau_i)`` with the release's own
ramps (``released_ramp``).
"""

from __future__ import annotations

import math

import torch

SCHEDULES = ("sigmoid", "cosine", "exponential", "linear", "power")


def frequency_positions(half: int) -> torch.Tensor:
    """``tau [half]``: 0 for the highest-frequency pair, 1 for the lowest."""
    if half < 2:
        raise ValueError(f"need at least 2 rotary pairs (head_dim >= 4), got {half}")
    return torch.arange(half, dtype=torch.float64) / (half - 1)


def schedule(tau: torch.Tensor, kind: str = "sigmoid", eta: float = 8.0, tau0: float = 0.6) -> torch.Tensor:
    """``s(tau)`` in [0, 1], monotone increasing, s(0) = 0, s(1) = 1 (see the module docstring)."""
    tau = tau.to(torch.float64)
    if kind == "sigmoid":
        if eta <= 0:
            raise ValueError(f"sigmoid schedule needs eta > 0, got {eta}")
        lo, hi = 1 / (1 + math.exp(eta * tau0)), 1 / (1 + math.exp(-eta * (1 - tau0)))  # s at tau = 0, 1
        s = (torch.sigmoid(eta * (tau - tau0)) - lo) / (hi - lo)
    elif kind == "cosine":
        s = (1 - torch.cos(math.pi * tau)) / 2
    elif kind == "exponential":
        if eta == 0:
            s = tau.clone()  # the eta -> 0 limit
        else:
            s = torch.expm1(eta * tau) / math.expm1(eta)
    elif kind == "linear":
        s = tau.clone()
    elif kind == "power":
        if eta <= 0:
            raise ValueError(f"power schedule needs eta > 0, got {eta}")
        s = tau**eta
    else:
        raise ValueError(f"unknown schedule {kind!r}; choose from {SCHEDULES}")
    return s.clamp(0.0, 1.0)


def rope_gains(head_dim: int, beta: float, eta: float = 8.0, tau0: float = 0.6,
               schedule_kind: str = "sigmoid") -> torch.Tensor:
    """Per-pair gains ``g [head_dim / 2]`` (float64), ``g_i = 1 + beta * s(tau_i)``; all ones at beta = 0."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    s = schedule(frequency_positions(head_dim // 2), schedule_kind, eta, tau0)
    return 1.0 + beta * s


def released_ramp(tau: torch.Tensor, kind: str = "sigmoid", eta: float = 8.0, tau0: float = 0.6) -> torch.Tensor:
    """The ramp ``y(tau)`` of the released MRS code (MPD-PAC's ``make_monotonic_freq_mask``): linear ``tau``, power
    ``tau ** 2``, exponential ``(exp(4 tau) - 1) / (exp(4) - 1)``, sigmoid ``sig(eta (tau - tau0))`` (not rescaled:
    y(0) > 0), cosine ``(1 - cos(pi tau)) / 2``. ``eta`` and ``tau0`` shape the sigmoid only."""
    tau = tau.to(torch.float64)
    if kind == "sigmoid":
        return torch.sigmoid(eta * (tau - tau0))
    if kind == "cosine":
        return (1 - torch.cos(math.pi * tau)) / 2
    if kind == "exponential":
        return torch.expm1(4.0 * tau) / math.expm1(4.0)
    if kind == "linear":
        return tau.clone()
    if kind == "power":
        return tau**2
    raise ValueError(f"unknown schedule {kind!r}; choose from {SCHEDULES}")


def angle_scales(head_dim: int, beta: float, eta: float = 8.0, tau0: float = 0.6,
                 schedule_kind: str = "sigmoid") -> torch.Tensor:
    """The released MRS: per-pair scales ``s [head_dim / 2]`` (float64) of the RoPE angles,
    ``s_i = 1 + beta * y(tau_i)`` (``released_ramp``); all ones at beta = 0. The released code's ``rope`` argument is
    ``10 * beta`` (it writes ``1 + 0.1 * rope * y``): the paper's beta = 0.01 is its rope = 0.1."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    return 1.0 + beta * released_ramp(frequency_positions(head_dim // 2), schedule_kind, eta, tau0)


def pair_to_dims(pair_values: torch.Tensor) -> torch.Tensor:
    """``[..., D/2]`` per-pair values -> ``[..., D]`` per-dim values (pair i fills dims i and i + D/2)."""
    return torch.cat([pair_values, pair_values], dim=-1)


def scale_rotary(cos: torch.Tensor, sin: torch.Tensor, gains: torch.Tensor,
                 where: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Amplitude scaling: multiply cos/sin ``[B, T, D]`` of pair i by ``sqrt(g_i)``.

    Rotated q and k are linear in (cos, sin), so each is scaled by sqrt(g_i) per pair and the q.k
    logit contribution of pair i by g_i. ``where [B, T]`` (bool) limits the scaling to those tokens
    (others keep factor 1); cos/sin are broadcast to ``[B, T, D]`` then.
    """
    work = torch.promote_types(cos.dtype, torch.float32)  # at least float32 for the product
    factor = pair_to_dims(gains.sqrt()).to(device=cos.device, dtype=work)  # [D]
    if where is not None:
        factor = torch.where(where[..., None].to(cos.device), factor, torch.ones_like(factor))  # [B, T, D]
    return (cos.to(work) * factor).to(cos.dtype), (sin.to(work) * factor).to(sin.dtype)


def scaled_inv_freq(inv_freq: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """Frequency mode: ``inv_freq_i / g_i`` (pair i rotates g_i times slower)."""
    return (inv_freq.double() / gains.to(inv_freq.device)).to(inv_freq.dtype)


def angle_scaled_inv_freq(inv_freq: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The released MRS as an inverse frequency: ``inv_freq_i * s_i`` (the angle ``position * inv_freq_i`` times
    ``s_i``, for every position; pair i rotates s_i times faster)."""
    return (inv_freq.double() * scales.to(inv_freq.device)).to(inv_freq.dtype)


# ----------------------------------------------------------------------------- reference RoPE


def default_inv_freq(head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """``inv_freq [D/2]`` of standard RoPE."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``positions [B, T]`` -> cos, sin ``[B, T, D]`` (rotate_half layout)."""
    freqs = positions[..., None].float() * inv_freq.float()  # [B, T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [B, T, D]
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [B, H, T, D]`` rotated with cos/sin ``[B, T, D]``."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def pair_contributions(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per-pair parts of the logit q.k: ``q [..., Tq, D]``, ``k [..., Tk, D]`` -> ``[..., Tq, Tk, D/2]``;
    summing the last axis gives ``q @ k^T``."""
    half = q.shape[-1] // 2
    prod = q[..., :, None, :] * k[..., None, :, :]  # [..., Tq, Tk, D]
    return prod[..., :half] + prod[..., half:]
