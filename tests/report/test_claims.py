"""The claims table and the aggregate over seeds it reads: verdicts from several seeds, none from one, the
diffusion claims only where the model describes."""

import pytest


def test_aggregate_over_seeds_gives_intervals_paired_differences_and_verdicts():
    from keepsight.experiments.aggregate import aggregate
    from keepsight.report.seeds import seeds_markdown

    def seed(base_acc, pvm_acc):
        cmp = {arm: {"yes_no_acc": acc, "history_short_acc": acc, "history_long_acc": acc - 0.1,
                     "history_drop": 0.1, "object_recall": 0.5, "exact_recall": 0.2, "late_exact_recall": 0.1}
               for arm, acc in (("base", base_acc), ("pvm_sft", pvm_acc))}
        hist = {arm: {"history": {"by_length": {"0": {"acc": acc}, "15": {"acc": acc - 0.1}}}}
                for arm, acc in (("base", base_acc), ("pvm_sft", pvm_acc))}
        base = {"yes_no": {"overall_acc": base_acc, "categories": {"count": {"acc": 0.55}}}}
        return {"base": base, "pvm": {"comparison": cmp, "arms": hist}}

    agg = aggregate([seed(0.70, 0.90), seed(0.71, 0.91), seed(0.72, 0.92)])
    assert agg["n_seeds"] == 3
    assert agg["base"]["yes_no.overall_acc"]["values"] == [0.70, 0.71, 0.72]
    # 0.2 above the base on every seed; no per-seed verdicts (the comparison has no intervals within a seed)
    assert agg["verdicts"]["pvm"]["pvm_sft"]["yes_no_acc"] == {"over_seeds": 1, "per_seed": []}
    assert agg["verdicts"]["pvm"]["pvm_sft"]["history_drop"]["over_seeds"] == 0  # equal drops: no verdict
    md = seeds_markdown(agg)
    assert "| yes/no, all | 0.710 [0.685, 0.735] | 0.700 / 0.710 / 0.720 |" in md
    # the per-seed differences are all 0.2: the paired interval has no width
    assert "| pvm | pvm_sft | yes_no_acc | 0.910 [0.885, 0.935] | base 0.710 [0.685, 0.735] | 0.200 [0.200, 0.200] | higher |" in md
    assert "| base | 0.710 | 0.610 |" in md and "| pvm_sft | 0.910 | 0.810 |" in md


def test_diffusion_claims_need_a_model_that_describes():
    from keepsight.report.claims import _diffusion_claims

    def row(steps, method, recall, rep, share):
        return {"steps": steps, "method": method, "object_recall": recall, "repetition_ratio": rep,
                "repeats_in_mask_top10": share, "distinct_2": 0.03, "chair_i": 0.0}

    methods = ("none", "mps", "mrs", "both")
    weak = {"grid": [row(t, m, 0.0, (0.2 if m == "mps" else 0.3) if t == 4 else 0.02, 0.97)
                     for t in (4, 64) for m in methods]}
    rows = {r["claim"]: r for r in _diffusion_claims(weak, "diffusion")}
    rising = rows["MPS/MRS: repetition rises as the steps T fall (no fix)"]
    assert rising["verdict"] == "partly (the model describes poorly: object recall 0.000 at T = 64)"
    assert rows["MPS (papers' settings) lowers repetition at few steps"]["verdict"].startswith("partly (one seed")
    assert rows["MRS (papers' settings) lowers repetition at few steps"]["verdict"] == "not reproduced (no change)"
    assert not any("CHAIR" in c for c in rows)  # no CHAIR claim from a model that does not describe
    describing = {"grid": [row(t, m, 0.5, 0.2 if t == 4 else 0.01, 0.97) for t in (4, 64) for m in methods]}
    verdicts = {r["claim"].split(":")[0]: r["verdict"] for r in _diffusion_claims(describing, "diffusion")}
    assert verdicts["MPS/MRS"] == "reproduced" and verdicts["MPS"] == "reproduced"


def test_diffusion_fix_claims_are_read_at_the_fewest_steps_that_still_describe():
    from keepsight.report.claims import DESCRIBES, _diffusion_claims

    recall = {4: 0.0, 16: DESCRIBES / 2, 32: DESCRIBES + 0.05, 64: 0.2}  # describes from T = 32 on

    def row(steps, method):
        better = method in ("mps", "both") and steps == 32  # MPS helps only at T = 32
        return {"steps": steps, "method": method, "object_recall": recall[steps], "repeats_in_mask_top10": 0.9,
                "repetition_ratio": 0.3 if steps == 4 else 0.05, "distinct_2": 0.2 if better else 0.1,
                "chair_i": 0.1}

    res = {"grid": [row(t, m) for t in recall for m in ("none", "mps", "mrs", "both")]}
    rows = {r["claim"]: r for r in _diffusion_claims(res, "diffusion")}
    rising = rows["MPS/MRS: repetition rises as the steps T fall (no fix)"]
    assert rising["verdict"] == "reproduced" and "0.050 at T = 32, the fewest steps with recall" in rising["ours"]
    mps = rows["MPS (papers' settings) raises distinct-n and lowers CHAIR at few steps"]
    assert "(T = 32, one seed)" in mps["ours"] and mps["verdict"] == "reproduced (one seed)"
    mrs = rows["MRS (papers' settings) raises distinct-n and lowers CHAIR at few steps"]
    assert mrs["verdict"] == "not reproduced (no change)"


def test_claims_name_the_profile_that_produced_them():
    from keepsight.report.claims import claims_table

    res = {"profile": "extended", "base": {"diagnosis": {"slope": -0.5, "tvr_plateau": 7.0}}}
    demo = [r["command"] for r in claims_table(res) if not r["command"].startswith("pytest")]
    assert len(demo) == 2 and set(demo) == {"keepsight demo --profile extended"}
    full = {r["command"] for r in claims_table({**res, "profile": "full"}) if not r["command"].startswith("pytest")}
    assert full == {"keepsight demo"}


def test_description_regime_claims_from_one_seed_and_from_several():
    from keepsight.experiments.aggregate import aggregate
    from keepsight.report.claims import claims_table

    def seed(drop, recovery, base_acc, pvm_acc):
        ad = {"none": {"acc": 0.85}, "description": {"acc": 0.85 - drop}, "oracle": {"acc": 0.85 - drop + recovery},
              "drop": {"diff": drop, "low": drop - 0.07, "high": drop + 0.07},
              "recovery": {"diff": recovery, "low": recovery - 0.07, "high": recovery + 0.07},
              "recovered_share": recovery / drop}
        cmp = {arm: {"description_regime_acc": acc} for arm, acc in (("base", base_acc), ("pvm_grpo", pvm_acc))}
        paper = {"long_rel": 0.273, "short_rel": 0.061}
        return {"base": {"after_description": ad}, "pvm": {"comparison": cmp, "paper": paper}}

    one = seed(0.2, 0.05, 0.65, 0.66)
    rows = {r["claim"].split(" (")[0]: r for r in claims_table(one)}
    premise = rows["Premise: a visual answer degrades after the model's own description"]
    assert premise["ours"] == "+0.200 [+0.130, +0.270] (one seed)" and premise["verdict"] == "no verdict (one seed)"
    claim = "PVM (SFT + GRPO) improves a visual answer after the model's own description"
    pvm = {r["claim"]: r for r in claims_table(one)}[claim]
    assert pvm["ours"] == "0.660 vs base 0.650" and pvm["verdict"] == "no verdict (one seed)"
    seeds = [seed(0.20, 0.05, 0.65, 0.75), seed(0.21, -0.04, 0.66, 0.76), seed(0.19, 0.00, 0.64, 0.74)]
    res = {**seeds[0], "aggregate": aggregate(seeds)}
    rows = {r["claim"].split(" (")[0]: r for r in claims_table(res)}
    assert rows["Premise: a visual answer degrades after the model's own description"]["verdict"] == "reproduced"
    limited = rows["Premise: access to the image limits that regime"]
    assert limited["verdict"] == "not reproduced (interval includes 0)" and limited["ours"].startswith("0.003 [")
    # drops of 0.10 / 0.45 / 0.12, each with its interval above 0: the t interval of three drops holds 0, each seed
    # alone shows it; recoveries above 0 on two seeds of three
    spread = [seed(0.10, 0.09, 0.65, 0.65), seed(0.45, 0.44, 0.66, 0.66), seed(0.12, 0.05, 0.64, 0.64)]
    agg = aggregate(spread)
    assert agg["seed_intervals"]["base"]["after_description.drop"][1]["low"] == pytest.approx(0.38)
    rows = {r["claim"].split(" (")[0]: r for r in claims_table({**spread[0], "aggregate": agg})}
    premise = rows["Premise: a visual answer degrades after the model's own description"]
    assert premise["ours"].startswith("0.223 [-0.") and premise["verdict"] == (
        "reproduced on each of the 3 seeds (each seed's own interval above 0)")
    assert rows["Premise: access to the image limits that regime"]["verdict"] == (
        "partly (2 of 3 seeds' own intervals above 0)")
    assert {r["claim"]: r for r in claims_table(res)}[claim]["verdict"] == "reproduced (higher)"


def test_diffusion_claims_from_training_seeds_read_the_paired_intervals():
    """With several training seeds the MPS / MRS claims are verdicts from the paired differences over the seeds:
    MPS raising repetition on every seed is "higher", MRS's noise around no method is no separable difference."""
    from keepsight.experiments.diffusion import over_seeds
    from keepsight.report.claims import _diffusion_claims
    from keepsight.report.diffusion import diffusion_markdown

    def row(steps, method, seed, above=0.1):
        rep = 0.2 + 0.01 * seed if steps == 4 else 0.01 * seed
        rep += {"mps": 0.3, "both": 0.3, "mrs": 0.002 * (seed - 1)}.get(method, 0.0)
        return {"steps": steps, "method": method, "object_recall": 0.4 + 0.01 * seed, "repetition_ratio": rep,
                "repeats_in_mask_top10": 0.97 + 0.01 * seed, "distinct_2": 0.03 - (0.01 if method == "mps" else 0.0),
                "chair_i": 0.2, "hallucination_rate": 0.5, "exact_recall": 0.1, "seconds": 1.0,
                "object_recall_above_chance": above + 0.01 * seed}

    runs = [{"grid": [row(t, m, s) for t in (4, 64) for m in ("none", "mps", "mrs", "both")], "sweeps": []}
            for s in range(3)]
    res = {"grid": runs[0]["grid"], "over_seeds": over_seeds(runs)}
    rows = {r["claim"]: r for r in _diffusion_claims(res, "diffusion")}
    rising = rows["MPS/MRS: repetition rises as the steps T fall (no fix)"]
    assert rising["verdict"] == "reproduced" and "difference 0.200 [0.200, 0.200] (3 seeds)" in rising["ours"]
    # a recall of 0.4 that is what as many cells drawn at random would name is no describing
    guessing = [{"grid": [row(t, m, s, above=-0.01) for t in (4, 64) for m in ("none", "mps", "mrs", "both")],
                 "sweeps": []} for s in range(3)]
    rows_guessing = {r["claim"]: r for r in _diffusion_claims({"grid": guessing[0]["grid"],
                                                              "over_seeds": over_seeds(guessing)}, "diffusion")}
    assert rows_guessing["MPS/MRS: repetition rises as the steps T fall (no fix)"]["verdict"] == (
        "partly (the model describes poorly: object recall 0.410 [0.385, 0.435] at T = 64, 0.000 [-0.025, 0.025] "
        "above chance)")
    assert rows["MPS: repeated tokens are the mask prior's top tokens"]["verdict"] == "reproduced"
    assert rows["MPS (papers' settings) lowers repetition at few steps"]["verdict"] == "not reproduced (higher)"
    assert rows["MRS (papers' settings) lowers repetition at few steps"]["verdict"] == (
        "not reproduced (no separable difference)")
    mps = rows["MPS (papers' settings) raises distinct-n and lowers CHAIR at few steps"]
    assert mps["verdict"] == "not reproduced (distinct-2 lower, CHAIRi no separable difference)"
    md = diffusion_markdown({**res, "config": {"train": {"answer_length": 64}, "sweep_steps": 4}, "sweeps": [],
                             "prior_cosine": {"none": []}, "mask_prior_top10": ["a"]})
    assert "| 4 | mps | 0.510 [0.485, 0.535] | 0.020 [0.020, 0.020] | 0.200 [0.200, 0.200] |" in md
