import json

import pytest

from keepsight.world.dilution import early_late
from keepsight.world.rewards import answer_reward, completion_text, description_f1, format_reward

SCENE = {"objects": [
    {"row": 0, "col": 0, "shape": "circle", "colour": "red", "size": "small"},
    {"row": 1, "col": 2, "shape": "star", "colour": "blue", "size": "large"},
]}


def msg(text):
    return [{"role": "assistant", "content": text}]


def test_completion_text_reads_trl_completions():
    assert completion_text(msg(" yes ")) == "yes"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "red"}]}]) == "red"
    assert completion_text("two") == "two"


def test_description_f1_known_values():
    both = "this is a city scene . there are two objects . at a1 a small red circle . at b3 a large blue star ."
    assert description_f1(both, SCENE) == 1.0
    one = "this is a city scene . there are two objects . at a1 a small red circle ."
    assert description_f1(one, SCENE) == pytest.approx(2 * 1.0 * 0.5 / 1.5)  # p 1, r 1/2
    wrong = "at a1 a small red circle . at b3 a large red star . at d4 a small red circle ."
    assert description_f1(wrong, SCENE) == pytest.approx(2 * (1 / 3) * 0.5 / (1 / 3 + 0.5))
    repeated = "at a1 a small red circle . at a1 a small red circle ."
    assert description_f1(repeated, SCENE) == pytest.approx(2 * 0.5 * 0.5 / 1.0)  # a repeat is not right twice
    assert description_f1("nothing here", SCENE) == 0.0


def test_answer_and_format_rewards():
    kinds = ["yes_no", "colour", "cell", "describe", "count"]
    answers = ["yes", "red", "a small red circle", "", "two"]
    scene = json.dumps(SCENE)
    comps = [msg("yes"), msg("blue"), msg("a small red circle"),
             msg("this is a city scene . there are two objects . at a1 a small red circle ."), msg("two two")]
    r = answer_reward(comps, kind=kinds, answer=answers, scene=[scene] * 5)
    assert r[:3] == [1.0, 0.0, 1.0] and r[3] == pytest.approx(2 / 3) and r[4] == 0.0
    f = format_reward(comps, kind=kinds, answer=answers, scene=[scene] * 5)
    assert f == [1.0, 1.0, 1.0, 1.0, 0.0]
    bad = ["this is a city scene . there are two objects . at a1 a small red",  # unfinished clause
           "at a1 a small red circle .",  # no header
           "this is a city scene . there are two objects . at a1 a small red circle . at a1 a small red circle ."]
    assert format_reward([msg(t) for t in bad], kind=["describe"] * 3) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="unknown task kind 'poem'"):
        format_reward([msg("x")], kind=["poem"])


def test_early_late_split():
    scene = {"objects": [
        {"row": 0, "col": 0, "shape": "circle", "colour": "red", "size": "small"},
        {"row": 0, "col": 1, "shape": "star", "colour": "blue", "size": "large"},
        {"row": 1, "col": 0, "shape": "square", "colour": "green", "size": "small"},
        {"row": 1, "col": 1, "shape": "circle", "colour": "red", "size": "large"},
    ]}
    text = ("at a1 a small red circle . at a2 a large blue star . at b1 a small red square . "
            "at c3 a small red triangle .")
    r = early_late([text], [scene], split=2)
    assert r["split"] == 2
    assert r["early"] == {"mentions": 2, "chair_i": 0.0, "hallucination_rate": 0.0, "objects": 2, "recall": 1.0,
                          "exact_recall": 1.0}
    assert r["late"]["mentions"] == 2 and r["late"]["chair_i"] == 0.5 and r["late"]["hallucination_rate"] == 0.5
    assert r["late"]["recall"] == 0.5 and r["late"]["exact_recall"] == 0.0
    with pytest.raises(ValueError, match="split must be >= 1"):
        early_late([text], [scene], split=0)
