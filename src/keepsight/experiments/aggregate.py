"""Results over several base seeds: every scalar the experiments report, as a mean with a 95% t interval over
the seeds; each seed's own 95% intervals where a result has them; and a verdict between two arms, over the seeds (the
interval of the per-seed differences excludes 0) and on each seed (the seed's own intervals of the two arms
separate)."""

from __future__ import annotations

from ..metrics import mean_ci

# the parts of one seed's results that are aggregated (dotted paths; "*" = every key at that level)
PATHS = {
    "base": ["yes_no.overall_acc", "yes_no.categories.*.acc", "history.by_length.*.acc", "history.by_length.*.omega_v",
             "history.drop.diff", "descriptions.chair.*", "open.*", "diagnosis.slope", "diagnosis.tvr_plateau",
             "diagnosis.convergence_layer_mean", "after_description.*.acc", "after_description.drop.diff",
             "after_description.recovery.diff", "after_description.recovered_share"],
    "pvm": ["comparison.*.*", "arms.*.history.by_length.*.acc", "arms.*.after_description.*.acc",
            "arms.*.after_description.description_words", "oracle.short_acc",
            "oracle.long_acc", "oracle.drop", "oracle.recovered", "oracle.history.by_length.*.acc"],
    "baselines": ["arms.*.yes_no.overall_acc", "arms.*.yes_no.categories.*.acc", "arms.*.history.by_length.*.acc",
                  "arms.*.history.drop.diff", "arms.*.after_description.*.acc", "arms.*.after_description.drop.diff",
                  "arms.*.after_description.description_words",
                  "arms.*.descriptions.chair.chair_i", "arms.*.descriptions.chair.object_recall", "arms.*.pope.*.f1"],
    "bridge": ["arms.*.yes_no.overall_acc", "arms.*.yes_no.categories.*.acc", "arms.*.history.by_length.*.acc",
               "arms.*.history.drop.diff", "arms.*.descriptions.chair.object_recall",
               "arms.*.descriptions.chair.exact_recall", "write_gate.*.gate_mean", "write_gate.*.gate_std"],
    "control": ["arms.*.*.acc", "ordinary.*.*.acc", "open.*.*.acc", "verdict.*.gain"],
}
# the parts of one seed's results that carry that seed's own 95% interval ({"diff" or "acc", "low", "high"}): kept per
# seed, so that an effect every seed shows on its own is not lost in a t interval over three values
SEED_INTERVALS = {"base": ["history.drop", "after_description.drop", "after_description.recovery"]}
# experiment -> the reference arm, which arms to compare with it (their names sit at position ``level`` of the
# paths, those ending in ``suffix``), and metric -> path template: each compared arm gets a verdict per metric
VERDICTS = {
    "pvm": {"ref": "base", "level": 1, "suffix": "", "metrics": {
        m: f"comparison.{{arm}}.{m}" for m in ("yes_no_acc", "history_short_acc", "history_long_acc", "history_drop",
                                              "description_regime_acc", "object_recall", "exact_recall",
                                              "late_exact_recall")}},
    "bridge": {"ref": "mlp_phase2", "level": 1, "suffix": "_phase2", "metrics": {
        "yes_no_acc": "arms.{arm}.yes_no.overall_acc", "existence": "arms.{arm}.yes_no.categories.existence.acc",
        "scene": "arms.{arm}.yes_no.categories.scene.acc", "colour": "arms.{arm}.yes_no.categories.colour.acc",
        "object_recall": "arms.{arm}.descriptions.chair.object_recall"}},
    # each training-free baseline (same base, decoded with the method) against the base
    "baselines": {"ref": "base", "level": 1, "suffix": "", "metrics": {
        "yes_no_acc": "arms.{arm}.yes_no.overall_acc", "history_long_acc": "arms.{arm}.history.by_length.15.acc",
        "description_regime_acc": "arms.{arm}.after_description.description.acc",
        "chair_i": "arms.{arm}.descriptions.chair.chair_i",
        "pope_adversarial_f1": "arms.{arm}.pope.adversarial.f1"}},
    # the image withheld: each arm's prior-balanced yes/no against the base's text-only level (0.5 by construction),
    # and against the LoRA trained the same way without a path to the image (what training alone gives); each seed's
    # Wilson intervals ("arms.{arm}.all": acc, low, high) give the per-seed verdicts
    "control": {"ref": "base", "level": 1, "suffix": "", "metrics": {"yes_no_acc": "arms.{arm}.all.acc"},
                "seed_intervals": {"yes_no_acc": "arms.{arm}.all"}},
    "control_vs_lora": {"experiment": "control", "ref": "lora", "level": 1, "suffix": "", "only": "pvm_sft",
                        "metrics": {"yes_no_acc": "arms.{arm}.all.acc"}, "seed_intervals": {"yes_no_acc": "arms.{arm}.all"}},
    # the PVM arms against the matched LoRA (same layers, data, steps and parameter count, no new path to the image):
    # what PVM's memory adds beyond training that many parameters
    "pvm_vs_lora": {"experiment": "pvm", "ref": "lora", "level": 1, "suffix": "", "only": "pvm", "metrics": {
        m: f"comparison.{{arm}}.{m}" for m in ("description_regime_acc", "history_long_acc", "yes_no_acc")}},
}


def _select(obj, parts: list[str], prefix: str = ""):
    if not parts:
        if isinstance(obj, (int, float)) and not isinstance(obj, bool):
            yield prefix, float(obj)
        return
    head, rest = parts[0], parts[1:]
    if not isinstance(obj, dict):
        return
    keys = obj.keys() if head == "*" else [head] if head in obj else []
    for k in keys:
        name = str(k).replace(".", "_")  # a dot in a key (an arm named "memvr (threshold 0.5, ...)") would split it
        yield from _select(obj[k], rest, f"{prefix}.{name}" if prefix else name)


def flatten(experiment: str, result: dict) -> dict[str, float]:
    """The aggregated scalars of one seed's ``experiment`` result: ``{dotted path: value}``."""
    out: dict[str, float] = {}
    for path in PATHS.get(experiment, []):
        out.update(_select(result, path.split(".")))
    return out


def dig(obj, *keys):
    """``obj[k1][k2]...``, or None where a key is missing (or a level is not a dict)."""
    for key in keys:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def sign(low: float | None, high: float | None) -> int:
    """+1 when a 95% interval of a difference lies above 0, -1 below, 0 when it holds 0 (or is missing)."""
    if low is None or high is None:
        return 0
    return 1 if low > 0 else -1 if high < 0 else 0


def paired(a: dict | None, b: dict | None) -> dict | None:
    """Mean [95% t interval] of the per-seed differences a - b (the arms share each seed's base and data)."""
    if not a or not b or len(a["values"]) != len(b["values"]) or not a["values"]:
        return None
    return mean_ci([x - y for x, y in zip(a["values"], b["values"])])


def _seed_sign(result: dict | None, template: str, arm: str, ref: str) -> int:
    """One seed's verdict: +1 when the arm's own 95% interval lies wholly above the reference's, -1 below, else 0."""
    a, b = dig(result, *template.format(arm=arm).split(".")), dig(result, *template.format(arm=ref).split("."))
    if not a or not b or None in (a.get("low"), b.get("low")):
        return 0
    return 1 if a["low"] > b["high"] else -1 if a["high"] < b["low"] else 0


def seed_signs(intervals: list[dict]) -> list[int]:
    """Per seed, +1 / -1 / 0 as that seed's own 95% interval (``SEED_INTERVALS``) lies above / below / around 0."""
    return [sign(i.get("low"), i.get("high")) for i in intervals]


def aggregate(per_seed: list[dict]) -> dict:
    """``per_seed``: one ``{experiment: result}`` per seed. Returns ``{experiment: {path: mean_ci}}``; under
    ``seed_intervals``, ``{experiment: {path: [each seed's interval]}}``; and under ``verdicts``, for each compared
    arm and metric, ``{"over_seeds": s, "per_seed": [s, ...]}``: ``over_seeds`` +1 / -1 when the 95% t interval of
    the per-seed differences lies above / below 0 (0: it holds 0, or fewer than two seeds), ``per_seed`` the same
    from each seed's own intervals where the experiment has them (else empty)."""
    out: dict = {"n_seeds": len(per_seed)}
    for experiment in PATHS:
        results = [r[experiment] for r in per_seed if r.get(experiment)]
        flats = [flatten(experiment, r) for r in results]
        if not flats:
            continue
        keys = sorted(set().union(*flats))
        out[experiment] = {k: mean_ci([f.get(k) for f in flats]) for k in keys}
        kept = {p: [dig(r, *p.split(".")) for r in results] for p in SEED_INTERVALS.get(experiment, [])}
        kept = {p: v for p, v in kept.items() if all(isinstance(i, dict) for i in v)}
        if kept:
            out.setdefault("seed_intervals", {})[experiment] = kept
    verdicts: dict = {}
    for name, spec in VERDICTS.items():
        experiment = spec.get("experiment", name)
        agg = out.get(experiment)
        if not agg:
            continue
        results = [r[experiment] for r in per_seed if r.get(experiment)]
        first = next(iter(spec["metrics"].values())).split(".")[0]
        arms = sorted({k.split(".")[spec["level"]] for k in agg if k.startswith(first + ".")} - {spec["ref"]})
        for arm in (a for a in arms if a.endswith(spec["suffix"]) and a.startswith(spec.get("only", ""))):
            for metric, template in spec["metrics"].items():
                diff = paired(agg.get(template.format(arm=arm)), agg.get(template.format(arm=spec["ref"])))
                if diff is None:
                    continue
                over = sign(diff["low"], diff["high"]) if diff["n"] > 1 else 0
                interval = spec.get("seed_intervals", {}).get(metric)
                each = [_seed_sign(r, interval, arm, spec["ref"]) for r in results] if interval else []
                verdicts.setdefault(name, {}).setdefault(arm, {})[metric] = {"over_seeds": over, "per_seed": each}
    out["verdicts"] = verdicts
    return out
