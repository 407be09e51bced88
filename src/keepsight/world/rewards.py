"""Verifiable rewards from the world's ground truth, in the shape TRL's GRPOTrainer calls them.

Each reward function takes the completions and the dataset's extra columns (``kind``, ``answer``,
``scene`` as JSON) and returns one float per completion:

- ``answer_reward``: short questions (yes/no, open, "what is at b3 ?") score 1 for the exact answer and 0
  otherwise; a description scores the F1 of its objects against the scene graph (a mention is right when
  the cell is occupied and colour, shape and size all match; recall over the scene's objects). So the
  long task rewards what the dilution curve measures.
- ``format_reward``: 1 when the completion has the expected form (one answer of the right kind; a
  description that opens with the scene and count sentences, whose every clause parses and that names no
  cell twice), else 0.
"""

from __future__ import annotations

import json
import re

from ..train.rewards import completion_text
from .grammar import parse_description

SHORT_KINDS = ("yes_no", "count", "colour", "shape", "scene", "cell")
LONG_KINDS = ("describe",)
_CLAUSE_RE = re.compile(r"^at [a-j]\d+ an? \w+ \w+ \w+$")
_HEADER_RE = re.compile(r"^this is an? \w+ scene \. there (?:are|is) \w+ objects? \.")


def description_f1(text: str, scene: dict) -> float:
    """F1 of the mentioned objects: precision over mentions (a repeated cell counts as wrong), recall over
    the scene's objects; a mention is right when every attribute matches the object in its cell."""
    by_cell = {(o["row"], o["col"]): o for o in scene["objects"]}
    mentions = parse_description(text).objects
    seen: set = set()
    right = 0
    for m in mentions:
        o = by_cell.get(m.cell)
        if m.cell not in seen and o is not None and (m.size, m.colour, m.shape) == (o["size"], o["colour"], o["shape"]):
            right += 1
        seen.add(m.cell)
    if not mentions or not by_cell:
        return float(not mentions and not by_cell)
    p, r = right / len(mentions), right / len(by_cell)
    return 2 * p * r / (p + r) if right else 0.0


def _check_kind(kind: str) -> None:
    if kind not in SHORT_KINDS + LONG_KINDS:
        raise ValueError(f"unknown task kind {kind!r}; expected one of {SHORT_KINDS + LONG_KINDS}")


def answer_reward(completions, kind, answer, scene, **_) -> list[float]:
    out = []
    for c, k, a, s in zip(completions, kind, answer, scene, strict=True):
        _check_kind(k)
        text = completion_text(c)
        if k in LONG_KINDS:
            out.append(description_f1(text, json.loads(s)))
        else:
            out.append(float(" ".join(text.split()) == a))
    return out


def format_reward(completions, kind, **_) -> list[float]:
    out = []
    for c, k in zip(completions, kind, strict=True):
        _check_kind(k)
        text = " ".join(completion_text(c).split())
        if k in LONG_KINDS:
            out.append(float(_description_well_formed(text)))
        elif k == "cell":
            out.append(float(text == "nothing" or re.fullmatch(r"an? \w+ \w+ \w+", text) is not None))
        elif k == "yes_no":
            out.append(float(text in ("yes", "no")))
        else:  # a single word
            out.append(float(len(text.split()) == 1))
    return out


def _description_well_formed(text: str) -> bool:
    m = _HEADER_RE.match(text)
    if m is None:
        return False
    clauses = [c.strip() for c in text[m.end():].split(" .")]
    if clauses and clauses[-1] == "":
        clauses.pop()
    else:
        return False  # unfinished last clause
    if not all(_CLAUSE_RE.match(c) for c in clauses):
        return False
    cells = [c.split()[1] for c in clauses]
    return len(cells) == len(set(cells))
