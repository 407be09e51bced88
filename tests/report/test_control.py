"""PVM's mechanism control: ablation arms (settings checked before any training), their labels in the report, and the
control's verdicts over seeds."""

import pytest

from keepsight.experiments.aggregate import aggregate
from keepsight.experiments.pvm_control import PVMControl
from keepsight.report.claims import claims_table
from keepsight.report.control import control_markdown
from keepsight.report.seeds import seeds_markdown, verdict_words


def test_an_ablation_arm_is_the_block_with_its_fields_replaced():
    exp = PVMControl(ablations={"pvm_sft_no_output_norm": {"output_norm": False}})
    assert exp.ablated("pvm_sft_no_output_norm").output_norm is False and exp.pvm.output_norm is True
    assert exp.to_dict()["ablations"] == {"pvm_sft_no_output_norm": {"output_norm": False}}
    assert "ablations" not in PVMControl().to_dict()  # no ablation: the control's record is unchanged


@pytest.mark.parametrize("ablations, match", [
    ({"pvm_sft": {"output_norm": False}}, "new arm name"),  # would overwrite the released arm's results
    ({"No Norm": {"output_norm": False}}, "new arm name"),
    ({"x": {"outptu_norm": False}}, "outptu_norm"),  # a typo: refused before anything trains
    ({"x": {"output_norm": "no"}}, "output_norm must be true or false"),
    ({"x": {"heads": 2}}, "heads"),
    ({"x": {}}, "fields it changes"),  # the released arm again under another name  # a branch-only field on the released block
])
def test_a_bad_ablation_is_refused_when_the_control_is_built(ablations, match):
    with pytest.raises(ValueError, match=match):
        PVMControl(ablations=ablations)


def _rate(acc):
    return {"acc": acc, "low": acc - 0.02, "high": acc + 0.02, "n": 200}


def _seed(text_only, pvm, ablated, lora):
    arms = {"base_with_image": 0.87, "base": text_only, "pvm_sft": pvm, "pvm_sft_no_output_norm": ablated,
            "lora": lora}
    return {"control": {
        "config": {"ablations": {"pvm_sft_no_output_norm": {"output_norm": False}}},
        "arms": {a: {"all": _rate(v), "colour": _rate(v)} for a, v in arms.items()},
        "ordinary": {a: {"all": _rate(v + 0.1)} for a, v in arms.items()},
        "open": {a: {"colour": _rate(v / 2)} for a, v in arms.items()},
        "verdict": {a: {"above_text_only": arms[a] - 0.02 > text_only + 0.02, "gain": arms[a] - text_only}
                    for a in ("pvm_sft", "pvm_sft_no_output_norm", "lora")}}}


def test_the_control_over_seeds_gives_each_arm_a_verdict_against_the_text_only_level():
    agg = aggregate([_seed(0.546, 0.550, 0.601, 0.571), _seed(0.550, 0.552, 0.610, 0.560),
                     _seed(0.540, 0.548, 0.598, 0.566)])
    v = {arm: m["yes_no_acc"] for arm, m in agg["verdicts"]["control"].items()}
    # 0.055-0.060 above the text-only level on every seed, each seed's Wilson intervals (+-0.02) apart
    assert v["pvm_sft_no_output_norm"] == {"over_seeds": 1, "per_seed": [1, 1, 1]}
    assert v["base_with_image"]["over_seeds"] == 1
    assert v["pvm_sft"] == {"over_seeds": 0, "per_seed": [0, 0, 0]}  # 0.002-0.008 above it: no seed separates
    # against the LoRA trained the same way (no path to the image): the PVM arms only
    vs_lora = agg["verdicts"]["control_vs_lora"]
    assert set(vs_lora) == {"pvm_sft", "pvm_sft_no_output_norm"}
    assert vs_lora["pvm_sft_no_output_norm"]["yes_no_acc"]["over_seeds"] == 1
    assert vs_lora["pvm_sft"]["yes_no_acc"] == {"over_seeds": 0, "per_seed": [0, 0, 0]}  # 0.008-0.021 below it
    assert agg["control"]["verdict.pvm_sft_no_output_norm.gain"]["values"] == pytest.approx([0.055, 0.060, 0.058])
    assert agg["control"]["open.lora.colour.acc"]["n"] == 3
    md = seeds_markdown(agg)
    assert "| control | pvm_sft_no_output_norm | yes_no_acc |" in md


def test_an_arm_above_the_text_only_level_on_each_seed_gets_that_verdict_when_the_mean_over_seeds_does_not():
    """Gains of 0.06 / 0.15 / 0.09, each seed's intervals apart: the t interval of three gains holds 0 (t = 4.30
    with 2 degrees of freedom), but every seed shows the effect on its own; the claims table says which."""
    seeds = [_seed(0.5, pvm, 0.5, 0.5) for pvm in (0.56, 0.65, 0.59)]
    agg = aggregate(seeds)
    v = agg["verdicts"]["control"]["pvm_sft"]["yes_no_acc"]
    assert v == {"over_seeds": 0, "per_seed": [1, 1, 1]}
    assert verdict_words(v) == "higher on each of the 3 seeds (each seed's own intervals apart)"
    assert verdict_words({"over_seeds": 0, "per_seed": [1, 0, 1]}) == "no verdict (higher on 2 of 3 seeds)"
    assert verdict_words({"over_seeds": 0, "per_seed": []}) == "no verdict (the paired difference holds 0)"
    rows = {r["claim"].split(" (")[0]: r for r in claims_table({**seeds[0], "aggregate": agg})}
    pvm = rows["Mechanism: PVM's memory alone carries the image"]
    assert pvm["verdict"] == "reproduced (higher on each of the 3 seeds (each seed's own intervals apart))"
    assert pvm["ours"] == "0.600 [0.486, 0.714] vs text only 0.500 [0.500, 0.500]"
    lora = rows["Mechanism control: the matched LoRA, with no path to the image, stays at the text-only level"]
    assert lora["verdict"] == "reproduced (no separable difference)"
    # one seed: its Wilson intervals, no verdict over seeds
    one = {r["claim"].split(" (")[0]: r for r in claims_table(_seed(0.5, 0.56, 0.5, 0.58))}
    assert one["Mechanism: PVM's memory alone carries the image"]["verdict"] == "reproduced (one seed)"
    assert one["Mechanism control: the matched LoRA, with no path to the image, stays at the text-only level"][
        "verdict"] == "not reproduced (one seed)"


def test_the_report_names_what_an_ablation_arm_changed():
    md = control_markdown(_seed(0.546, 0.550, 0.601, 0.571)["control"])
    assert "| + PVM stage 1 (output_norm=False), image withheld | 0.601 [0.581, 0.621] |" in md
    assert ("+ PVM stage 1 (output_norm=False), image withheld: +0.055 against the text-only level, above it; +0.030 "
            "against the LoRA, not above it") in md
    assert "+ PVM stage 1, image withheld: +0.004 against the text-only level, not above it; -0.021 against the LoRA" in md
    assert "+ LoRA (matched), image withheld: +0.025 against the text-only level, not above it (95% intervals)." in md
    # the ordinary set (the priors' lens) after the verdict, the open answers last
    assert md.index("prior-balanced") < md.index("ordinary yes/no set") < md.index("open answers")
    assert "| + LoRA (matched), image withheld | 0.671 [0.651, 0.691] |" in md
