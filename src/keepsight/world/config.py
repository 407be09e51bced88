"""World configuration: vocabulary, difficulty presets and their validation."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from ..checks import number
from .grammar import NUMBER_WORDS, ROW_LETTERS

# The closed vocabulary the world draws from. A difficulty picks subsets of these.
ALL_SCENES = ("beach", "grass", "snow", "night", "desert", "ocean")
ALL_SHAPES = ("circle", "square", "triangle", "diamond", "cross", "star", "ring", "bar")
ALL_COLOURS = ("red", "green", "blue", "yellow", "purple", "orange", "pink", "cyan")
ALL_SIZES = ("small", "large")

# The smallest cell (pixels) in which a large object plus jitter still fits without overlapping.
MIN_CELL_PX = 8
MAX_GRID = len(ROW_LETTERS)  # cells are named a1 .. j10
MAX_IMAGE = 2048  # pixels a side: the world's scenes are drawn for small models


@dataclass
class WorldConfig:
    """How scenes are drawn. Every field is validated in ``__post_init__``; errors name the field."""

    image_size: int = 64  # square image side in pixels
    grid: tuple[int, int] = (4, 4)  # (rows, cols): every object sits in its own named cell
    min_objects: int = 1  # fewest objects in a scene
    max_objects: int = 12  # most objects in a scene (<= rows * cols, <= 16)
    scenes: tuple[str, ...] = ALL_SCENES[:4]  # scene types (shown by the background)
    shapes: tuple[str, ...] = ALL_SHAPES[:6]
    colours: tuple[str, ...] = ALL_COLOURS[:6]
    sizes: tuple[str, ...] = ALL_SIZES
    # Co-occurrence prior: each scene type prefers one colour and one shape; an object takes the
    # preferred value with this probability, otherwise a uniform draw from the others. 1/len(...) = none.
    prior_colour: float = 0.7
    prior_shape: float = 0.7
    jitter: float = 0.25  # max centre offset inside the cell, as a fraction of the free margin
    noise_std: float = 6.0  # std of per-pixel Gaussian noise (0-255 scale); 0 for clean images

    def __post_init__(self) -> None:
        number("image_size", self.image_size, 8, MAX_IMAGE, integer=True)  # pixels
        try:
            self.grid = tuple(int(g) for g in self.grid)
        except (TypeError, ValueError):
            raise ValueError(f"grid must be two positive ints (rows, cols), got {self.grid!r}") from None
        for name in ("scenes", "shapes", "colours", "sizes"):
            setattr(self, name, tuple(getattr(self, name)))
        if len(self.grid) != 2 or min(self.grid) < 1:
            raise ValueError(f"grid must be two positive ints (rows, cols), got {self.grid}")
        if max(self.grid) > MAX_GRID:
            raise ValueError(f"grid: at most {MAX_GRID} rows/cols can be named, got {self.grid}")
        cell_px = self.image_size / max(self.grid)
        if cell_px < MIN_CELL_PX:
            raise ValueError(
                f"image_size {self.image_size} is too small for grid {self.grid}: cells would be "
                f"{cell_px:.1f}px, need at least {MIN_CELL_PX}px (raise image_size or shrink grid)"
            )
        if not 1 <= self.min_objects <= self.max_objects:
            raise ValueError(
                f"min_objects must be in [1, max_objects={self.max_objects}], got {self.min_objects}"
            )
        if self.max_objects > self.cells:
            raise ValueError(f"max_objects {self.max_objects} exceeds the {self.cells} cells of grid {self.grid}")
        if self.max_objects >= len(NUMBER_WORDS):
            raise ValueError(f"max_objects must be < {len(NUMBER_WORDS)}, got {self.max_objects}")
        for name, allowed, least in (
            ("scenes", ALL_SCENES, 2),
            ("shapes", ALL_SHAPES, 2),
            ("colours", ALL_COLOURS, 2),
            ("sizes", ALL_SIZES, 1),
        ):
            values = getattr(self, name)
            unknown = [v for v in values if v not in allowed]
            if unknown:
                raise ValueError(f"{name}: unknown values {unknown}; allowed {list(allowed)}")
            if len(set(values)) != len(values) or len(values) < least:
                raise ValueError(f"{name}: need at least {least} distinct values, got {list(values)}")
        for name in ("prior_colour", "prior_shape", "jitter"):
            number(name, getattr(self, name), 0.0, 1.0)
        number("noise_std", self.noise_std, 0.0)

    @property
    def cells(self) -> int:
        """The grid's cell count (rows x cols): the places an object can be named at."""
        return self.grid[0] * self.grid[1]

    @property
    def cell_px(self) -> float:
        return self.image_size / max(self.grid)

    def preferred(self, scene: str) -> tuple[str, str]:
        """The (colour, shape) a scene type prefers: a fixed pairing by position in the lists."""
        i = self.scenes.index(scene)
        return self.colours[i % len(self.colours)], self.shapes[(i * 2 + 1) % len(self.shapes)]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["grid"] = list(self.grid)
        for k in ("scenes", "shapes", "colours", "sizes"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> WorldConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown WorldConfig fields {sorted(unknown)}")
        return cls(**d)

    def fingerprint(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


DIFFICULTIES: dict[str, WorldConfig] = {}


def _register(name: str, **kw) -> None:
    DIFFICULTIES[name] = WorldConfig(**kw)


# easy: the prototype's world that saturates (no priors, few objects): a sanity check.
_register("easy", grid=(3, 3), max_objects=6, prior_colour=1 / 6, prior_shape=1 / 6, noise_std=0.0)
# default: 4x4 grid, up to 12 objects, scene priors, pixel noise: built to show dilution.
_register("default")
# hard: more attributes, larger grid, stronger priors.
_register(
    "hard", image_size=80, grid=(5, 5), max_objects=16, shapes=ALL_SHAPES, colours=ALL_COLOURS,
    prior_colour=0.8, prior_shape=0.8, noise_std=10.0,
)


def world_config(difficulty: str = "default", **overrides) -> WorldConfig:
    """A preset difficulty with optional field overrides."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose from {sorted(DIFFICULTIES)}")
    return dataclasses.replace(DIFFICULTIES[difficulty], **overrides)

