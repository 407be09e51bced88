"""Report pieces for several base seeds: every aggregated number as mean [95% interval], and the verdicts."""

from __future__ import annotations

from .html import table


def fmt_ci(ci: dict | None, digits: int = 3) -> str:
    """``mean [low, high]`` (``mean`` alone for a single value; ``–`` when missing)."""
    if not ci or ci.get("mean") is None:
        return "–"
    if ci["n"] < 2:
        return f"{ci['mean']:.{digits}f}"
    return f"{ci['mean']:.{digits}f} [{ci['low']:.{digits}f}, {ci['high']:.{digits}f}]"


VERDICT = {1: "higher", -1: "lower", 0: "no verdict (intervals overlap)"}


def _rows(agg: dict, experiment: str) -> list[list]:
    return [[k, fmt_ci(v), " ".join(f"{x:.3f}" for x in v["values"])] for k, v in sorted(agg.get(experiment, {}).items())]


def _verdict_rows(agg: dict) -> list[list]:
    rows = []
    for experiment, arms in agg.get("verdicts", {}).items():
        for arm, metrics in arms.items():
            for metric, v in metrics.items():
                rows.append([experiment, arm, metric, VERDICT[v]])
    return rows


def seeds_sections(agg: dict) -> list[tuple[str, str]]:
    n = agg["n_seeds"]
    intro = (f"<p>{n} base seeds (model initialisation and data order), every arm trained and scored on each. "
             "Mean with a 95% t interval over the seeds; a verdict only where two arms' intervals do not "
             "overlap.</p>")
    sections = [("Seeds: verdicts", intro + table(["experiment", "arm", "metric", "verdict vs reference"],
                                                   _verdict_rows(agg)))]
    for experiment in ("base", "pvm", "bridge"):
        if experiment in agg:
            sections.append((f"Seeds: {experiment}", table(["metric", "mean [95% interval]", "per seed"],
                                                          _rows(agg, experiment))))
    return sections


def seeds_markdown(agg: dict) -> str:
    lines = ["", f"Over {agg['n_seeds']} base seeds (mean [95% interval]); verdicts only where intervals separate:",
             "", "| experiment | arm | metric | verdict |", "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _verdict_rows(agg)]
    return "\n".join(lines)
