"""Checkpoint layouts that a method's package reads (the released PVM layout: its blocks' weights beside the
backbone's, its fields in ``config.json``). Each package declares its reader under the ``keepsight.layouts`` entry
point group; the loader looks readers up there, so it never imports a method."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

import torch

GROUP = "keepsight.layouts"


@dataclass(frozen=True)
class Layout:
    """A checkpoint layout a method writes: ``declares(config)`` says whether a ``config.json`` dict is in it (raising
    on a half-declared one); ``load(path, config, dtype)`` builds the model with the method attached."""

    name: str
    declares: Callable[[dict], bool]
    load: Callable[[str | os.PathLike, dict, torch.dtype | None], torch.nn.Module]


def layouts() -> dict[str, Layout]:
    """Every declared layout reader, by entry point name."""
    found = {}
    for ep in entry_points(group=GROUP):
        reader = ep.load()
        if not isinstance(reader, Layout):
            raise TypeError(f"entry point {ep.name} = {ep.value} in {GROUP} is not a keepsight.models.layouts.Layout")
        found[ep.name] = reader
    if not found:
        raise RuntimeError(f"no {GROUP} entry points: keepsight's package metadata is missing (install it with "
                           "`pip install -e .` or `make install`), so a method's checkpoint layout could not be read")
    return found


def layout_of(config: dict) -> Layout | None:
    """The layout a ``config.json`` dict declares (None: a plain checkpoint of its family)."""
    declared = [r for r in layouts().values() if r.declares(config)]
    if len(declared) > 1:
        raise ValueError(f"config.json declares more than one method layout: {', '.join(r.name for r in declared)}")
    return declared[0] if declared else None
