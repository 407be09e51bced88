"""PVM configuration: the released block (default) and our earlier reading of the paper, as named variants."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..checks import layer_indices, number


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


VARIANTS = ("released", "branch")
RELEASED_HIDDEN = 512  # the released pvm_hidden_size
RELEASED_LAYERS = {"Qwen3-VL-8B": [8, 16, 24], "Qwen3-VL-4B": [5, 11, 17]}  # the released pvm_layers
# fields that only one variant reads, with their defaults (set to anything else on the other variant: an error)
_BRANCH_ONLY = {"heads": 1, "shared_down": True, "gate": "scalar", "normalize_v": "none", "key_proj": False,
                "temperature": 1.0}
_RELEASED_ONLY = {"expander_init": "backbone", "output_norm": True}


@dataclass
class PVMConfig:
    """PVM's settings. ``variant="released"`` (default) is the block the authors released (``keepsight.pvm.block``);
    ``variant="branch"`` is our earlier reading of the paper (``keepsight.pvm.module``: a shared W_down retrieval
    added to the FFN's normed input), kept with its options."""

    variant: str = "released"  # "released" | "branch"
    layers: str | list[int] = "strided"  # "strided" (round(2L/9), round(4L/9), round(6L/9)) or 0-based indices
    # the latent width p; None: 512 as released (released variant; at most width / 4, a multiple of head_dim, on a
    # narrower model) or width / 4 (branch variant)
    pvm_hidden_size: int | None = None
    silence_visual: bool = True  # visual query positions receive no PVM output (both variants)
    dropout: float = 0.0  # on the retrieval weights, training only
    cache_visual: bool = True  # project the visual memory once per sequence; False: every step (as released)
    master_dtype: str = "float32"  # the PVM parameters' dtype ("float32": fp32 master weights; "model": the backbone's)
    # released variant
    expander_init: str = "backbone"  # "backbone": normal(initializer_range), gate 0 (identity, trainable);
    #                                  "zero": the released file's zero expander (identity, but no gradient at all)
    output_norm: bool = True  # the released affine-free RMSNorm on the expander's output; False: an ablation (the
    #                           update's size then follows the retrieval, not only the gate; not in the release)
    # branch variant (our reading of what the paper leaves open)
    heads: int = 1  # d' split into heads for the latent retrieval
    shared_down: bool = True  # one W_down for text queries and visual keys/values (paper); False = separate
    gate: str = "scalar"  # "scalar" | "channel": lambda, initialised to 0 (model starts as the base)
    normalize_v: str = "none"  # "rms": V goes through an RMSNorm (learnable scale, init 1) before W_down
    key_proj: bool = False  # True: a separate key projection W_k V (values stay W_down V)
    temperature: float = 1.0  # retrieval logits / (sqrt(d'_h) * temperature)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if isinstance(self.layers, str):
            if self.layers != "strided":
                raise ValueError(f"layers must be 'strided' or a list of layer indices, got {self.layers!r}")
        else:
            try:
                self.layers = [number("layers", i, integer=True) for i in self.layers]
            except TypeError:
                raise ValueError(f"layers must be 'strided' or a list of layer indices, got {self.layers!r}") from None
            if not self.layers:
                raise ValueError("layers: the list is empty")
        if self.pvm_hidden_size is not None:
            self.pvm_hidden_size = number("pvm_hidden_size", self.pvm_hidden_size, 1, integer=True)
        self.heads = number("heads", self.heads, 1, integer=True)
        if self.pvm_hidden_size is not None and self.pvm_hidden_size % self.heads:
            raise ValueError(f"pvm_hidden_size {self.pvm_hidden_size} must be divisible by heads {self.heads}")
        if self.gate not in ("scalar", "channel"):
            raise ValueError(f"gate must be 'scalar' or 'channel', got {self.gate!r}")
        for name in ("shared_down", "silence_visual", "key_proj", "cache_visual", "output_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        number("dropout", self.dropout, 0.0, 1.0, open_high=True)
        if self.normalize_v not in ("none", "rms"):
            raise ValueError(f"normalize_v must be 'none' or 'rms', got {self.normalize_v!r}")
        if self.expander_init not in ("backbone", "zero"):
            raise ValueError(f"expander_init must be 'backbone' or 'zero', got {self.expander_init!r}")
        if self.master_dtype not in ("float32", "model"):
            raise ValueError(f"master_dtype must be 'float32' or 'model', got {self.master_dtype!r}")
        self.temperature = number("temperature", self.temperature, 1e-3, 1e3)
        other = _BRANCH_ONLY if self.variant == "released" else _RELEASED_ONLY
        stray = [k for k, default in other.items() if getattr(self, k) != default]
        if stray:
            raise ValueError(f"{', '.join(stray)} {'applies' if len(stray) == 1 else 'apply'} only to variant "
                             f"{'branch' if self.variant == 'released' else 'released'}, not {self.variant!r}")

    def resolve_layers(self, depth: int) -> list[int]:
        """Concrete, validated layer indices for a decoder of ``depth`` layers."""
        layers = strided_layers(depth) if self.layers == "strided" else list(self.layers)
        return sorted(layer_indices("layers", layers, depth, from_end=False))

    def resolve_pvm_hidden_size(self, hidden: int, head_dim: int) -> int:
        """The released block's latent width for a backbone of width ``hidden`` and head size ``head_dim``: the
        configured one (a multiple of ``head_dim``), or 512 (at most ``hidden / 4`` rounded down to a multiple of
        ``head_dim``, and at least one head)."""
        if self.pvm_hidden_size is not None:
            p = self.pvm_hidden_size
        else:
            p = max(head_dim, min(RELEASED_HIDDEN, (hidden // 4) // head_dim * head_dim))
        if p % head_dim:
            raise ValueError(f"pvm_hidden_size {p} must be a multiple of the backbone's head_dim {head_dim} (the "
                             "released block keeps the backbone's head size)")
        if p > 4 * hidden:
            raise ValueError(f"pvm_hidden_size {p} is more than 4x the backbone's width {hidden}: the block is a "
                             "bottleneck beside the FFN (released: 512 of 4096)")
        return p

    def resolve_latent(self, hidden: int) -> int:
        """The branch variant's d' for a model of width ``hidden``: at most ``hidden`` (W_down projects down)."""
        d = self.pvm_hidden_size if self.pvm_hidden_size is not None else max(self.heads, hidden // 4)
        if d > hidden:
            raise ValueError(f"pvm_hidden_size {d} exceeds the model width {hidden}; the branch's W_down projects "
                             "down (d' <= d; the paper: 1024 of 4096)")
        if d % self.heads:
            raise ValueError(f"pvm_hidden_size {d} must be divisible by heads {self.heads}")
        return d

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> PVMConfig:
        """A config from ``to_dict`` output, also of adapters written before the released variant existed (no
        ``variant``: the branch; ``latent_dim``: ``pvm_hidden_size``)."""
        fields = dict(fields)
        if "variant" not in fields:
            fields["variant"] = "branch"
        if "latent_dim" in fields:
            fields["pvm_hidden_size"] = fields.pop("latent_dim")
        return cls(**fields)
