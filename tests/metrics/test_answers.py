"""Short-answer matching (the same rules score predictions and reward GRPO on a user's data), on hand-made cases."""

import math

import pytest

from keepsight.metrics.answers import match, normalise, score_records
from keepsight.train.rewards import completion_text, load_reward, match_reward


@pytest.mark.parametrize("kind, answer, reference, ok", [
    ("exact", "The Red  circle.", "red circle", True),
    ("exact", "a red circle", "blue circle", False),
    ("yesno", "Yes, there is.", "yes", True),
    ("yesno", "there is none, no", "yes", False),
    ("yesno", "maybe", "no", False),
    ("choice", "(B) a cat", "B", True),
    ("choice", "B.", "b", True),  # a one-letter reference is its letter in any case
    ("choice", "I think it is C", "C", True),  # "I" is a word, not the option
    ("choice", "A cat, so (D)", "D", True),
    ("choice", "A", "A", True),
    ("choice", "The answer is C", "C", True),
    ("choice", "A", "B", False),
    ("numeric", "about 3 objects", "3", True),
    ("numeric", "1,000", "1000.0", True),
    ("numeric", "2.5", "2.50001", False),
    ("numeric", "none", "3", False),
])
def test_match(kind, answer, reference, ok):
    assert match(kind, answer, reference) is ok


def test_normalise_and_errors():
    assert normalise("An apple, THE pear!") == "apple pear"
    with pytest.raises(ValueError, match="holds no yes or no"):
        match("yesno", "yes", "perhaps")
    with pytest.raises(ValueError, match="holds no option letter"):
        match("choice", "B", "the second one")
    with pytest.raises(ValueError, match="unknown answer kind"):
        match("fuzzy", "a", "b")


def test_score_records_by_category_with_intervals():
    records = [{"id": str(i), "answer": a, "reference": r, "category": c} for i, (a, r, c) in enumerate([
        ("yes", "yes", "colour"), ("no", "yes", "colour"), ("yes", "no", "count"), ("no", "no", "count"),
        ("no", "no", "count"), ("hmm", "yes", "count")])]
    out = score_records(records, "yesno")
    assert out["overall"]["correct"] == 3 and out["overall"]["n"] == 6
    assert out["categories"]["colour"]["accuracy"] == 0.5 and out["categories"]["count"]["correct"] == 2
    assert out["yes_ratio"] == 2 / 6 and out["unparsed"] == 1
    low, high = out["overall"]["low"], out["overall"]["high"]
    assert 0 < low < 0.5 < high < 1 and not math.isnan(low)
    with pytest.raises(ValueError, match="prediction 0 .* 'answer' and 'reference'"):
        score_records([{"id": "x", "answer": "yes"}], "yesno")


def test_rewards_read_trl_completions_and_user_functions():
    reward = match_reward("exact")
    completions = [[{"role": "assistant", "content": "Red."}], "blue", [{"role": "assistant",
                                                                      "content": [{"type": "text", "text": "red"}]}]]
    assert reward(completions, answer=["red", "red", "red"]) == [1.0, 0.0, 1.0]
    assert completion_text(completions[2]) == "red"
    assert load_reward("keepsight.world.rewards:format_reward").__name__ == "format_reward"  # a TRL reward
    with pytest.raises(ValueError, match="cannot import 'nope'"):
        load_reward("math:nope")
    with pytest.raises(ValueError, match="unknown reward 'fuzzy'"):
        load_reward("fuzzy")


def test_a_reward_without_trls_signature_is_refused_before_any_loading():
    with pytest.raises(ValueError, match=r"--reward math:sqrt: a reward takes TRL's keyword arguments"):
        load_reward("math:sqrt")
    with pytest.raises(ValueError, match="declare \\*\\*kwargs"):
        load_reward("keepsight.train.rewards:completion_text")  # one positional argument
    from keepsight.world.rewards import answer_reward

    assert load_reward("keepsight.world.rewards:answer_reward") is answer_reward  # completions=..., **_
