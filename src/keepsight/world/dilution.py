"""Per-object accuracy by the object's index in the description: the dilution curve.

The true object at raster index i is looked up by its cell among the description's mentions (first
mention of that cell). An attribute counts as right only when the object is named at its cell with
that attribute; an object never named counts as wrong for every attribute. Counter-prior objects (those
not taking their scene type's preferred colour / shape, which the model must *see*) are scored
separately, using the scene's ``preferred_colour`` / ``preferred_shape``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ..metrics.stats import least_squares_slope
from .chair import _scene_dict
from .grammar import parse_description

FIELDS = ("named", "colour", "shape", "size", "exact", "colour_counter_prior", "shape_counter_prior")


def accuracy_by_index(descriptions: Sequence[str], scenes: Sequence) -> list[dict]:
    """One row per object index (0-based): counts ``n`` / ``n_<field>`` and rates for each field."""
    if len(descriptions) != len(scenes):
        raise ValueError(f"{len(descriptions)} descriptions but {len(scenes)} scenes")
    hits: dict[int, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for text, scene in zip(descriptions, scenes):
        sc = _scene_dict(scene)
        first: dict = {}
        for m in parse_description(text).objects:
            first.setdefault(m.cell, m)
        for i, o in enumerate(sc["objects"]):
            m = first.get((o["row"], o["col"]))
            ok = {a: m is not None and getattr(m, a) == o[a] for a in ("colour", "shape", "size")}
            row = hits[i]
            row["named"].append(m is not None)
            for a, v in ok.items():
                row[a].append(v)
            row["exact"].append(all(ok.values()))
            if sc.get("preferred_colour") and o["colour"] != sc["preferred_colour"]:
                row["colour_counter_prior"].append(ok["colour"])
            if sc.get("preferred_shape") and o["shape"] != sc["preferred_shape"]:
                row["shape_counter_prior"].append(ok["shape"])
    out = []
    for i in sorted(hits):
        row = {"index": i, "n": len(hits[i]["named"])}
        for f in FIELDS:
            vals = hits[i].get(f, [])
            row[f"n_{f}"] = len(vals)
            row[f] = sum(vals) / len(vals) if vals else None
        out.append(row)
    return out


def slope(rows: list[dict], field: str = "exact") -> float | None:
    """Least-squares slope of ``field`` against the index (per object step); None if < 2 points."""
    pts = [(r["index"], r[field]) for r in rows if r.get(field) is not None]
    return least_squares_slope([x for x, _ in pts], [y for _, y in pts])


def early_late(descriptions: Sequence[str], scenes: Sequence, split: int) -> dict:
    """The paper's short vs long comparison at the object level, inside one description.

    ``early`` covers mentions at position < ``split`` in the description and true objects at raster index
    < ``split``; ``late`` the rest. Per part: ``mentions``, ``chair_i`` (mentions of a shape the scene does
    not hold / mentions), ``hallucination_rate`` (mentions of an empty cell / mentions), ``objects``,
    ``recall`` (true objects named at their cell) and ``exact_recall`` (named with every attribute right).
    """
    if len(descriptions) != len(scenes):
        raise ValueError(f"{len(descriptions)} descriptions but {len(scenes)} scenes")
    if split < 1:
        raise ValueError(f"split must be >= 1, got {split}")
    acc = {part: dict.fromkeys(("mentions", "bad_shape", "empty", "objects", "named", "exact"), 0)
           for part in ("early", "late")}
    for text, scene in zip(descriptions, scenes):
        sc = _scene_dict(scene)
        by_cell = {(o["row"], o["col"]): o for o in sc["objects"]}
        shapes = {o["shape"] for o in sc["objects"]}
        first: dict = {}
        for pos, m in enumerate(parse_description(text).objects):
            a = acc["early" if pos < split else "late"]
            a["mentions"] += 1
            a["bad_shape"] += m.shape not in shapes
            a["empty"] += m.cell not in by_cell
            first.setdefault(m.cell, m)
        for i, o in enumerate(sc["objects"]):
            a = acc["early" if i < split else "late"]
            m = first.get((o["row"], o["col"]))
            a["objects"] += 1
            a["named"] += m is not None
            a["exact"] += m is not None and all(getattr(m, k) == o[k] for k in ("colour", "shape", "size"))

    def rate(n: int, d: int) -> float | None:
        return n / d if d else None

    return {part: {"mentions": a["mentions"], "chair_i": rate(a["bad_shape"], a["mentions"]),
                   "hallucination_rate": rate(a["empty"], a["mentions"]), "objects": a["objects"],
                   "recall": rate(a["named"], a["objects"]), "exact_recall": rate(a["exact"], a["objects"])}
            for part, a in acc.items()} | {"split": split}
