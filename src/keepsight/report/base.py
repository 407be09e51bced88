"""Report pieces for the base model: the HTML sections of its evaluation and of the dilution diagnosis."""

from __future__ import annotations

from pathlib import Path

from .html import fmt, img_tag, table


def base_sections(results: dict, images: dict, plot: Path) -> list[tuple[str, str]]:
    """The base model's sections; ``images``: scene id -> PNG bytes of the sample scenes shown."""
    b = results["base"]
    yn = b["yes_no"]["categories"]
    yn_rows = [[c, v["n"], v["acc"], v["acc_plus"], v["score"]] for c, v in yn.items()]
    yn_rows.append(["total (MME score)", "", b["yes_no"]["overall_acc"], "", b["yes_no"]["total"]])
    ch = b["descriptions"]["chair"]
    chair_rows = [[k, ch[k]] for k in ("chair_i", "chair_s", "recall", "hallucination_rate", "attribute_error_rate",
                                       "object_recall", "object_recall_chance", "exact_recall") if k in ch]
    dil = b["dilution"]
    idx_rows = [[r["index"] + 1, r["n"], r["named"], r["colour"], r["shape"], r["size"], r["exact"],
                 r["colour_counter_prior"], r["shape_counter_prior"]] for r in dil["by_index"]]
    samples = ""
    for smp in b["samples"]:
        samples += (f"<div class=s>{img_tag(images[smp['id']], smp['id'])}<div><p><b>truth</b>: {fmt(smp['truth'])}"
                    f"</p><p><b>generated</b>: {fmt(smp['generated'])}</p></div></div>")
    stage_rows = [[s, v["first_loss"], v["last_loss"]] for s, v in b["stages"].items()]
    t = results["timings"]
    return [
        ("Base model", f"<p>Model: <code>{fmt(results['model_dir'])}</code>; train {t['train_s']:.0f}s, "
                       f"eval {t['eval_s']:.0f}s.</p>" + table(["stage", "first loss", "last loss"], stage_rows)),
        ("Yes/no by category (held out)", table(["category", "n", "acc", "acc+", "score"], yn_rows)),
        ("Open answers (exact match)", table(["kind", "acc"], [[k, v] for k, v in b["open"].items()])),
        ("Descriptions: CHAIR against the scene graph", table(["metric", "value"], chair_rows)),
        (f"Dilution: accuracy by object index ({dil['n_objects']} objects per scene)",
         img_tag(plot.read_bytes(), "accuracy by index")
         + table(["index", "n", "named", "colour", "shape", "size", "exact", "colour (counter-prior)",
                  "shape (counter-prior)"], idx_rows)
         + f"<p>Least-squares slope per index step: exact {fmt(dil['slope_exact'], 4)}, colour "
           f"{fmt(dil['slope_colour'], 4)}, counter-prior colour {fmt(dil['slope_colour_counter_prior'], 4)}.</p>"),
        ("Samples", samples),
    ]


def diagnosis_section(diag: dict, plots: dict[str, Path]) -> tuple[str, str]:
    n = len(diag["slope_by_layer"])
    rows = [[f"layer {i}", diag["slope_by_layer"][i], diag["tvr_by_layer"][i][-1], diag["top1_agree_by_layer"][i],
             diag["kl_by_layer"][i]] for i in range(n)]
    body = (
        f"<p>Generating the long description for {diag['n_samples']} scenes (greedy, up to "
        f"{diag['max_new_tokens']} tokens). Omega_V against the number of text tokens t in context: "
        f"fitted log-log slope <b>{fmt(diag['slope'])}</b> (paper: about -1); TVR plateau (median of the "
        f"last quarter of steps) <b>{fmt(diag['tvr_plateau'], 1)}</b> (paper: near 1e2); mean LogitLens "
        f"convergence layer {fmt(diag['convergence_layer_mean'], 2)} of {n}.</p>"
        + "".join(img_tag(p.read_bytes(), name) for name, p in plots.items())
        + table(["layer", "Omega_V slope", "TVR at last step", "LogitLens top-1 agreement", "KL(final||layer)"],
                rows)
    )
    return ("Dilution diagnostics: visual attention mass, TVR, LogitLens", body)
