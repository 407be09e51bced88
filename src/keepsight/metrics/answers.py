"""Short answers against a reference (standard library only), the same rules for scoring (``keepsight eval
score``) and for GRPO rewards on a user's data:

- ``exact``: equal after normalisation (lower case, punctuation and the articles a / an / the removed, spaces
  collapsed; the VQA convention);
- ``yesno``: the first yes / no word of the answer equals the reference's (``yesno.parse_yes_no``'s rule
  ``"mention"``);
- ``choice``: the option letter of the answer equals the reference's: the first marked one (``(B)``, ``[B]``,
  ``B.``, ``B)``, ``B:``), else the first bare capital letter other than the words ``I`` / ``A``;
- ``numeric``: the first number in the answer is within ``tolerance`` (relative, and at least ``tolerance`` in
  absolute value) of the reference number.
"""

from __future__ import annotations

import re
import string

from .stats import wilson
from .yesno import parse_yes_no

ARTICLES = {"a", "an", "the"}
_PUNCT = str.maketrans({c: " " for c in string.punctuation})
_MARKED = re.compile(r"[(\[]([A-Z])[)\]]|(?:^|\s)([A-Z])[.):,](?:\s|$)")  # (B) [B] B. B) B:
_BARE = re.compile(r"(?:^|\s)([A-Z])(?:\s|$)")
_NUMBER = re.compile(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?")
KINDS = ("exact", "yesno", "choice", "numeric")


def normalise(text: str) -> str:
    words = str(text).lower().translate(_PUNCT).split()
    return " ".join(w for w in words if w not in ARTICLES)


def first_yes_no(text: str) -> str | None:
    return parse_yes_no(text, "mention")


def first_choice(text: str) -> str | None:
    text = str(text).strip()
    if len(text) == 1 and text.isalpha():
        return text.upper()
    m = _MARKED.search(text)
    if m:
        return m.group(1) or m.group(2)
    # a bare capital letter; "I" and "A" only as the whole answer (they are words too: "I think ...")
    for m in _BARE.finditer(text):
        if m.group(1) not in "IA":
            return m.group(1)
    return None


def first_number(text: str) -> float | None:
    m = _NUMBER.search(str(text).replace(",", ""))
    return float(m.group(0)) if m else None


def match(kind: str, answer: str, reference: str, tolerance: float = 1e-6) -> bool:
    """Whether ``answer`` matches ``reference`` under the rule ``kind`` (see the module docstring)."""
    if kind == "exact":
        return normalise(answer) == normalise(reference)
    if kind == "yesno":
        gold = first_yes_no(reference)
        if gold is None:
            raise ValueError(f"yes/no reference {reference!r} holds no yes or no")
        return first_yes_no(answer) == gold
    if kind == "choice":
        gold = first_choice(reference)
        if gold is None:
            raise ValueError(f"multiple-choice reference {reference!r} holds no option letter")
        return first_choice(answer) == gold
    if kind == "numeric":
        gold = first_number(reference)
        if gold is None:
            raise ValueError(f"numeric reference {reference!r} holds no number")
        got = first_number(answer)
        return got is not None and abs(got - gold) <= max(tolerance, tolerance * abs(gold))
    raise ValueError(f"unknown answer kind {kind!r}; choose from {KINDS}")


def score_records(records: list[dict], kind: str) -> dict:
    """Accuracy of predictions ``{"answer", "reference", "category"?}`` under ``kind``, overall and per category
    (when the records have one), each with its 95% Wilson interval: ``{"kind", "overall": {...}, "categories":
    {name: {...}}}``, each ``{"n", "correct", "accuracy", "low", "high"}``. For ``yesno`` also the yes-ratio of the
    answers and how many held no yes / no word (scored wrong)."""
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; choose from {KINDS}")
    if not records:
        raise ValueError("no predictions to score")
    groups: dict[str, list[bool]] = {}
    hits = []
    for i, r in enumerate(records):
        if not isinstance(r.get("answer"), str) or not isinstance(r.get("reference"), str):
            raise ValueError(f"prediction {i} (id {r.get('id')!r}) needs string 'answer' and 'reference' fields")
        try:
            ok = match(kind, r["answer"], r["reference"])
        except ValueError as e:
            raise ValueError(f"prediction {i} (id {r.get('id')!r}): {e}") from None
        hits.append(ok)
        if r.get("category") is not None:
            groups.setdefault(str(r["category"]), []).append(ok)

    def summary(flags: list[bool]) -> dict:
        low, high = wilson(sum(flags), len(flags))
        return {"n": len(flags), "correct": sum(flags), "accuracy": sum(flags) / len(flags), "low": low, "high": high}

    out = {"kind": kind, "overall": summary(hits), "categories": {k: summary(v) for k, v in sorted(groups.items())}}
    if kind == "yesno":
        words = [first_yes_no(r["answer"]) for r in records]
        out["yes_ratio"] = sum(w == "yes" for w in words) / len(words)
        out["unparsed"] = sum(w is None for w in words)
    return out
