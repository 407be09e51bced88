"""The report's figure of accuracy as text grows: one line per arm with its interval, the oracle dashed, and the
generated-text regime beside the question-turn one."""

from PIL import Image

from keepsight.report.plots import plot_text_regimes


def _arm(acc0: float, acc15: float, with_description: bool = True) -> dict:
    hist = {"by_length": {"0": {"acc": acc0, "low": acc0 - 0.05, "high": acc0 + 0.05},
                          "15": {"acc": acc15, "low": acc15 - 0.06, "high": acc15 + 0.06}}}
    out = {"history": hist}
    if with_description:
        out["after_description"] = {k: {"acc": a, "low": a - 0.05, "high": a + 0.05}
                                    for k, a in (("none", acc0), ("description", acc15), ("oracle", acc0 - 0.05))}
    return out


def test_text_regime_plot_has_both_panels_when_the_description_regime_was_scored(tmp_path):
    both = plot_text_regimes({"base": _arm(0.85, 0.65), "+ PVM": _arm(0.86, 0.70)}, tmp_path / "both.png",
                             oracle_history=_arm(0.85, 0.75, False)["history"], title="t")
    one = plot_text_regimes({"base": _arm(0.85, 0.65, False)}, tmp_path / "one.png")
    wide, narrow = Image.open(both).size, Image.open(one).size
    assert wide[0] > 1.5 * narrow[0] and wide[1] == narrow[1]  # two panels side by side, or one
