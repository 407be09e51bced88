"""Draw a scene graph as an RGB image with Pillow (deterministic: same scene, same bytes)."""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageDraw

from .scene import Scene, SceneObject

SUPERSAMPLE = 4  # draw at 4x and downsample with a box filter for anti-aliased edges

BACKGROUNDS = {  # (base colour, texture colour): the texture makes the scene type visible
    "beach": ((214, 190, 140), (190, 165, 115)),
    "grass": ((60, 105, 50), (45, 85, 38)),
    "snow": ((225, 230, 238), (200, 208, 222)),
    "night": ((20, 24, 52), (230, 230, 200)),
    "desert": ((180, 120, 70), (160, 100, 55)),
    "ocean": ((30, 90, 140), (60, 130, 180)),
}

COLOURS = {
    "red": (220, 40, 40),
    "green": (60, 220, 80),
    "blue": (50, 90, 235),
    "yellow": (245, 225, 40),
    "purple": (150, 60, 205),
    "orange": (250, 140, 20),
    "pink": (250, 125, 195),
    "cyan": (40, 225, 235),
}


def _texture(draw: ImageDraw.ImageDraw, scene: str, size: int, rng: np.random.Generator) -> None:
    _, tex = BACKGROUNDS[scene]
    s = SUPERSAMPLE
    if scene == "night":  # stars: sparse bright dots
        for _ in range(size // 3):
            x, y = rng.integers(0, size * s, 2)
            draw.rectangle([x, y, x + s - 1, y + s - 1], fill=tex)
    elif scene in ("beach", "desert"):  # speckles
        for _ in range(size * 2):
            x, y = rng.integers(0, size * s, 2)
            draw.ellipse([x, y, x + s, y + s], fill=tex)
    elif scene == "grass":  # short vertical blades
        for _ in range(size):
            x, y = rng.integers(0, size * s, 2)
            draw.line([x, y, x, y + 3 * s], fill=tex, width=s // 2)
    elif scene in ("snow", "ocean"):  # horizontal streaks
        for y in range(0, size * s, 6 * s):
            draw.line([0, y, size * s, y], fill=tex, width=s // 2)


def _polygon(cx: float, cy: float, r: float, n: int, start: float, inner: float | None = None) -> list:
    pts = []
    steps = n * 2 if inner else n
    for i in range(steps):
        a = start + 2 * math.pi * i / steps
        rr = r if (inner is None or i % 2 == 0) else r * inner
        pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
    return pts


def _draw_object(draw: ImageDraw.ImageDraw, o: SceneObject) -> None:
    s = SUPERSAMPLE
    cx, cy, r = o.cx * s, o.cy * s, o.radius * s
    fill = COLOURS[o.colour]
    box = [cx - r, cy - r, cx + r, cy + r]
    if o.shape == "circle":
        draw.ellipse(box, fill=fill)
    elif o.shape == "square":
        q = r * 0.85
        draw.rectangle([cx - q, cy - q, cx + q, cy + q], fill=fill)
    elif o.shape == "triangle":
        draw.polygon(_polygon(cx, cy + r * 0.15, r * 1.05, 3, -math.pi / 2), fill=fill)
    elif o.shape == "diamond":
        draw.polygon(_polygon(cx, cy, r, 4, -math.pi / 2), fill=fill)
    elif o.shape == "cross":
        w = r * 0.35
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=fill)
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=fill)
    elif o.shape == "star":
        draw.polygon(_polygon(cx, cy, r * 1.05, 5, -math.pi / 2, inner=0.45), fill=fill)
    elif o.shape == "ring":
        draw.ellipse(box, outline=fill, width=max(int(r * 0.35), s))
    elif o.shape == "bar":
        draw.rectangle([cx - r, cy - r * 0.3, cx + r, cy + r * 0.3], fill=fill)
    else:
        raise ValueError(f"unknown shape {o.shape!r}")


def render(scene: Scene, noise_std: float = 0.0) -> Image.Image:
    """Render ``scene`` to an RGB ``PIL.Image`` of ``scene.image_size`` pixels square."""
    size = scene.image_size
    rng = np.random.default_rng([scene.seed, scene.index, 1])
    img = Image.new("RGB", (size * SUPERSAMPLE, size * SUPERSAMPLE), BACKGROUNDS[scene.scene][0])
    draw = ImageDraw.Draw(img)
    _texture(draw, scene.scene, size, rng)
    for o in scene.objects:
        _draw_object(draw, o)
    img = img.resize((size, size), Image.Resampling.BOX)
    if noise_std > 0:
        arr = np.asarray(img, dtype=np.float32)
        arr = arr + rng.normal(0.0, noise_std, arr.shape).astype(np.float32)
        img = Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8))
    return img


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()
