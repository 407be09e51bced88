"""Results over several base seeds: every scalar the experiments report, as a mean with a 95% t interval over
the seeds, and a verdict between two arms only where their intervals separate."""

from __future__ import annotations

from ..metrics import mean_ci, separated

# the parts of one seed's results that are aggregated (dotted paths; "*" = every key at that level)
PATHS = {
    "base": ["yes_no.overall_acc", "yes_no.categories.*.acc", "history.by_length.*.acc", "history.by_length.*.omega_v",
             "history.drop.diff", "descriptions.chair.*", "open.*", "diagnosis.slope", "diagnosis.tvr_plateau",
             "diagnosis.convergence_layer_mean", "after_description.*.acc", "after_description.drop.diff",
             "after_description.recovery.diff", "after_description.recovered_share"],
    "pvm": ["comparison.*.*", "arms.*.history.by_length.*.acc", "arms.*.after_description.*.acc", "oracle.short_acc",
            "oracle.long_acc", "oracle.drop", "oracle.recovered", "oracle.history.by_length.*.acc"],
    "baselines": ["arms.*.yes_no.overall_acc", "arms.*.yes_no.categories.*.acc", "arms.*.history.by_length.*.acc",
                  "arms.*.history.drop.diff", "arms.*.after_description.*.acc", "arms.*.after_description.drop.diff",
                  "arms.*.descriptions.chair.chair_i", "arms.*.descriptions.chair.object_recall", "arms.*.pope.*.f1"],
    "bridge": ["arms.*.yes_no.overall_acc", "arms.*.yes_no.categories.*.acc", "arms.*.history.by_length.*.acc",
               "arms.*.history.drop.diff", "arms.*.descriptions.chair.object_recall",
               "arms.*.descriptions.chair.exact_recall", "write_gate.*.gate_mean", "write_gate.*.gate_std"],
    "control": ["arms.*.*.acc", "ordinary.*.*.acc", "open.*.*.acc", "verdict.*.gain"],
}
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
    # and against the LoRA trained the same way without a path to the image (what training alone gives)
    "control": {"ref": "base", "level": 1, "suffix": "", "metrics": {"yes_no_acc": "arms.{arm}.all.acc"}},
    "control_vs_lora": {"experiment": "control", "ref": "lora", "level": 1, "suffix": "", "only": "pvm_sft",
                        "metrics": {"yes_no_acc": "arms.{arm}.all.acc"}},
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


def aggregate(per_seed: list[dict]) -> dict:
    """``per_seed``: one ``{experiment: result}`` per seed. Returns ``{experiment: {path: mean_ci}}`` and, under
    ``verdicts``, for each compared arm and metric: +1 (above the reference), -1 (below) or 0 (no verdict:
    the 95% intervals overlap, or fewer than two seeds)."""
    out: dict = {"n_seeds": len(per_seed)}
    for experiment in PATHS:
        flats = [flatten(experiment, r[experiment]) for r in per_seed if r.get(experiment)]
        if not flats:
            continue
        keys = sorted(set().union(*flats))
        out[experiment] = {k: mean_ci([f.get(k) for f in flats]) for k in keys}
    verdicts: dict = {}
    for name, spec in VERDICTS.items():
        agg = out.get(spec.get("experiment", name))
        if not agg:
            continue
        first = next(iter(spec["metrics"].values())).split(".")[0]
        arms = sorted({k.split(".")[spec["level"]] for k in agg if k.startswith(first + ".")} - {spec["ref"]})
        for arm in (a for a in arms if a.endswith(spec["suffix"]) and a.startswith(spec.get("only", ""))):
            for metric, template in spec["metrics"].items():
                a, b = agg.get(template.format(arm=arm)), agg.get(template.format(arm=spec["ref"]))
                if a and b:
                    verdicts.setdefault(name, {}).setdefault(arm, {})[metric] = separated(a, b)
    out["verdicts"] = verdicts
    return out
