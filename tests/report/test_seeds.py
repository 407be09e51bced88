"""Results over seeds for the arms that decode differently (PVM, the training-free baselines): each arm's accuracy as
text grows, with intervals over the seeds, its verdicts against the base, and the plot of both regimes."""

import pytest

from keepsight.experiments.aggregate import aggregate
from keepsight.profiles import PROFILES, RELEASED_BASELINES
from keepsight.report.seeds import description_rows, plot_seeds, seeds_markdown, seeds_sections, words_rows


def _rate(acc):
    return {"acc": acc, "low": acc - 0.03, "high": acc + 0.03}


def _arm(yes_no, after, words=57.0):
    return {"yes_no": {"overall_acc": yes_no, "categories": {"colour": {"acc": yes_no}}},
            "history": {"by_length": {"0": _rate(0.85), "15": _rate(after + 0.05)}, "drop": {"diff": 0.8 - after}},
            "after_description": {"none": _rate(0.85), "description": _rate(after), "oracle": _rate(0.8),
                                  "drop": {"diff": 0.85 - after}, "description_words": words},
            "descriptions": {"chair": {"chair_i": 0.01, "object_recall": 0.6}},
            "pope": {"adversarial": {"f1": yes_no}, "popular": {"f1": yes_no}}}


def _seed(shift):
    base, vcd, memvr = _arm(0.88 + shift, 0.60 + shift), _arm(0.80 + shift, 0.61 + shift), _arm(0.88 + shift,
                                                                                               0.60 + shift)
    pvm = {"comparison": {a: {"yes_no_acc": 0.88, "description_regime_acc": acc}
                          for a, acc in (("base", 0.6 + shift), ("pvm_grpo", 0.7 + shift))},
           "arms": {a: {"history": v["history"], "after_description": v["after_description"]}
                    for a, v in (("base", base), ("pvm_grpo", _arm(0.88, 0.7 + shift, words=20 + 100 * shift)))},
           "oracle": {"history": {"by_length": {"0": _rate(0.85), "15": _rate(0.8)}}}}
    # an arm whose name has a dot stays one arm (the aggregate's paths are dotted)
    return {"base": base, "pvm": pvm,
            "baselines": {"arms": {"base": base, "vcd": vcd, "memvr (threshold 0.5)": memvr}}}


def test_the_baselines_over_seeds_get_intervals_and_verdicts_against_the_base():
    agg = aggregate([_seed(0.0), _seed(0.01), _seed(-0.01)])
    v = agg["verdicts"]["baselines"]
    assert set(v) == {"vcd", "memvr (threshold 0_5)"}
    assert v["vcd"]["yes_no_acc"]["over_seeds"] == -1  # 0.80 against 0.88 on every seed
    # 0.61 / 0.62 / 0.60 against 0.60 / 0.61 / 0.59: the arms' intervals overlap, but the gain is 0.01 on every seed
    # (the paired difference has no width), which is what the verdict reads
    assert v["vcd"]["description_regime_acc"]["over_seeds"] == 1
    assert v["memvr (threshold 0_5)"]["pope_adversarial_f1"]["over_seeds"] == 0
    assert agg["baselines"]["arms.vcd.after_description.description.acc"]["values"] == pytest.approx([0.61, 0.62, 0.60])
    md = seeds_markdown(agg)
    assert "| baselines | vcd | yes_no_acc | 0.800 [0.775, 0.825] | base 0.880 [0.855, 0.905] |" in md
    assert "Training-free baselines: a visual question after the arm's own description" in md
    assert "| vcd | 0.850 [0.850, 0.850] | 0.610 [0.585, 0.635] | 0.800 [0.800, 0.800] |" in md
    assert ["pvm_grpo", "0.850 [0.850, 0.850]", "0.700 [0.675, 0.725]", "0.800 [0.800, 0.800]"] in description_rows(
        agg, "pvm")


def test_the_plot_over_seeds_draws_every_arm_and_needs_two_seeds(tmp_path):
    agg = aggregate([_seed(0.0), _seed(0.01), _seed(-0.01)])
    path = plot_seeds(agg, "pvm", tmp_path / "pvm.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    titles = [t for t, _ in seeds_sections(agg, tmp_path)]
    assert "Seeds: PVM arms as text grows" in titles and "Seeds: training-free baselines as text grows" in titles
    assert plot_seeds(aggregate([_seed(0.0)]), "pvm", tmp_path / "one.png") is None


def test_the_regime_profile_runs_every_arm_on_three_seeds_of_the_regime_recipe():
    p = PROFILES["regime"]
    assert p.seeds == (0, 1, 2) and p.train.preset == "tiny-llava-r300"
    assert p.pvm is not None and p.pvm.finetune is not None and p.pvm.grpo.steps > 0
    assert p.baselines.arms == RELEASED_BASELINES and all(settings == {} for _, settings in p.baselines.arms.values())
    assert p.control is not None and p.control.pvm == p.pvm.pvm  # the mechanism control of the same block


def test_each_arms_description_length_is_shown_beside_its_accuracy_after_it():
    # an arm that writes less has less text before its question: the words are reported per arm and per seed
    agg = aggregate([_seed(0.0), _seed(0.01), _seed(-0.01)])
    rows = words_rows(agg, "pvm")
    assert rows[0] == ["base", "57.0 [57.0, 57.0]", "57.0 / 57.0 / 57.0"]
    assert rows[1][0] == "pvm_grpo" and rows[1][2] == "20.0 / 21.0 / 19.0" and rows[1][1].startswith("20.0 [")
    md = seeds_markdown(agg)
    assert "PVM arms: words of the arm's own description" in md and "| pvm_grpo | 20.0 [" in md
    assert "words of its own description" in "".join(body for _, body in seeds_sections(agg))


def test_the_regime_describe_profile_keeps_the_arms_describing_beside_the_format():
    p = PROFILES["regime-describe"]
    assert p.train == PROFILES["regime"].train and p.seeds == (0, 1, 2)  # the regime profile's bases
    assert p.pvm.train_tasks == ("describe", "describe_ask") and not p.pvm.instruct_mix


def test_the_pvm_arms_are_also_compared_with_the_matched_lora():
    """PVM against the LoRA of the same size, layers, data and steps (no new path to the image), paired by seed."""
    def seed(pvm, lora):
        return {"pvm": {"comparison": {a: {"description_regime_acc": v, "history_long_acc": 0.7, "yes_no_acc": 0.88}
                                       for a, v in (("base", 0.6), ("lora", lora), ("pvm_sft", pvm),
                                                    ("pvm_grpo", pvm), ("full_ft", 0.8))}}}

    agg = aggregate([seed(0.705, 0.735), seed(0.600, 0.710), seed(0.760, 0.775)])
    v = agg["verdicts"]["pvm_vs_lora"]
    assert set(v) == {"pvm_sft", "pvm_grpo"}  # neither the base nor full fine-tuning
    assert v["pvm_sft"]["description_regime_acc"]["over_seeds"] == 0  # -0.030 / -0.110 / -0.015: the t interval holds 0
    assert v["pvm_sft"]["yes_no_acc"]["over_seeds"] == 0
    assert "| pvm | pvm_sft | description_regime_acc | 0.688 [" in seeds_markdown(agg) and "| lora 0.740 [" in seeds_markdown(agg)
