"""CHAIR-style hallucination metrics against exact scene graphs.

Category level (as in Rohrbach et al.'s CHAIR, with shapes as the object categories):
  CHAIRi = hallucinated mentions / all mentions (a repeated mention counts each time),
  CHAIRs = share of descriptions with at least one hallucinated mention,
  recall = sum |mentioned categories & true categories| / sum |true categories| (pooled).
Instance level (possible only with exact ground truth; each mention is matched to the object in the
cell it names):
  hallucination_rate = mentions naming an empty (or non-existent) cell / all mentions,
  attribute_error_rate = mentions at an occupied cell with a wrong colour, shape or size / all mentions,
  attribute_errors = counts per attribute, object_recall / exact_recall = share of true objects named
  at their cell (any attributes / all attributes right), repeated_mentions = mentions of a cell the
  same description already named.
"""

from __future__ import annotations

from collections.abc import Sequence

from .grammar import parse_description

ATTRIBUTES = ("colour", "shape", "size")


def _scene_dict(scene) -> dict:
    return scene.to_dict() if hasattr(scene, "to_dict") else scene


def _safe(num: float, den: float) -> float:
    return num / den if den else 0.0


def chair(descriptions: Sequence[str], scenes: Sequence, varied: bool = False, cells: int | None = None) -> dict:
    """Hallucination metrics of ``descriptions[i]`` against ``scenes[i]`` (``Scene`` or its dict). ``varied``: read
    the varied phrasings too (an unstated size is not an error; exact recall needs every attribute stated).
    ``cells``: the grid's cell count; with it, ``object_recall_chance`` is the object recall that descriptions naming
    as many distinct cells, drawn at random, would get in expectation (sum of named * true / cells over sum of
    true): on a 4 x 4 grid with 6 objects a description naming 7 cells reaches 0.44 by chance alone."""
    if cells is not None and cells < 1:
        raise ValueError(f"cells must be >= 1, got {cells}")
    if len(descriptions) != len(scenes):
        raise ValueError(f"{len(descriptions)} descriptions but {len(scenes)} scenes")
    mentions = halluc_cat = sentences_halluc = covered_cat = true_cat = 0
    halluc_inst = attr_err_mentions = repeated = true_objects = named = exact = 0
    chance = 0.0  # expected true objects hit by as many distinct cells drawn at random
    attr_errors = dict.fromkeys(ATTRIBUTES, 0)
    for text, scene in zip(descriptions, scenes):
        sc = _scene_dict(scene)
        by_cell = {(o["row"], o["col"]): o for o in sc["objects"]}
        true_shapes = {o["shape"] for o in sc["objects"]}
        parsed = parse_description(text, varied).objects
        mentions += len(parsed)
        bad = [m for m in parsed if m.shape not in true_shapes]
        halluc_cat += len(bad)
        sentences_halluc += bool(bad)
        covered_cat += len({m.shape for m in parsed} & true_shapes)
        true_cat += len(true_shapes)
        seen: set = set()
        first: dict = {}
        for m in parsed:
            if m.cell in seen:
                repeated += 1
            seen.add(m.cell)
            first.setdefault(m.cell, m)
            o = by_cell.get(m.cell)
            if o is None:
                halluc_inst += 1
                continue
            wrong = [a for a in ATTRIBUTES if getattr(m, a) is not None and getattr(m, a) != o[a]]
            for a in wrong:
                attr_errors[a] += 1
            attr_err_mentions += bool(wrong)
        true_objects += len(by_cell)
        if cells is not None:
            chance += min(len(seen), cells) * len(by_cell) / cells
        for cell, o in by_cell.items():
            if cell in first:
                named += 1
                exact += all(getattr(first[cell], a) == o[a] for a in ATTRIBUTES)
    return {
        "n_descriptions": len(descriptions),
        "mentions": mentions,
        "chair_i": _safe(halluc_cat, mentions),
        "chair_s": _safe(sentences_halluc, len(descriptions)),
        "recall": _safe(covered_cat, true_cat),
        "hallucination_rate": _safe(halluc_inst, mentions),
        "attribute_error_rate": _safe(attr_err_mentions, mentions),
        "attribute_errors": attr_errors,
        "object_recall": _safe(named, true_objects),
        "exact_recall": _safe(exact, true_objects),
        "repeated_mentions": repeated,
        **({} if cells is None else {"object_recall_chance": _safe(chance, true_objects)}),
    }
