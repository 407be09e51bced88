"""A Markdown summary of ``results.json`` (printed at the end of ``keepsight demo``; README's tables)."""

from __future__ import annotations


def _f(x, d: int = 2) -> str:
    return "–" if x is None else f"{x:.{d}f}"


def summary_markdown(results: dict) -> str:
    b = results["base"]
    yn = b["yes_no"]["categories"]
    lines = [
        f"Base model ({results['profile']} profile, world max {results['world']['max_objects']} objects), "
        "held-out yes/no (chance 0.50):",
        "",
        "| category | acc | acc+ |",
        "| --- | --- | --- |",
        *[f"| {c} | {_f(v['acc'])} | {_f(v['acc_plus'])} |" for c, v in yn.items()],
        f"| all | {_f(b['yes_no']['overall_acc'])} | |",
        "",
        "| description metric | value |",
        "| --- | --- |",
    ]
    ch = b["descriptions"]["chair"]
    for k in ("chair_i", "chair_s", "hallucination_rate", "attribute_error_rate", "object_recall",
              "object_recall_chance", "exact_recall"):
        if k in ch:  # object_recall_chance: runs since it was added
            lines.append(f"| {k} | {_f(ch[k], 3)} |")
    lines.append(f"| open answers (exact) | {', '.join(f'{k} {_f(v)}' for k, v in b['open'].items())} |")
    dil = b["dilution"]
    rows = dil["by_index"]
    lines += [
        "",
        f"Accuracy by object index, scenes with {dil['n_objects']} objects (n = {rows[0]['n']}):",
        "",
        "| index | " + " | ".join(str(r["index"] + 1) for r in rows) + " |",
        "| --- | " + " | ".join("---" for _ in rows) + " |",
    ]
    for f in ("named", "colour", "shape", "size", "exact", "colour_counter_prior", "shape_counter_prior"):
        lines.append(f"| {f.replace('_', ' ')} | " + " | ".join(_f(r[f]) for r in rows) + " |")
    lines.append("")
    lines.append(f"Slope per index step: exact {_f(dil['slope_exact'], 4)}, colour {_f(dil['slope_colour'], 4)}.")
    lines += _text_regimes(b)
    dg = b.get("diagnosis")
    if dg:
        lines += [
            "",
            f"Attention while describing {dg['n_samples']} scenes with {dil['n_objects']} objects "
            "(paper: slope about -1, TVR plateau near 1e2, strongest in middle layers):",
            "",
            "| measure | all layers | " + " | ".join(f"layer {i}" for i in range(len(dg["slope_by_layer"]))) + " |",
            "| --- | --- | " + " | ".join("---" for _ in dg["slope_by_layer"]) + " |",
            f"| Omega_V log-log slope | {_f(dg['slope'])} | " + " | ".join(_f(x) for x in dg["slope_by_layer"]) + " |",
            f"| TVR at last step | {_f(dg['tvr'][-1], 1)} | "
            + " | ".join(_f(r[-1], 1) for r in dg["tvr_by_layer"]) + " |",
            "| LogitLens top-1 agreement | | " + " | ".join(_f(x) for x in dg["top1_agree_by_layer"]) + " |",
            "",
            f"TVR plateau (median, last quarter of steps) {_f(dg['tvr_plateau'], 1)}; mean LogitLens "
            f"convergence layer {_f(dg['convergence_layer_mean'])}.",
        ]
    return "\n".join(lines)


def _ci(d: dict) -> str:
    return f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def _text_regimes(b: dict) -> list[str]:
    """The base's visual question as text grows: after question turns, and after its own description with the
    oracle (the image shown again) beside it; differences paired by scene with 95% bootstrap intervals."""
    hist, ad = b.get("history"), b.get("after_description")
    if not hist and not ad:
        return []
    lines = ["", "A visual yes/no question as text grows (one per held-out scene; differences paired by scene, 95% "
             "interval):", "", "| regime | no text | after the text | drop | the image again: recovery |",
             "| --- | --- | --- | --- | --- |"]
    if hist:
        lengths = hist["lengths"]
        by = hist["by_length"]
        lines.append(f"| {lengths[-1]} question turns | {_f(by[str(lengths[0])]['acc'], 3)} | "
                     f"{_f(by[str(lengths[-1])]['acc'], 3)} | {_ci(hist['drop'])} | |")
    if ad:
        share = ad.get("recovered_share")
        lines.append(f"| its own description ({ad['description_words']:.0f} words) | {_f(ad['none']['acc'], 3)} | "
                     f"{_f(ad['description']['acc'], 3)} | {_ci(ad['drop'])} | {_ci(ad['recovery'])}"
                     + (f", {share:.2f} of the drop" if share is not None else "") + " |")
    return lines
