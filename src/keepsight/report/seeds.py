"""Report pieces for several base seeds: the base model per seed, every comparison as mean [95% interval] beside
its reference and the paired difference, accuracy vs history length per arm, and the verdicts."""

from __future__ import annotations

from pathlib import Path

from ..experiments.aggregate import VERDICTS, paired
from .html import img_tag, table
from .plots import plot_text_regimes


def fmt_ci(ci: dict | None, digits: int = 3) -> str:
    """``mean [low, high]`` (``mean`` alone for a single value; ``–`` when missing)."""
    if not ci or ci.get("mean") is None:
        return "–"
    if ci["n"] < 2:
        return f"{ci['mean']:.{digits}f}"
    return f"{ci['mean']:.{digits}f} [{ci['low']:.{digits}f}, {ci['high']:.{digits}f}]"


def verdict_words(v: dict) -> str:
    """An aggregate verdict (``{"over_seeds", "per_seed"}``) in words: "higher" / "lower" over the seeds; else
    "higher on each of the N seeds" when every seed's own intervals separate the same way; else no verdict, naming
    the seeds that separate."""
    over, each = v["over_seeds"], v["per_seed"]
    if over:
        return "higher" if over > 0 else "lower"
    n, ups, downs = len(each), each.count(1), each.count(-1)
    if n > 1 and (ups == n or downs == n):
        return f"{'higher' if ups else 'lower'} on each of the {n} seeds (each seed's own intervals apart)"
    if ups or downs:
        parts = [f"{word} on {k} of {n} seeds" for word, k in (("higher", ups), ("lower", downs)) if k]
        return f"no verdict ({', '.join(parts)})"
    return "no verdict (the paired difference holds 0)"


BASE_ROWS = [("yes/no, all", "yes_no.overall_acc"),
             *[(f"yes/no, {c}", f"yes_no.categories.{c}.acc")
               for c in ("colour", "count", "existence", "position", "scene", "shape")],
             ("visual question, no history", "history.by_length.0.acc"),
             ("visual question after 15 turns", "history.by_length.15.acc"),
             ("drop, 0 -> 15 turns (test-set difference)", "history.drop.diff"),
             ("visual question after its own description", "after_description.description.acc"),
             ("drop after its own description", "after_description.drop.diff"),
             ("the image again after the description (oracle)", "after_description.oracle.acc"),
             ("oracle's recovery (paired)", "after_description.recovery.diff"),
             ("object recall", "descriptions.chair.object_recall"),
             ("Omega_V log-log slope", "diagnosis.slope"), ("TVR plateau", "diagnosis.tvr_plateau")]


def _per_seed(ci: dict | None, digits: int = 3) -> str:
    return " / ".join(f"{x:.{digits}f}" for x in (ci or {}).get("values", []))


def base_rows(agg: dict) -> list[list]:
    base = agg.get("base", {})
    return [[label, fmt_ci(base.get(path)), _per_seed(base.get(path))] for label, path in BASE_ROWS if path in base]


def comparison_rows(agg: dict) -> list[list]:
    """experiment, arm, metric, arm, reference, paired difference, verdict."""
    rows = []
    for name, arms in agg.get("verdicts", {}).items():
        spec = VERDICTS[name]
        experiment = spec.get("experiment", name)
        for arm, metrics in arms.items():
            for metric, v in metrics.items():
                template = spec["metrics"][metric]
                a = agg[experiment].get(template.format(arm=arm))
                b = agg[experiment].get(template.format(arm=spec["ref"]))
                rows.append([experiment, arm, metric, fmt_ci(a), f"{spec['ref']} {fmt_ci(b)}",
                             fmt_ci(paired(a, b)), verdict_words(v)])
    return rows


def history_rows(agg: dict, experiment: str = "pvm") -> tuple[list[str], list[list]]:
    """Accuracy vs history length per arm, mean over the seeds (header, rows)."""
    data = agg.get(experiment, {})
    arms = _arms(data)
    lengths = sorted({int(k.split(".")[4]) for k in data if ".history.by_length." in k and k.startswith("arms.")})
    rows = [[arm] + [fmt_ci(data.get(f"arms.{arm}.history.by_length.{n}.acc"), 3).split(" [")[0] for n in lengths]
            for arm in arms]
    return ["arm"] + [f"h = {n}" for n in lengths], rows


REGIME_STEPS = (("none", "no text"), ("description", "after its own description"),
                ("oracle", "+ the image again (oracle)"))
ARM_EXPERIMENTS = (("pvm", "PVM arms"), ("baselines", "training-free baselines"))


def _arms(data: dict) -> list[str]:
    """The arms with an aggregated history, the base first."""
    return sorted({k.split(".")[1] for k in data if k.startswith("arms.") and ".history.by_length." in k},
                  key=lambda a: (a != "base", a))


def description_rows(agg: dict, experiment: str) -> list[list]:
    """Per arm: a visual question with no text, after the arm's own description, and after it with the image shown
    again, each as mean [95% interval] over the seeds."""
    data = agg.get(experiment, {})
    return [[arm] + [fmt_ci(data.get(f"arms.{arm}.after_description.{step}.acc")) for step, _ in REGIME_STEPS]
            for arm in _arms(data) if f"arms.{arm}.after_description.description.acc" in data]


def words_rows(agg: dict, experiment: str) -> list[list]:
    """Per arm: the words of its own description (the text before the question of ``description_rows``), mean
    [95% interval] over the seeds and each seed's: an arm that learned to write less has less text before its
    question, and its accuracy there is not comparable with the base's."""
    data = agg.get(experiment, {})
    rows = []
    for arm in _arms(data):
        ci = data.get(f"arms.{arm}.after_description.description_words")
        if ci:
            rows.append([arm, fmt_ci(ci, 1), _per_seed(ci, 1)])
    return rows


def _ci_rate(ci: dict) -> dict:
    return {"acc": ci["mean"], "low": ci["low"], "high": ci["high"]}


def plot_seeds(agg: dict, experiment: str, path: str | Path) -> Path | None:
    """Accuracy of a visual question as text grows, per arm of ``experiment``, mean and 95% interval over the seeds
    (``plot_text_regimes`` on the aggregate; the PVM experiment's oracle dashed). None when fewer than 2 seeds."""
    data = agg.get(experiment, {})
    names = _arms(data)
    if agg.get("n_seeds", 0) < 2 or not names:
        return None

    def by_length(prefix: str) -> dict:
        return {k[len(prefix):-len(".acc")]: _ci_rate(v) for k, v in data.items()
                if k.startswith(prefix) and k.endswith(".acc")}

    arms = {}
    for arm in names:
        steps = {step: data.get(f"arms.{arm}.after_description.{step}.acc") for step, _ in REGIME_STEPS}
        arms[arm] = {"history": {"by_length": by_length(f"arms.{arm}.history.by_length.")},
                     **({"after_description": {s: _ci_rate(v) for s, v in steps.items()}}
                        if all(steps.values()) else {})}
    oracle = by_length("oracle.history.by_length.")
    return plot_text_regimes(arms, path, {"by_length": oracle} if oracle else None,
                             f"mean and 95% interval over {agg['n_seeds']} seeds")


COMPARE_HEADER = ["experiment", "arm", "metric", "arm: mean [95% interval]", "reference", "paired difference",
                  "verdict"]


def seeds_sections(agg: dict, out_dir: str | Path | None = None) -> list[tuple[str, str]]:
    """The seeds' report sections; ``out_dir``: where the plots over seeds are written (None: no plots)."""
    n = agg["n_seeds"]
    intro = (f"<p>{n} base seeds (model initialisation and data order), every arm trained and scored on each. "
             "Mean with a 95% t interval over the seeds. An arm is higher or lower than its reference where the "
             "interval of the per-seed differences (the paired difference) excludes 0, and higher or lower on "
             "each seed where every seed's own 95% intervals of the two arms separate.</p>")
    sections = [("Seeds: base model", intro + table(["metric", "mean [95% interval]", "per seed"], base_rows(agg))),
                ("Seeds: comparisons", table(COMPARE_HEADER, comparison_rows(agg)))]
    header, rows = history_rows(agg)
    if rows:
        sections.append(("Seeds: accuracy vs history length (mean)", table(header, rows)))
    for experiment, label in ARM_EXPERIMENTS:
        rows = description_rows(agg, experiment)
        plot = plot_seeds(agg, experiment, Path(out_dir) / f"seeds_{experiment}_text.png") if out_dir else None
        if rows or plot:
            words = words_rows(agg, experiment)
            body = (img_tag(plot.read_bytes(), f"{label}: accuracy as text grows") if plot else "") + (
                table(["arm", *(head for _, head in REGIME_STEPS)], rows) if rows else "") + (
                table(["arm", "words of its own description", "per seed"], words) if words else "")
            sections.append((f"Seeds: {label} as text grows", body))
    return sections


def _md_table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |",
            *["| " + " | ".join(map(str, r)) + " |" for r in rows]]


def seeds_markdown(agg: dict) -> str:
    n = agg["n_seeds"]
    lines = ["", f"Base model over {n} seeds (mean [95% t interval]; per seed):", "",
             *_md_table(["metric", "mean [95% interval]", "per seed"], base_rows(agg)), "",
             f"Comparisons over {n} seeds: higher or lower where the paired difference (the 95% interval of the "
             "per-seed differences) excludes 0; on each seed where every seed's own intervals of the two arms "
             "separate:", "",
             *_md_table(COMPARE_HEADER, comparison_rows(agg))]
    header, rows = history_rows(agg)
    if rows:
        lines += ["", f"Visual question accuracy vs turns of history, mean over {n} seeds:", "",
                  *_md_table(header, rows)]
    header, rows = history_rows(agg, "baselines")
    if rows:
        lines += ["", f"The same for the training-free baselines, mean over {n} seeds:", "", *_md_table(header, rows)]
    for experiment, label in ARM_EXPERIMENTS:
        rows = description_rows(agg, experiment)
        if rows:
            lines += ["", f"{label[0].upper()}{label[1:]}: a visual question after the arm's own description, mean "
                          f"[95% interval] over {n} seeds:", "",
                      *_md_table(["arm", *(head for _, head in REGIME_STEPS)], rows)]
        rows = words_rows(agg, experiment)
        if rows:
            lines += ["", f"{label[0].upper()}{label[1:]}: words of the arm's own description (the text before that "
                          f"question), mean [95% interval] over {n} seeds:", "",
                      *_md_table(["arm", "words", "per seed"], rows)]
    return "\n".join(lines)
