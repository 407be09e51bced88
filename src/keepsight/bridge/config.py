"""LIA-MTR bridge configuration and the input checks every bridge shares."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..checks import number


def check_visual_tokens(x: torch.Tensor, d_vision: int, name: str = "x") -> None:
    """Validate visual tokens x [B, N, d_vision]: a float tensor, right width, N >= 1, all finite."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor [B, N, d_vision], got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name} must have shape [B, N, d_vision], got shape {tuple(x.shape)}")
    if x.shape[-1] != d_vision:
        raise ValueError(f"{name}: feature width mismatch, expected d_vision = {d_vision}, got {x.shape[-1]}")
    if x.shape[1] == 0:
        raise ValueError(f"{name}: empty sequence (N = 0 tokens, shape {tuple(x.shape)})")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")


SPACINGS = ("geometric", "half_life")
GATES = ("channel", "token")
MAX_SCALES = 64  # timescales: the paper uses 4; more than this is a mistake, not a setting
MAX_KERNEL = 64  # the causal conv's width over tokens (the paper: short, 4)


@dataclass
class LiaMtrConfig:
    """LIA-MTR projector: d_vision -> d_model through a d_inner-wide multi-scale retention.

    lambdas: explicit decays (each strictly in (0, 1)); otherwise n_scales values between lambda_min and
    lambda_max, spaced by ``lambda_spacing``: "geometric" (log-linear in lambda: half-lives 1.94 / 2.9 / 5.7 /
    138.28 for S = 4) or "half_life" (log-linear in the half-life: 1.94 / 8.05 / 33.4 / 138.28). The paper's
    "log-linearly across [0.70, 0.995]" fixes only the endpoints; both readings fit it (n_scales = 1 takes
    lambda_max: ours, the long memory).
    n_scales: None = 4, or len(lambdas) when lambdas is given.
    conv_kernel: causal depthwise conv width over tokens; 0 = none (identity).
    use_gate: False = write gate fixed at 1. gate: "channel" (one gate per channel of u, ours so far) or
    "token" (one scalar per token: the paper's "token-wise" gate may mean this).
    """

    d_vision: int  # the vision encoder's feature width
    d_model: int  # the language model's width
    d_inner: int | None = None  # the retention's width; None = d_model
    n_scales: int | None = None  # retention timescales; None = 4, or len(lambdas) when lambdas is given
    lambda_min: float = 0.70  # the shortest memory's decay
    lambda_max: float = 0.995  # the longest memory's decay
    lambdas: tuple[float, ...] | None = None  # explicit decays, each in (0, 1) (instead of min / max / spacing)
    conv_kernel: int = 4  # causal depthwise conv width over tokens; 0 = none
    chunk_size: int = 64  # tokens per chunk of the chunked scan (speed only, not the result)
    use_gate: bool = True  # False: the write gate is fixed at 1
    lambda_spacing: str = "geometric"  # "geometric" (log-linear in lambda) | "half_life" (log-linear in half-life)
    gate: str = "channel"  # "channel" (one gate per channel) | "token" (one scalar per token)

    def __post_init__(self) -> None:
        for field in ("d_vision", "d_model"):
            setattr(self, field, number(field, getattr(self, field), 1, integer=True))
        if self.d_inner is None:
            self.d_inner = self.d_model
        self.d_inner = number("d_inner", self.d_inner, 1, integer=True)
        if self.lambdas is not None:
            try:
                self.lambdas = tuple(float(v) for v in self.lambdas)
            except (TypeError, ValueError) as err:
                raise ValueError(f"lambdas must be a sequence of floats, got {self.lambdas!r}") from err
            if not self.lambdas:
                raise ValueError("lambdas: the list is empty")
            bad = [v for v in self.lambdas if not (math.isfinite(v) and 0.0 < v < 1.0)]
            if bad:
                raise ValueError(f"lambdas must each lie strictly in (0, 1), got {list(self.lambdas)} (bad: {bad})")
            if self.n_scales is None:
                self.n_scales = len(self.lambdas)
            elif self.n_scales != len(self.lambdas):
                raise ValueError(f"n_scales = {self.n_scales} but lambdas has {len(self.lambdas)} entries")
        if self.n_scales is None:
            self.n_scales = 4
        self.n_scales = number("n_scales", self.n_scales, 1, MAX_SCALES, integer=True)
        for field in ("lambda_min", "lambda_max"):
            number(field, getattr(self, field), 0.0, 1.0, open_low=True, open_high=True)
        if self.lambda_min > self.lambda_max:
            raise ValueError(f"lambda_min ({self.lambda_min}) must be <= lambda_max ({self.lambda_max})")
        self.conv_kernel = number("conv_kernel", self.conv_kernel, 0, MAX_KERNEL, integer=True)
        self.chunk_size = number("chunk_size", self.chunk_size, 1, integer=True)
        if not isinstance(self.use_gate, bool):
            raise ValueError(f"use_gate must be a bool, got {self.use_gate!r}")
        if self.lambda_spacing not in SPACINGS:
            raise ValueError(f"lambda_spacing must be one of {SPACINGS}, got {self.lambda_spacing!r}")
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {self.gate!r}")

    def lambda_values(self) -> tuple[float, ...]:
        """The S decays: explicit ones, else ``lambda_spacing`` spacing in [lambda_min, lambda_max]."""
        if self.lambdas is not None:
            return tuple(self.lambdas)
        S = self.n_scales
        if S == 1:
            return (float(self.lambda_max),)
        if self.lambda_spacing == "geometric":
            lo, hi = math.log(self.lambda_min), math.log(self.lambda_max)
            return tuple(math.exp(lo + (hi - lo) * s / (S - 1)) for s in range(S))
        lo, hi = (math.log(math.log(0.5) / math.log(v)) for v in (self.lambda_min, self.lambda_max))  # log half-lives
        return tuple(0.5 ** (1.0 / math.exp(lo + (hi - lo) * s / (S - 1))) for s in range(S))

    def half_lives(self) -> list[float]:
        """Half-life of each scale in tokens: ln(0.5) / ln(lambda_s)."""
        return [math.log(0.5) / math.log(v) for v in self.lambda_values()]
