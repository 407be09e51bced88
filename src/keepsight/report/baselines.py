"""Report pieces for the baselines experiment: HTML sections and the Markdown summary."""

from __future__ import annotations

from pathlib import Path

from ..experiments.baselines import COMPARE_HEADER, compare
from .html import md_table, table


def _pope_rows(res: dict) -> list[list]:
    rows = []
    for name, a in res["arms"].items():
        for strategy in ("random", "popular", "adversarial"):
            p = a["pope"][strategy]
            rows.append([name, strategy, p["accuracy"], p["precision"], p["recall"], p["f1"], p["yes_ratio"]])
    return rows


def _history_rows(res: dict) -> tuple[list[str], list[list]]:
    lengths = next(iter(res["arms"].values()))["history"]["lengths"]
    rows = [[name] + [a["history"]["by_length"][str(h)]["acc"] for h in lengths] for name, a in res["arms"].items()]
    return ["arm"] + [f"h = {h}" for h in lengths], rows


def baselines_report(res: dict, out_dir: Path) -> list[tuple[str, str]]:
    intro = ("<p>The training-free baselines (keepsight.baselines) at the paper's defaults and one stronger setting, "
             "beside PVM (stage 1) and the base, on the same held-out scenes. History: accuracy of a fixed visual "
             "question after h turns (the dilution regime). POPE: the world's version (scene kinds as objects). "
             "Time per token: descriptions, median of repeats, relative to the base.</p>")
    header, rows = _history_rows(res)
    stats = [[name, s.get("forwards"), s.get("acted"), s.get("changed_argmax"), s.get("mean_logit_shift")]
             for name, s in res["stats"].items()]
    return [
        ("Baselines: the arms", intro + table(COMPARE_HEADER, compare(res))),
        ("Baselines: accuracy vs history length", table(header, rows)),
        ("Baselines: world POPE", table(["arm", "strategy", "accuracy", "precision", "recall", "F1", "yes-ratio"],
                                        _pope_rows(res))),
        ("Baselines: how often each acted", table(["arm", "forwards", "acted", "argmax changed", "mean |logit shift|"],
                                                  stats)),
    ]


def baselines_markdown(res: dict) -> str:
    lines = ["", "Training-free baselines vs PVM (world, same scenes):", "", *md_table(COMPARE_HEADER, compare(res))]
    return "\n".join(lines)
