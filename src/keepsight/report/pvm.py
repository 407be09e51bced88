"""Report pieces for the PVM experiment: HTML sections and the Markdown summary (README's PVM table)."""

from __future__ import annotations

from pathlib import Path

from .html import fmt, img_tag, table
from .plots import plot_arms_by_index, plot_text_regimes

LABELS = {"base": "base", "pvm_sft": "+ PVM (stage 1 SFT)", "lora": "+ LoRA (matched control)",
          "pvm_grpo": "+ PVM (SFT + GRPO)", "full_ft": "full fine-tuning (reference)"}
# (row label, comparison key[, digits])
HEADLINE = (
    ("visual question, no history", "history_short_acc"), ("visual question after the longest history",
                                                             "history_long_acc"),
    ("drop, shortest -> longest history", "history_drop"),
    ("visual question after its own description", "description_regime_acc"),
    ("drop, no text -> after its own description", "description_regime_drop"),
    ("after its description, image shown again (oracle)", "description_regime_oracle_acc"),
    ("words of its own description (the text before that question)", "description_words", 1),
    ("no history: rel. change vs base", "history_short_rel_change"),
    ("longest history: rel. change vs base", "history_long_rel_change"),
    ("yes/no acc", "yes_no_acc"), ("open answers (mean)", "open_mean"), ("CHAIRi", "chair_i"),
    ("hallucination rate", "hallucination_rate"), ("object recall", "object_recall"),
    ("exact recall", "exact_recall"), ("early objects: exact recall", "early_exact_recall"),
    ("late objects: exact recall", "late_exact_recall"), ("early: rel. change vs base", "early_rel_change"),
    ("late: rel. change vs base", "late_rel_change"), ("early: hallucination rate", "early_hallucination_rate"),
    ("late: hallucination rate", "late_hallucination_rate"), ("Omega_V log-log slope", "omega_v_slope"),
    ("TVR plateau", "tvr_plateau"), ("LogitLens convergence layer", "logitlens_convergence_layer"),
)


def _gate_rows(training: dict) -> list[list]:
    rows = []
    for stage, key in (("stage 1 (SFT)", "pvm_sft"), ("stage 2 (GRPO)", "pvm_grpo")):
        s = training[key]
        for layer, after in s["after"].items():
            before = s["before"][layer]
            rows.append([stage, layer, before["gate_mean"], after["gate_mean"], before["relative_norm"],
                         after["relative_norm"], before.get("entropy"), after.get("entropy"), after.get("max_entropy"),
                         before.get("query_tv"), after.get("query_tv")])
    return rows


def pvm_sections(res: dict, plot: Path, text_plot: Path | None = None) -> list[tuple[str, str]]:
    comp, tr, paper = res["comparison"], res["training"], res["paper"]
    arms = list(comp)
    rows = [[label] + [fmt(comp[a][key], *digits) for a in arms] for label, key, *digits in HEADLINE]
    cats = list(comp["base"]["yes_no_by_category"])
    cat_rows = [[c] + [comp[a]["yes_no_by_category"][c] for a in arms] for c in cats]
    split = res["arms"]["base"]["dilution"]["early_late"]["split"]
    n_obj = res["arms"]["base"]["dilution"]["n_objects"]
    lora, grpo = tr["lora"], tr["pvm_grpo"]
    rew = [[r.get("step"), r.get("reward"), r.get("rewards/answer_reward/mean"), r.get("rewards/format_reward/mean"),
            r.get("kl"), r.get("completions/mean_length")] for r in grpo["rewards"]]
    intro = (
        f"<p>Arms from the same base, trained on the same scenes (the base's instruct mix, multi-turn conversations "
        f"included): PVM stage 1 ({tr['pvm_sft']['train']['steps']} steps, backbone frozen), a LoRA on the same "
        f"layers with rank {lora['rank']} ({lora['lora_parameters']} parameters vs PVM's {lora['pvm_parameters']}) "
        f"for the same steps, PVM stage 1 + GRPO ({grpo['train']['steps']} steps, "
        f"{grpo['train']['num_generations']} completions a prompt, KL beta {grpo['train']['beta']} to the stage-1 "
        f"model){', and full fine-tuning as the upper reference' if 'full_ft' in tr else ''}. The visual question: "
        f"one fixed yes/no question per held-out scene, asked after 0 .. h turns of other questions about the same "
        f"image (short vs long; the paper's short / long answers). Early / late: objects at index &lt; {split} / "
        f"&ge; {split} of {n_obj} in the description. The paper (Qwen3-VL, real benchmarks): "
        f"+{paper['avg_gain_8b']} pts average (8B), +{100 * paper['short_rel']:.1f}% relative on short answers, "
        f"+{100 * paper['long_rel']:.1f}% on long ones, and earlier LogitLens convergence.</p>"
    )
    return [
        ("PVM: the arms", intro + table(["measure"] + [LABELS[a] for a in arms], rows)
         + img_tag(plot.read_bytes(), "exact accuracy by index per arm")),
        ("PVM: accuracy of a visual question as text grows",
         (img_tag(text_plot.read_bytes(), "accuracy as text grows, per arm") if text_plot else "")
         + table(["arm"] + [f"h = {h}" for h in res["arms"]["base"]["history"]["lengths"]],
               [[LABELS[a]] + [res["arms"][a]["history"]["by_length"][str(h)]["acc"]
                               for h in res["arms"][a]["history"]["lengths"]] for a in arms])),
        ("PVM: yes/no accuracy by category", table(["category"] + [LABELS[a] for a in arms], cat_rows)),
        ("PVM: gates, ||PVM out|| / ||FFN out|| and the retrieval before and after each stage",
         "<p>Retrieval entropy equal to ln M is a uniform mean-pool of the visual tokens; query dependence is the "
         "mean total-variation distance between two text positions' retrieval distributions (0: every position "
         "retrieves the same).</p>"
         + table(["stage", "layer", "gate before", "gate after", "rel. norm before", "rel. norm after",
                  "entropy before", "entropy after", "ln M", "query dep. before", "query dep. after"],
                 _gate_rows(tr))),
        ("PVM: GRPO rewards during training",
         table(["step", "reward", "answer reward", "format reward", "KL", "completion length"], rew)),
    ]


def pvm_markdown(res: dict) -> str:
    comp = res["comparison"]
    arms = list(comp)
    config = res.get("config", {})
    extra = config.get("train_tasks")
    data = f"the base's instruct mix + {', '.join(extra)}" if extra else "the base's instruct mix"
    if extra and config.get("instruct_mix") is False:
        data = f"{', '.join(extra)} alone"
    lines = ["", f"PVM experiment (same base, data and step budget per arm; every trained arm learns from {data}):", "",
             "| measure | " + " | ".join(LABELS[a] for a in arms) + " |",
             "| --- | " + " | ".join("---" for _ in arms) + " |"]
    for label, key, *digits in HEADLINE:
        lines.append(f"| {label} | " + " | ".join(fmt(comp[a][key], *digits) for a in arms) + " |")
    lines += ["", "Is the branch looking things up? Retrieval entropy (ln M: a uniform mean-pool) and query dependence "
              "(mean total-variation distance between positions' retrieval distributions), before stage 1 / after "
              "each stage:", "",
              "| layer | gate after SFT | gate after GRPO | rel. norm after SFT | rel. norm after GRPO | entropy at init "
              "| entropy after SFT | entropy after GRPO | ln M | query dep. at init | after SFT | after GRPO |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    init = res["training"]["pvm_sft"]["before"]
    sft, grpo = res["training"]["pvm_sft"]["after"], res["training"]["pvm_grpo"]["after"]
    for layer in sft:
        a, b, c = init[layer], sft[layer], grpo[layer]
        lines.append(f"| {layer} | {fmt(b['gate_mean'])} | {fmt(c['gate_mean'])} | {fmt(b['relative_norm'])} | "
                     f"{fmt(c['relative_norm'])} | {fmt(a.get('entropy'))} | {fmt(b.get('entropy'))} | "
                     f"{fmt(c.get('entropy'))} | {fmt(b.get('max_entropy'))} | {fmt(a.get('query_tv'))} | "
                     f"{fmt(b.get('query_tv'))} | {fmt(c.get('query_tv'))} |")
    oracle = res.get("oracle")
    if oracle:
        lines += ["", "The history regime's oracle (the base asked with the image again just before the question): "
                  "does access to the image limit the regime?", "",
                  "| | accuracy, no history | after the longest history | drop [95% interval] |",
                  "| --- | --- | --- | --- |",
                  f"| base | {fmt(comp['base']['history_short_acc'])} | {fmt(oracle['base_long_acc'])} | "
                  f"{fmt(oracle['base_drop'])} [{fmt(oracle['base_drop_interval'][0])}, "
                  f"{fmt(oracle['base_drop_interval'][1])}] |",
                  f"| base, image re-inserted | {fmt(oracle['short_acc'])} | {fmt(oracle['long_acc'])} | "
                  f"{fmt(oracle['drop'])} [{fmt(oracle['drop_interval'][0])}, {fmt(oracle['drop_interval'][1])}] |",
                  "", f"The re-inserted image changes accuracy after the longest history by {fmt(oracle['recovered'])}"
                  + (f" [{fmt(oracle['recovered_interval'][0])}, {fmt(oracle['recovered_interval'][1])}], paired by "
                     f"scene: {fmt(oracle['recovered_share'])} of the base's drop."
                     if oracle.get("recovered_interval") else ".")]
    tr = res["training"]
    first, last = tr["pvm_grpo"]["first_reward"] or {}, tr["pvm_grpo"]["last_reward"] or {}
    lines += ["", f"LoRA control: rank {tr['lora']['rank']}, {tr['lora']['lora_parameters']} parameters "
                  f"(PVM {tr['lora']['pvm_parameters']}). GRPO reward {fmt(first.get('reward'))} (first log) -> "
                  f"{fmt(last.get('reward'))} (last log)."]
    return "\n".join(lines)


def pvm_report(res: dict, out_dir: Path) -> list[tuple[str, str]]:
    """The experiment's report sections, with the exact-accuracy-by-index plot per arm (the demo's table entry)."""
    k = res["arms"]["base"]["dilution"]["n_objects"]
    plot = plot_arms_by_index({a: v["dilution"]["by_index"] for a, v in res["arms"].items()},
                              Path(out_dir) / "pvm_by_index.png", f"exact accuracy by index, {k} objects")
    oracle = (res.get("oracle") or {}).get("history")
    text_plot = plot_text_regimes({LABELS.get(a, a): v for a, v in res["arms"].items()},
                                  Path(out_dir) / "pvm_text_regimes.png", oracle,
                                  "a visual yes/no question as text grows, per arm")
    return pvm_sections(res, plot, text_plot)
