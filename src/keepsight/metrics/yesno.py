"""Reading yes / no from a model's answer (one parser, named rules) and yes/no accuracy by category, MME style.

The rules of ``parse_yes_no(text, rule)``, each as its scorer defines it:

- ``"pope"``: POPE's ``evaluate.py``: the text before the first ".", split on spaces with commas removed;
  "no" if a word is ``No``, ``no`` or ``not``, else "yes" (never None; "NO." and "" read as "yes").
- ``"opera"``: OPERA's ``pope_eval.py``: periods and commas removed, split on spaces; "no" if a word is ``No``,
  ``not``, ``no``, ``NO`` or ends in ``n't``, else "yes" (never None).
- ``"keepsight"`` (alias ``"first"``): the first whole word among yes / no / not, any case ("There is no dog."
  -> "no"; "I cannot tell" -> None).
- ``"first_word"``: the answer's first word must be yes or no ("Yes, it is" -> "yes"; "There is no dog." ->
  None): the world's yes/no scores (``yes_no_scores``), where the base model is trained to answer in a word.
- ``"mention"``: the first whole word "yes" or "no", any case ("There is no dog." -> "no"; "not at all" ->
  None): ``keepsight eval score --kind yesno`` and the GRPO answer reward (``metrics.answers``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from .stats import wilson

#: The rules of ``parse_yes_no`` (see the module docstring).
RULES = ("pope", "opera", "keepsight", "first_word", "mention")
_ALIASES = {"first": "keepsight"}  # an earlier name of "keepsight"
_WORDS = re.compile(r"[a-z]+")
_MENTION = re.compile(r"\b(yes|no)\b", re.I)
_OPERA_NEG = ("No", "not", "no", "NO")


def rule_name(rule: str) -> str:
    """The canonical name of a parsing rule (``"first"`` -> ``"keepsight"``); a ValueError naming the choices."""
    rule = _ALIASES.get(rule, rule)
    if rule not in RULES:
        raise ValueError(f"unknown yes/no parsing rule {rule!r}; expected one of {list(RULES)}")
    return rule


def parse_yes_no(text: str, rule: str = "pope") -> str | None:
    """"yes", "no" or None (no reading) for a model's answer under ``rule`` (see the module docstring)."""
    rule = rule_name(rule)
    text = str(text)
    if rule == "pope":
        if "." in text:
            text = text.split(".")[0]
        words = text.replace(",", "").split(" ")
        return "no" if ("No" in words or "not" in words or "no" in words) else "yes"
    if rule == "opera":
        words = text.replace(".", "").replace(",", "").split(" ")
        return "no" if any(w in _OPERA_NEG or w.endswith("n't") for w in words) else "yes"
    if rule == "keepsight":
        for w in _WORDS.findall(text.lower()):
            if w == "yes":
                return "yes"
            if w in ("no", "not"):
                return "no"
        return None
    if rule == "first_word":
        first = normalise_answer(text)
        return first if first in ("yes", "no") else None
    m = _MENTION.search(text)  # mention
    return m.group(1).lower() if m else None


def normalise_answer(text: str) -> str:
    """'Yes.' / ' yes ,' -> 'yes'; anything else -> its first word, lower case ('' if empty)."""
    words = text.strip().lower().replace(".", " ").replace(",", " ").split()
    return words[0] if words else ""


def yes_no_scores(records: Iterable[dict]) -> dict:
    """Score records ``{"image": id, "category": c, "answer": "yes"|"no", "prediction": text}``.

    Per category: acc (share of questions right), acc+ (share of images whose questions in that category
    are all right; the world asks two per image, one yes and one no) and MME score = 100*acc + 100*acc+.
    ``total`` sums the MME scores over categories; ``overall_acc`` pools every question.
    """
    per_q: dict[str, list[bool]] = defaultdict(list)
    per_img: dict[str, dict[str, bool]] = defaultdict(dict)
    for r in records:
        missing = {"image", "category", "answer", "prediction"} - set(r)
        if missing:
            raise ValueError(f"yes/no record lacks {sorted(missing)}: {r}")
        gold = normalise_answer(r["answer"])
        if gold not in ("yes", "no"):
            raise ValueError(f"yes/no record has answer {r['answer']!r}, expected 'yes' or 'no'")
        ok = parse_yes_no(r["prediction"], "first_word") == gold
        cat = r["category"]
        per_q[cat].append(ok)
        per_img[cat][r["image"]] = per_img[cat].get(r["image"], True) and ok
    if not per_q:
        raise ValueError("no yes/no records to score")
    cats = {}
    for cat in sorted(per_q):
        acc = sum(per_q[cat]) / len(per_q[cat])
        acc_plus = sum(per_img[cat].values()) / len(per_img[cat])
        cats[cat] = {"n": len(per_q[cat]), "acc": acc, "acc_plus": acc_plus, "score": 100 * (acc + acc_plus)}
    all_q = [ok for v in per_q.values() for ok in v]
    return {
        "categories": cats,
        "total": sum(c["score"] for c in cats.values()),
        "overall_acc": sum(all_q) / len(all_q),
        "n": len(all_q),
        "overall_ci": list(wilson(sum(all_q), len(all_q))),  # 95% Wilson interval of overall_acc
    }
