"""Scene graphs: the exact ground truth behind every image, text and metric."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from .config import WorldConfig

SMALL_RADIUS = 0.22  # object radius as a fraction of the cell side
LARGE_RADIUS = 0.40


@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    size: str  # "small" | "large"
    row: int  # 0-based grid row
    col: int  # 0-based grid column
    cx: float  # centre in pixels
    cy: float
    radius: float  # pixels

    @property
    def cell(self) -> tuple[int, int]:
        return (self.row, self.col)


@dataclass
class Scene:
    """One image's ground truth. ``objects`` are in raster order (row, then column)."""

    id: str
    seed: int
    index: int
    scene: str
    image_size: int
    grid: tuple[int, int]
    objects: list[SceneObject] = field(default_factory=list)
    preferred_colour: str = ""
    preferred_shape: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["grid"] = list(self.grid)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> Scene:
        d = dict(d)
        d["grid"] = tuple(d["grid"])
        d["objects"] = [SceneObject(**o) for o in d["objects"]]
        return cls(**d)

    def object_at(self, row: int, col: int) -> SceneObject | None:
        for o in self.objects:
            if o.row == row and o.col == col:
                return o
        return None

    def is_counter_prior(self, obj: SceneObject, attribute: str) -> bool:
        """True when ``obj`` does not take its scene's preferred colour/shape ("must be seen")."""
        if attribute == "colour":
            return obj.colour != self.preferred_colour
        if attribute == "shape":
            return obj.shape != self.preferred_shape
        raise ValueError(f"attribute must be 'colour' or 'shape', got {attribute!r}")


def _draw_with_prior(rng: np.random.Generator, values: tuple[str, ...], preferred: str, p: float) -> str:
    if rng.random() < p:
        return preferred
    others = [v for v in values if v != preferred]
    return others[int(rng.integers(len(others)))]


def sample_scene(config: WorldConfig, seed: int, index: int, n_objects: int | None = None) -> Scene:
    """Draw scene ``index`` of the world with ``seed``; independent of how many scenes are drawn."""
    if n_objects is not None and not config.min_objects <= n_objects <= config.max_objects:
        raise ValueError(
            f"n_objects {n_objects} out of range [{config.min_objects}, {config.max_objects}] for this world"
        )
    rng = np.random.default_rng([seed, index])
    rows, cols = config.grid
    scene_type = config.scenes[int(rng.integers(len(config.scenes)))]
    pref_colour, pref_shape = config.preferred(scene_type)
    n = n_objects if n_objects is not None else int(rng.integers(config.min_objects, config.max_objects + 1))
    cells = sorted(int(c) for c in rng.choice(rows * cols, size=n, replace=False))  # raster order
    cell = config.cell_px
    objects = []
    for c in cells:
        r, k = divmod(c, cols)
        size = config.sizes[int(rng.integers(len(config.sizes)))]
        radius = cell * (SMALL_RADIUS if size == "small" else LARGE_RADIUS)
        margin = max(cell / 2 - radius - 1.0, 0.0) * config.jitter
        cx = (k + 0.5) * cell + float(rng.uniform(-margin, margin))
        cy = (r + 0.5) * cell + float(rng.uniform(-margin, margin))
        objects.append(
            SceneObject(
                shape=_draw_with_prior(rng, config.shapes, pref_shape, config.prior_shape),
                colour=_draw_with_prior(rng, config.colours, pref_colour, config.prior_colour),
                size=size, row=r, col=k, cx=round(cx, 3), cy=round(cy, 3), radius=round(radius, 3),
            )
        )
    return Scene(
        id=f"s{seed}-{index:06d}", seed=seed, index=index, scene=scene_type, image_size=config.image_size,
        grid=config.grid, objects=objects, preferred_colour=pref_colour, preferred_shape=pref_shape,
    )
