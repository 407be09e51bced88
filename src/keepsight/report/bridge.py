"""Report pieces for the bridge experiment: HTML sections and the Markdown summary (README's bridge table)."""

from __future__ import annotations

from pathlib import Path

from .html import fmt, table


def _rows(res: dict) -> tuple[list[str], list[list]]:
    arms = list(res["arms"])
    cats = list(res["arms"][arms[0]]["yes_no"]["categories"])
    rows = [["final training loss of the phase"] + [res["final_train_loss"][a] for a in arms]]
    rows += [["yes/no acc (all)"] + [res["arms"][a]["yes_no"]["overall_acc"] for a in arms]]
    rows += [[f"yes/no {c}"] + [res["arms"][a]["yes_no"]["categories"][c]["acc"] for a in arms] for c in cats]
    rows.append(["open answers (mean)"] + [sum(res["arms"][a]["open"].values()) / len(res["arms"][a]["open"])
                                           for a in arms])
    for label, key in (("CHAIRi", "chair_i"), ("hallucination rate", "hallucination_rate"),
                       ("object recall", "object_recall"), ("exact recall", "exact_recall")):
        rows.append([label] + [res["arms"][a]["descriptions"]["chair"][key] for a in arms])
    rows.append(["exact-match slope per index"] + [res["arms"][a]["dilution"]["slope_exact"] for a in arms])
    return arms, rows


def bridge_sections(res: dict) -> list[tuple[str, str]]:
    arms, rows = _rows(res)
    p = res["paper"]
    tr = res["training"]
    first1 = next(k for k in tr if k.endswith("_phase1"))
    first2 = next(k for k in tr if k.endswith("_phase2"))
    intro = (f"<p>MLP (the base model's own projector) against {res['config']['bridge']} "
             f"({tr[first1]['bridge_parameters']:,d} parameters) in each reading "
             f"({', '.join(k[:-7] for k in tr if k.endswith('_phase1'))}), from the same language model and vision "
             f"tower, with the same phase budgets: phase 1 {tr[first1]['train']['steps']} steps "
             f"(projector only), phase 2 {tr[first2]['train']['steps']} steps (projector + LLM). The "
             f"paper (real benchmarks): MME {p['mme_lia']} vs {p['mme_mlp']} after instruction tuning, Existence "
             f"{p['existence_after_align_lia']} vs {p['existence_after_align_mlp']} after alignment, Scene "
             f"{p['scene_lia']} vs {p['scene_mlp']}.</p>")
    gate_rows = [[k, v["gate_mean"], v["gate_std"], " ".join(f"{h:.1f}" for h in v["half_lives"]),
                  " ".join(f"{w:.2f}" for w in v["scale_weights"])] for k, v in res["write_gate"].items()]
    gate_rows.append(["paper", p["gate_mean"], p["gate_std"], "1.94 .. 138.28", ""])
    return [
        ("Bridge: MLP vs LIA-MTR after each phase", intro + table(["measure"] + arms, rows)),
        ("Bridge: LIA-MTR write gate and the mixer's weight per half-life on held-out images",
         table(["model", "gate mean", "gate std", "half-lives (steps)", "mean scale weights"], gate_rows)),
    ]


def bridge_markdown(res: dict) -> str:
    arms, rows = _rows(res)
    lines = ["", "Bridge experiment (same backbone initialisation and phase budgets):", "",
             "| measure | " + " | ".join(arms) + " |", "| --- | " + " | ".join("---" for _ in arms) + " |"]
    lines += [f"| {r[0]} | " + " | ".join(fmt(x) for x in r[1:]) + " |" for r in rows]
    lines.append("")
    for k, v in res["write_gate"].items():
        lines.append(f"Write gate ({k}): mean {v['gate_mean']:.4f}, std {v['gate_std']:.4f} "
                     f"(paper: {res['paper']['gate_mean']}, {res['paper']['gate_std']}).")
    return "\n".join(lines)


def bridge_report(res: dict, out_dir: Path) -> list[tuple[str, str]]:
    """The experiment's report sections (the demo's table entry)."""
    return bridge_sections(res)
