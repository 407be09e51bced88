"""LIA-MTR bridge: a gated, multi-scale linear-retention projector, vision encoder -> LLM.

For visual tokens x_1..x_N (each [d_vision]):
    q_t = W_q x_t,  k_t = phi(W_k x_t) (phi = ELU + 1),  v_t = W_v x_t          (width d_inner)
    x^conv = causal depthwise conv of x over tokens (kernel K; K = 0: identity)
    g_t = sigmoid(W_g x^conv_t) (1 if use_gate is False; [d_inner], or one scalar per token with gate="token"),
    alpha_t = softmax(W_mix x^conv_t) over S scales
    M_{t,s} = lambda_s M_{t-1,s} + g_t * k_t * v_t,   m_t = sum_s alpha_{t,s} M_{t,s}
    y_t = W_o (q_t * m_t)                                                       ([d_model])
The decays lambda_s are fixed buffers. Streaming: the state is the conv cache plus the retention state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from keepsight.bridge.config import LiaMtrConfig, check_visual_tokens
from keepsight.ops import check_lambdas, multiscale_retention, retention_step


@dataclass
class LiaMtrState:
    """Streaming state of a LiaMtrBridge.

    conv: the last K-1 input tokens [B, K-1, d_vision] (input dtype; [B, 0, d_vision] without conv).
    retention: the multi-scale memory [B, S, d_inner] (fp32).
    """

    conv: torch.Tensor
    retention: torch.Tensor


class LiaMtrBridge(nn.Module):
    """x [B, N, d_vision] -> y [B, N, d_model]; see the module docstring for the equations."""

    def __init__(self, config: LiaMtrConfig, *, _lambdas: Sequence[float] | None = None) -> None:
        # _lambdas: private override of the decays, allowing lambda = 1 (tests of the linear-attention limit only).
        super().__init__()
        if not isinstance(config, LiaMtrConfig):
            raise ValueError(f"config must be a LiaMtrConfig, got {type(config).__name__}")
        self.config = config
        dv, di, dm, S = config.d_vision, config.d_inner, config.d_model, config.n_scales
        lam = config.lambda_values() if _lambdas is None else tuple(float(v) for v in _lambdas)
        check_lambdas(lam, allow_one=True, device="cpu")  # on the CPU: also valid under a meta-device init
        if len(lam) != S:
            raise ValueError(f"_lambdas has {len(lam)} entries but config.n_scales = {S}")
        # The decays are fixed constants kept as Python floats (not a buffer): nothing to save or load, and
        # nothing for a meta-device init (transformers' from_pretrained) or a dtype cast to corrupt.
        self._lambda_list = lam

        self.qkv = nn.Linear(dv, 3 * di)  # W_q, W_k, W_v stacked
        self.kernel = config.conv_kernel
        self.conv = nn.Conv1d(dv, dv, self.kernel, groups=dv) if self.kernel > 0 else None  # depthwise
        self.gate = nn.Linear(dv, di if config.gate == "channel" else 1) if config.use_gate else None  # g [.., di | 1]
        self.mix = nn.Linear(dv, S)
        self.out = nn.Linear(di, dm)
        nn.init.zeros_(self.mix.bias)  # scales start equally weighted (on average)
        if self.gate is not None:
            nn.init.zeros_(self.gate.bias)  # write gate starts near 0.5

    # ---- helpers -------------------------------------------------------------------------------------------

    def _lam(self, device=None) -> torch.Tensor:
        """Decays in fp32 [S] on ``device`` (default: where the weights are)."""
        device = device if device is not None else self.out.weight.device
        return torch.tensor(self._lambda_list, dtype=torch.float32, device=device)

    @property
    def lambdas(self) -> torch.Tensor:
        return self._lam()

    @property
    def cache_len(self) -> int:
        return max(self.kernel - 1, 0)

    def init_state(self, batch: int, device=None, dtype: torch.dtype = torch.float32) -> LiaMtrState:
        """Zero state for a fresh stream of ``batch`` sequences."""
        cfg = self.config
        device = device if device is not None else self.out.weight.device
        return LiaMtrState(
            conv=torch.zeros(batch, self.cache_len, cfg.d_vision, device=device, dtype=dtype),
            retention=torch.zeros(batch, cfg.n_scales, cfg.d_inner, device=device, dtype=torch.float32),
        )

    def _check_state(self, state: LiaMtrState, batch: int) -> None:
        if not isinstance(state, LiaMtrState):
            raise ValueError(f"state must be a LiaMtrState, got {type(state).__name__}")
        cfg = self.config
        want_conv = (batch, self.cache_len, cfg.d_vision)
        want_ret = (batch, cfg.n_scales, cfg.d_inner)
        if tuple(state.conv.shape) != want_conv:
            raise ValueError(f"state.conv shape {tuple(state.conv.shape)} does not match expected {want_conv}")
        if tuple(state.retention.shape) != want_ret:
            raise ValueError(f"state.retention shape {tuple(state.retention.shape)} does not match expected {want_ret}")

    def _convolve(self, x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal depthwise conv. x [B, N, dv], cache [B, K-1, dv] -> (x_conv [B, N, dv], new cache [B, K-1, dv])."""
        if self.conv is None:
            return x, cache
        full = torch.cat([cache.to(x.dtype), x], dim=1)  # [B, K-1+N, dv]
        x_conv = self.conv(full.transpose(1, 2)).transpose(1, 2)  # [B, N, dv]
        new_cache = full[:, full.shape[1] - self.cache_len:]  # [B, K-1, dv]
        return x_conv, new_cache

    def _features(self, x: torch.Tensor, x_conv: torch.Tensor):
        """x, x_conv [..., dv] -> q [..., di], u = g*k*v [..., di], alpha [..., S], g [..., di] (or None)."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each [..., di]
        k = F.elu(k) + 1.0
        g = torch.sigmoid(self.gate(x_conv)) if self.gate is not None else None
        u = k * v if g is None else g * k * v
        alpha = torch.softmax(self.mix(x_conv).float(), dim=-1)  # [..., S] fp32
        return q, u, alpha, g

    # ---- public API ----------------------------------------------------------------------------------------

    block_size = 16384  # longer inputs run block by block, carrying the state (bounds activation memory)

    def forward(self, x: torch.Tensor, state: LiaMtrState | None = None, return_state: bool = False):
        """x [B, N, d_vision] -> y [B, N, d_model], or (y, new state) when return_state.

        Passing the state returned by an earlier call continues that stream. Inputs longer than
        ``block_size`` tokens are processed in blocks with the state carried between them, so activation
        memory stays O(block_size) beside the input and output.
        """
        check_visual_tokens(x, self.config.d_vision)
        B, N = x.shape[:2]
        if state is None:
            state = self.init_state(B, device=x.device, dtype=x.dtype)
        else:
            self._check_state(state, B)
        if N <= self.block_size:
            y, state = self._forward_block(x, state)
        else:
            y = x.new_empty(B, N, self.config.d_model)  # [B, N, dm], filled block by block
            for start in range(0, N, self.block_size):
                blk, state = self._forward_block(x[:, start:start + self.block_size], state)
                y[:, start:start + blk.shape[1]] = blk
        if not bool(torch.isfinite(y).all()):
            raise ValueError(f"the LIA-MTR output is not finite: inputs as large as {float(x.abs().max()):.3g} overflow "
                             f"{y.dtype}; normalise the vision features")
        return (y, state) if return_state else y

    def _forward_block(self, x: torch.Tensor, state: LiaMtrState) -> tuple[torch.Tensor, LiaMtrState]:
        x_conv, conv_cache = self._convolve(x, state.conv)  # [B, n, dv], [B, K-1, dv]
        q, u, alpha, _ = self._features(x, x_conv)
        m, ret = multiscale_retention(
            u, alpha, self._lam(x.device), initial_state=state.retention,
            chunk_size=self.config.chunk_size, return_final_state=True,
        )  # m [B, n, di], ret [B, S, di]
        return self.out(q * m), LiaMtrState(conv=conv_cache, retention=ret)  # [B, n, dm]

    def step(self, x_t: torch.Tensor, state: LiaMtrState | None = None) -> tuple[torch.Tensor, LiaMtrState]:
        """One token: x_t [B, d_vision] -> (y_t [B, d_model], new state)."""
        if not isinstance(x_t, torch.Tensor) or x_t.dim() != 2:
            raise ValueError(f"x_t must be a tensor [B, d_vision], got shape {tuple(getattr(x_t, 'shape', ()))}")
        check_visual_tokens(x_t[:, None], self.config.d_vision, name="x_t")
        B = x_t.shape[0]
        if state is None:
            state = self.init_state(B, device=x_t.device, dtype=x_t.dtype)
        else:
            self._check_state(state, B)
        if self.conv is None:
            x_conv, cache = x_t, state.conv
        else:
            window = torch.cat([state.conv.to(x_t.dtype), x_t[:, None]], dim=1)  # [B, K, dv]
            # Conv1d is a cross-correlation: out = sum_k w[c, 0, k] * window[k, c] + bias.
            x_conv = torch.einsum("bkc,ck->bc", window, self.conv.weight[:, 0, :]) + self.conv.bias  # [B, dv]
            cache = window[:, 1:]  # [B, K-1, dv]
        q, u, alpha, _ = self._features(x_t, x_conv)  # [B, di], [B, di], [B, S]
        m, ret = retention_step(u, alpha, self._lam(x_t.device), state.retention)  # [B, di], [B, S, di]
        return self.out(q * m), LiaMtrState(conv=cache, retention=ret)

    def half_lives(self) -> list[float]:
        """ln(0.5) / ln(lambda_s) per scale (inf for lambda = 1)."""
        return [math.log(0.5) / math.log(v) if v < 1.0 else math.inf for v in self._lambda_list]

    @torch.no_grad()
    def probe(self, x: torch.Tensor) -> dict:
        """Diagnostics on x [B, N, d_vision]: write-gate mean/std over all tokens and channels,
        mean scale weights [S], decays and half-lives."""
        check_visual_tokens(x, self.config.d_vision)
        x_conv, _ = self._convolve(x, self.init_state(x.shape[0], device=x.device, dtype=x.dtype).conv)
        _, u, alpha, g = self._features(x, x_conv)
        g = torch.ones_like(u) if g is None else g
        g = g.float()
        return {
            "gate_mean": g.mean().item(),
            "gate_std": g.std(correction=0).item(),
            "scale_weights": alpha.reshape(-1, alpha.shape[-1]).mean(0).tolist(),
            "write_max_abs": u.float().abs().max().item(),
            "lambdas": list(self._lambda_list),
            "half_lives": self.half_lives(),
        }
