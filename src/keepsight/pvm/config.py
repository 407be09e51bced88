"""PVM configuration (SPEC section A). Choices the paper leaves open are fields, documented as ours."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass


def _int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def strided_layers(depth: int) -> list[int]:
    """Our default placement: round(2L/9), round(4L/9), round(6L/9), made distinct (8, 16, 24 at L = 36)."""
    out: list[int] = []
    for k in (2, 4, 6):
        i = min(max(int(k * depth / 9 + 0.5), 0), depth - 1)
        while i in out and i < depth - 1:
            i += 1
        if i not in out:
            out.append(i)
    return out


@dataclass
class PVMConfig:
    layers: str | list[int] = "strided"  # "strided" or explicit 0-based decoder layer indices
    latent_dim: int | None = None  # d'; None = hidden // 4 (the paper: 1024 of 4096)
    heads: int = 1  # d' split into heads for the latent retrieval
    shared_down: bool = True  # one W_down for text queries and visual keys/values (paper); False = separate
    gate: str = "scalar"  # "scalar" | "channel": lambda, initialised to 0 (model starts as the base)
    silence_visual: bool = True  # visual positions receive no PVM output
    dropout: float = 0.0  # on the retrieval weights, training only
    # Our readings of what the paper leaves open (SPEC F); the defaults are the plain formula. None changes the
    # model at initialisation (the gate is 0).
    normalize_v: str = "none"  # "rms": V goes through an RMSNorm (learnable scale, init 1) before W_down
    key_proj: bool = False  # True: a separate key projection W_k V (values stay W_down V)
    temperature: float = 1.0  # retrieval logits / (sqrt(d'_h) * temperature)

    def __post_init__(self) -> None:
        if isinstance(self.layers, str):
            if self.layers != "strided":
                raise ValueError(f"layers must be 'strided' or a list of layer indices, got {self.layers!r}")
        else:
            try:
                self.layers = [_int("layers", i, -(10**6)) for i in self.layers]
            except TypeError:
                raise ValueError(f"layers must be 'strided' or a list of layer indices, got {self.layers!r}") from None
            if not self.layers:
                raise ValueError("layers: the list is empty")
        if self.latent_dim is not None:
            self.latent_dim = _int("latent_dim", self.latent_dim, 1)
        self.heads = _int("heads", self.heads, 1)
        if self.latent_dim is not None and self.latent_dim % self.heads:
            raise ValueError(f"latent_dim {self.latent_dim} must be divisible by heads {self.heads}")
        if self.gate not in ("scalar", "channel"):
            raise ValueError(f"gate must be 'scalar' or 'channel', got {self.gate!r}")
        for name in ("shared_down", "silence_visual"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if (isinstance(self.dropout, bool) or not isinstance(self.dropout, numbers.Real)
                or not math.isfinite(self.dropout) or not 0.0 <= self.dropout < 1.0):
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.normalize_v not in ("none", "rms"):
            raise ValueError(f"normalize_v must be 'none' or 'rms', got {self.normalize_v!r}")
        if not isinstance(self.key_proj, bool):
            raise ValueError(f"key_proj must be true or false, got {self.key_proj!r}")
        if (isinstance(self.temperature, bool) or not isinstance(self.temperature, numbers.Real)
                or not math.isfinite(self.temperature) or not 1e-3 <= self.temperature <= 1e3):
            raise ValueError(f"temperature must be a number in [1e-3, 1e3], got {self.temperature!r}")
        self.temperature = float(self.temperature)

    def resolve_layers(self, depth: int) -> list[int]:
        """Concrete, validated layer indices for a decoder of ``depth`` layers."""
        layers = strided_layers(depth) if self.layers == "strided" else list(self.layers)
        for i in layers:
            if not 0 <= i < depth:
                raise ValueError(f"layers: index {i} out of range for a model with {depth} decoder layers")
        if len(set(layers)) != len(layers):
            raise ValueError(f"layers: indices repeat: {layers}")
        return sorted(layers)

    def resolve_latent(self, hidden: int) -> int:
        """d' for a model of width ``hidden``: at most ``hidden`` (W_down projects down)."""
        d = self.latent_dim if self.latent_dim is not None else max(self.heads, hidden // 4)
        if d > hidden:
            raise ValueError(f"latent_dim {d} exceeds the model width {hidden}; PVM's W_down projects down "
                             f"(d' <= d; the paper: 1024 of 4096)")
        if d % self.heads:
            raise ValueError(f"latent_dim {d} must be divisible by heads {self.heads}")
        return d

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
