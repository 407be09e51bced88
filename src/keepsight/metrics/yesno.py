"""Yes/no accuracy by category, MME style."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from .stats import wilson


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
        ok = normalise_answer(r["prediction"]) == gold
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
