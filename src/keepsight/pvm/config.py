"""PVM configuration: the released block's settings (our earlier reading of the paper, a branch beside the FFN, has
its own in ``keepsight.pvm.readings``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

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


RELEASED_HIDDEN = 512  # the released pvm_hidden_size
RELEASED_LAYERS = {"Qwen3-VL-8B": [8, 16, 24], "Qwen3-VL-4B": [5, 11, 17]}  # the released pvm_layers


@dataclass
class PVMConfig:
    """The settings of PVM's block as the authors released it (``keepsight.pvm.block``)."""

    variant: ClassVar[str] = "released"  # the block these settings build (an adapter's pvm_config.json records it)
    layers: str | list[int] = "strided"  # "strided" (round(2L/9), round(4L/9), round(6L/9)) or 0-based indices
    # the latent width p; None: 512 as released (at most width / 4, a multiple of head_dim, on a narrower model)
    pvm_hidden_size: int | None = None
    silence_visual: bool = True  # visual query positions receive no PVM output
    dropout: float = 0.0  # on the retrieval weights, training only
    cache_visual: bool = True  # project the visual memory once per sequence; False: every step (as released)
    master_dtype: str = "float32"  # the PVM parameters' dtype ("float32": fp32 master weights; "model": the backbone's)
    expander_init: str = "backbone"  # "backbone": normal(initializer_range), gate 0 (identity, trainable);
    #                                  "zero": the released file's zero expander (identity, but no gradient at all)
    output_norm: bool = True  # the released affine-free RMSNorm on the expander's output; False: an ablation (the
    #                           update's size then follows the retrieval, not only the gate; not in the release)

    def __post_init__(self) -> None:
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
        for name in ("silence_visual", "cache_visual", "output_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        number("dropout", self.dropout, 0.0, 1.0, open_high=True)
        if self.expander_init not in ("backbone", "zero"):
            raise ValueError(f"expander_init must be 'backbone' or 'zero', got {self.expander_init!r}")
        if self.master_dtype not in ("float32", "model"):
            raise ValueError(f"master_dtype must be 'float32' or 'model', got {self.master_dtype!r}")

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

    def to_dict(self) -> dict:
        return {"variant": self.variant, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, fields: dict) -> PVMConfig:
        """The config ``to_dict`` wrote, read by the reader of the ``variant`` it records (``CONFIG_READERS``: the
        released block's here, our earlier branch's in ``keepsight.pvm.readings``)."""
        fields = dict(fields)
        variant = fields.pop("variant", None)
        reader = CONFIG_READERS.get(variant)
        if reader is None:
            known = sorted(k for k in CONFIG_READERS if k is not None)
            raise ValueError(f"unknown PVM variant {variant!r}: keepsight reads {known}")
        return reader(fields)


# variant an adapter records -> its config from the other recorded fields (None: adapters that record none)
CONFIG_READERS: dict = {PVMConfig.variant: lambda fields: PVMConfig(**fields)}
