"""Settings of the two training-free fixes, with the released code's defaults (and the paper's numbers) in one place.

Every consumer (``MaskPriorSuppression``, ``MonotonicRoPEScaling``, the demo's diffusion experiment, the
lmms-eval model) takes its defaults from these classes. ``PAPER`` names the fields whose defaults are the
paper's own numbers (LLaDA-V's); the others are the released code's. Our earlier readings of the paper (MPS as a
projection, MRS as gains on the frequency pairs) have their own settings in ``keepsight.diffusion.readings``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from ..checks import number
from ..ops.rope import SCHEDULES

SEGMENTS = ("visual", "prompt", "generation")


class _PaperDefaults:
    PAPER: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def paper_defaults(cls) -> dict:
        """The paper's numbers: ``{field: default}`` for the fields in ``PAPER``."""
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        return {name: fields[name] for name in cls.PAPER}

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in d.items()}


@dataclass
class MPSConfig(_PaperDefaults):
    """Mask Prior Suppression as the authors' code computes it (see ``keepsight.diffusion.mps``;
    github.com/hong-sujung/MPD-PAC)."""

    # a masked-diffusion method: tested against the released code and at zero strength on the sampler there
    TESTED_BY: ClassVar[str] = "tests/diffusion/test_mps_mrs.py"

    PAPER: ClassVar[tuple[str, ...]] = ("k", "lam")

    k: int = 3  # principal directions of the prior subspace (paper and code: 3; clamped to the rank as released)
    lam: float = 0.1  # suppression strength (paper: 0.1 for LLaDA-V, 0.3 for LaViDa)

    @classmethod
    def lavida(cls, **overrides) -> MPSConfig:
        """The paper's LaViDa setting: lam 0.3 (MPD-PAC's LaViDa fork commits keepsight's tokens at it: README)."""
        return cls(**{"lam": 0.3, **overrides})

    def __post_init__(self) -> None:
        self.k = number("k", self.k, low=1, integer=True)
        self.lam = number("lam", self.lam, low=0.0, high=1.0)


@dataclass
class MRSConfig(_PaperDefaults):
    """Monotonic RoPE Scaling as the authors' code computes it (see ``keepsight.diffusion.mrs``): every RoPE angle
    scaled per frequency pair."""

    # a masked-diffusion method: tested against the released code and at zero strength on the sampler there
    TESTED_BY: ClassVar[str] = "tests/diffusion/test_mps_mrs.py"

    PAPER: ClassVar[tuple[str, ...]] = ("beta", "eta", "tau0")

    beta: float = 0.01  # strength: angle scale s_i = 1 + beta * y(tau_i) (paper: 0.01; the code's rope = 10 * beta)
    eta: float = 8.0  # sigmoid steepness (paper: 8 for LLaDA-V, 12 for LaViDa)
    tau0: float = 0.6  # sigmoid midpoint (paper: 0.6)
    schedule: str = "sigmoid"  # sigmoid | cosine | exponential | linear | power (the paper's Table 18)
    segments: str | Iterable[str] = "all"  # tokens scaled: "all" (as released) or a subset of visual / prompt /
    #                                        generation (ours)

    @classmethod
    def lavida(cls, **overrides) -> MRSConfig:
        """The paper's LaViDa setting: eta 12 (beta 0.01, tau0 0.6), with the LLaDA-V fork's working math. MPD-PAC's
        LaViDa fork computes these scales but never applies them (its blocks are called without MRS's arguments:
        plain RoPE; README, "LaViDa, as MPD-PAC's fork releases it")."""
        return cls(**{"eta": 12.0, **overrides})

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose from {SCHEDULES}")
        self.beta = number("beta", self.beta, low=0.0, high=100.0)  # larger gains overflow the logits
        self.eta = number("eta", self.eta, low=0.0, high=1e3)
        self.tau0 = number("tau0", self.tau0, low=0.0, high=1.0)
        if self.schedule in ("sigmoid", "power") and self.eta <= 0:
            raise ValueError(f"the {self.schedule} schedule needs eta > 0, got {self.eta}")
        if self.segments != "all":
            if not isinstance(self.segments, (str, list, tuple, set, frozenset)) or not all(
                    isinstance(x, str) for x in ([self.segments] if isinstance(self.segments, str) else self.segments)):
                raise ValueError(f"segments must be 'all' or a list of {SEGMENTS}, got {self.segments!r}")
            segs = frozenset([self.segments] if isinstance(self.segments, str) else self.segments)
            bad = sorted(segs - set(SEGMENTS))
            if bad or not segs:
                raise ValueError(f"segments must be 'all' or a non-empty subset of {SEGMENTS}, got {sorted(segs)}")
            self.segments = "all" if segs == set(SEGMENTS) else segs
