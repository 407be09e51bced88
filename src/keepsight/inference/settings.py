"""How a ``Pipeline`` decodes each request: the settings ``keepsight eval`` generates its options from and
lmms-eval's model arguments of the same names reach (``Pipeline(..., max_new_tokens=64, steps=32)``). Each default is
written here once; the comments are the options' help."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..checks import number
from ..diffusion.sampler import REMASKING


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int = 128  # new tokens an answer may take (a request's own max_new_tokens wins)
    system_prompt: str | None = None  # a system turn for rows without one
    seed: int = 0  # the diffusion sampler's seed (keepsight eval pope: also the draw of its questions)
    # the diffusion sampler's schedule; the other methods refuse these
    steps: int | None = None  # diffusion: denoising steps; unset, one per token of the window the sampler fills
    gen_length: int | None = None  # diffusion: the window the sampler fills, whatever max_new_tokens asks; unset,
    #   max_new_tokens rounded up to whole blocks
    block_length: int | None = None  # diffusion: the semi-autoregressive block; unset, the whole window
    cfg_scale: float = 0.0  # diffusion: classifier-free guidance (0: none)
    remasking: str = "low_confidence"  # diffusion: which slots a step commits (low_confidence or random)

    def __post_init__(self) -> None:
        number("max_new_tokens", self.max_new_tokens, 1, integer=True)
        number("seed", self.seed, 0, integer=True)
        for name in ("steps", "gen_length", "block_length"):
            if getattr(self, name) is not None:
                number(name, getattr(self, name), 1, integer=True)
        number("cfg_scale", self.cfg_scale, 0.0)
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking must be one of {list(REMASKING)}, got {self.remasking!r}")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ValueError(f"system_prompt must be text, got {type(self.system_prompt).__name__}")

    def given(self) -> list[str]:
        """The settings that differ from their defaults, in field order."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != f.default]


DECODE = DecodeSettings()  # the defaults, read by Pipeline's signature
