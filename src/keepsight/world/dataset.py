"""Scenes in memory, on disk (PNG + JSONL) and as a ``datasets.Dataset``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import datasets

from ..atomic import atomic_save_dir, check_output_dir, marked_kind
from ..checks import number
from ..jsonl import read_jsonl
from .config import WorldConfig
from .render import png_bytes, render
from .scene import Scene, sample_scene
from .texts import caption, description, open_questions, yes_no_questions

WORLD_KIND = "world"
WORLD_FILE = "world.json"
SCENES_FILE = "scenes.jsonl"
IMAGES_DIR = "images"


def iter_scenes(config: WorldConfig, n: int, seed: int = 0, n_objects: int | None = None, start: int = 0):
    """Scenes ``start .. start+n-1`` of the world with ``seed``, one at a time (each depends only on seed and
    index)."""
    for name, value in (("n", n), ("seed", seed), ("start", start)):
        number(name, value, 0, integer=True)
    for i in range(n):
        yield sample_scene(config, seed, start + i, n_objects=n_objects)


def generate_scenes(config: WorldConfig, n: int, seed: int = 0, n_objects: int | None = None, start: int = 0) -> list[Scene]:
    """Scenes ``start .. start+n-1`` of the world with ``seed`` (each scene depends only on seed and index)."""
    return list(iter_scenes(config, n, seed, n_objects, start))


def scene_record(scene: Scene, config: WorldConfig) -> dict:
    """All texts of one scene, with the scene graph as the ground truth."""
    return {
        "id": scene.id,
        "scene": scene.to_dict(),
        "description": description(scene),
        "caption": caption(scene),
        "yes_no": yes_no_questions(scene, config),
        "open": open_questions(scene),
    }


def build_world(out: str | os.PathLike, config: WorldConfig, n: int, seed: int = 0,
                n_objects: int | None = None, overwrite: bool = False) -> Path:
    """Write ``n`` scenes to ``out``: ``images/<id>.png``, ``scenes.jsonl`` and ``world.json``.

    Scenes are drawn and written one at a time into a temporary sibling directory, renamed into place at the
    end, so a crash or a signal never leaves a half-written world behind. ``overwrite`` replaces only a world
    keepsight wrote, never another directory.
    """
    out = Path(out)
    number("n", n, 1, integer=True)
    if out.exists():
        if not overwrite:
            raise FileExistsError(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
        if not is_world(out):
            raise ValueError(f"--out {out} exists and is not a keepsight world; --overwrite replaces only a world "
                             "that keepsight wrote (its .keepsight marker), refusing to delete it")
    check_output_dir(out, "--out", kinds=(WORLD_KIND,))
    need = n * scene_bytes(config, seed, n_objects)
    free = shutil.disk_usage(_existing_parent(out)).free
    if need > 0.9 * free:
        raise ValueError(f"--n {n}: {n} scenes need about {need / 2**30:.1f} GiB on disk and {free / 2**30:.1f} GiB "
                         "are free")

    def write(tmp: Path) -> None:
        (tmp / IMAGES_DIR).mkdir()
        with open(tmp / SCENES_FILE, "w") as f:
            for scene in iter_scenes(config, n, seed, n_objects=n_objects):
                rel = f"{IMAGES_DIR}/{scene.id}.png"
                (tmp / rel).write_bytes(png_bytes(render(scene, config.noise_std)))
                rec = {"image": rel, **scene_record(scene, config)}
                f.write(json.dumps(rec, sort_keys=True) + "\n")
        meta = {"config": config.to_dict(), "seed": seed, "n": n, "n_objects": n_objects}
        (tmp / WORLD_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))

    atomic_save_dir(out, write, kind=WORLD_KIND)
    return out


def scene_bytes(config: WorldConfig, seed: int = 0, n_objects: int | None = None) -> int:
    """About how many bytes one scene takes on disk (its PNG and its JSON record), from scene 0."""
    scene = sample_scene(config, seed, 0, n_objects=n_objects)
    return len(png_bytes(render(scene, config.noise_std))) + len(json.dumps(scene_record(scene, config))) + 64


def check_in_memory(config: WorldConfig, n: int, name: str = "--n") -> None:
    """A ValueError naming ``name`` when ``n`` rendered scenes would not fit in the memory this machine has free
    (the training commands hold their scenes' images in memory)."""
    per_scene = config.image_size**2 * 3 + 4096  # RGB pixels + the scene graph
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not available on this platform
        return
    if n * per_scene > 0.8 * free:
        raise ValueError(f"{name} {n}: {n} scenes need about {n * per_scene / 2**30:.1f} GiB of memory and "
                         f"{free / 2**30:.1f} GiB are free; build a world on disk with `keepsight world build` or "
                         "use fewer scenes")


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def is_world(path: str | os.PathLike) -> bool:
    """A directory keepsight wrote as a world (its marker, or the world files of an earlier keepsight version and
    nothing else)."""
    path = Path(path)
    if marked_kind(path) == WORLD_KIND:
        return True
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    return {WORLD_FILE, SCENES_FILE} <= names and names <= {WORLD_FILE, SCENES_FILE, IMAGES_DIR}


def read_world(path: str | os.PathLike) -> tuple[WorldConfig, list[dict]]:
    """Read and validate a world directory: its config and its records (``image`` made absolute)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"world directory {path} does not exist")
    meta_file, scenes_file = path / WORLD_FILE, path / SCENES_FILE
    for f in (meta_file, scenes_file):
        if not f.is_file():
            raise FileNotFoundError(f"{path} is not a keepsight world: {f.name} is missing "
                                    f"(build one with `keepsight world build --out {path}`)")
    try:
        config = WorldConfig.from_dict(json.loads(meta_file.read_text())["config"])
    except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{meta_file} is corrupt: {e}") from None
    records = []
    for where, rec in read_jsonl(scenes_file, "world scenes"):
        try:
            img = path / rec["image"]
            Scene.from_dict(rec["scene"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{where} is corrupt: {e!r}") from None
        if not img.is_file():
            raise FileNotFoundError(f"{where}: image {img} is missing")
        rec["image"] = str(img)
        records.append(rec)
    if not records:
        raise ValueError(f"{scenes_file} holds no scenes")
    return config, records


def load_world(path: str | os.PathLike):
    """A ``datasets.Dataset`` with columns id, image (decoded PIL), scene (JSON text), description,
    caption, yes_no, open."""
    _, records = read_world(path)
    rows = {
        "id": [r["id"] for r in records],
        "image": [r["image"] for r in records],
        "scene": [json.dumps(r["scene"], sort_keys=True) for r in records],
        "description": [r["description"] for r in records],
        "caption": [r["caption"] for r in records],
        "yes_no": [r["yes_no"] for r in records],
        "open": [r["open"] for r in records],
    }
    return datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
