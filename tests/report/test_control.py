"""PVM's mechanism control: ablation arms (settings checked before any training), their labels in the report, and the
control's verdicts over seeds."""

import pytest

from keepsight.experiments.aggregate import aggregate
from keepsight.experiments.pvm_control import PVMControl
from keepsight.report.control import control_markdown
from keepsight.report.seeds import seeds_markdown


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
    v = agg["verdicts"]["control"]
    assert v["pvm_sft_no_output_norm"]["yes_no_acc"] == 1 and v["base_with_image"]["yes_no_acc"] == 1
    assert v["pvm_sft"]["yes_no_acc"] == 0  # within the text-only level's interval over seeds
    # against the LoRA trained the same way (no path to the image): the PVM arms only
    assert set(agg["verdicts"]["control_vs_lora"]) == {"pvm_sft", "pvm_sft_no_output_norm"}
    assert agg["verdicts"]["control_vs_lora"]["pvm_sft_no_output_norm"]["yes_no_acc"] == 1
    assert agg["verdicts"]["control_vs_lora"]["pvm_sft"]["yes_no_acc"] == 0
    assert agg["control"]["verdict.pvm_sft_no_output_norm.gain"]["values"] == pytest.approx([0.055, 0.060, 0.058])
    assert agg["control"]["open.lora.colour.acc"]["n"] == 3
    md = seeds_markdown(agg)
    assert "| control | pvm_sft_no_output_norm | yes_no_acc |" in md


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
