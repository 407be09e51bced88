import pytest

from keepsight.metrics import (
    distinct_n,
    normalise_answer,
    rep_n,
    repetition_ratio,
    yes_no_scores,
)


def test_distinct_n_repetition_rep_n():
    assert distinct_n(["a b a b", "a b"], 1) == pytest.approx(2 / 6)
    assert distinct_n(["a b a b", "a b"], 2) == pytest.approx(2 / 4)  # ab ba ab | ab
    assert distinct_n([[1, 2, 3]], 2) == 1.0
    assert distinct_n(["a"], 2) == 0.0
    assert repetition_ratio("the the the cat") == pytest.approx(2 / 4)
    assert repetition_ratio([]) == 0.0
    assert rep_n("a b a b", 2) == pytest.approx(1 - 2 / 3)
    assert rep_n("a b c", 1) == 0.0
    with pytest.raises(ValueError):
        distinct_n(["a"], 0)


def test_yes_no_scores_mme_style():
    recs = [
        {"image": "i1", "category": "colour", "answer": "yes", "prediction": "Yes."},
        {"image": "i1", "category": "colour", "answer": "no", "prediction": "no"},
        {"image": "i2", "category": "colour", "answer": "yes", "prediction": "yes"},
        {"image": "i2", "category": "colour", "answer": "no", "prediction": "yes"},
        {"image": "i1", "category": "scene", "answer": "yes", "prediction": "maybe"},
        {"image": "i1", "category": "scene", "answer": "no", "prediction": "no"},
    ]
    r = yes_no_scores(recs)
    assert r["categories"]["colour"]["acc"] == pytest.approx(3 / 4)
    assert r["categories"]["colour"]["acc_plus"] == pytest.approx(1 / 2)
    assert r["categories"]["colour"]["score"] == pytest.approx(125.0)
    assert r["categories"]["scene"]["acc"] == pytest.approx(1 / 2)
    assert r["categories"]["scene"]["acc_plus"] == 0.0
    assert r["total"] == pytest.approx(175.0)
    assert r["overall_acc"] == pytest.approx(4 / 6)
    assert normalise_answer("  Yes, it is") == "yes"
    with pytest.raises(ValueError, match="expected 'yes' or 'no'"):
        yes_no_scores([{"image": "i", "category": "c", "answer": "maybe", "prediction": "yes"}])
    with pytest.raises(ValueError, match="lacks"):
        yes_no_scores([{"image": "i"}])
    with pytest.raises(ValueError, match="no yes/no records"):
        yes_no_scores([])


@pytest.mark.parametrize("text, readings", [
    # text: (pope, opera, keepsight, first_word, mention)
    ("There is no dog.", ("no", "no", "no", None, "no")),
    ("Yes, it is", ("yes", "yes", "yes", "yes", "yes")),
    ("No.", ("no", "no", "no", "no", "no")),
    ("NO", ("yes", "no", "no", "no", "no")),
    ("It is not there", ("no", "no", "no", None, None)),
    ("There isn't one", ("yes", "no", None, None, None)),
    ("I cannot tell", ("yes", "yes", None, None, None)),
    ("", ("yes", "yes", None, None, None)),
])
def test_one_yes_no_parser_with_named_rules(text, readings):
    from keepsight.metrics import YES_NO_RULES, parse_yes_no

    assert YES_NO_RULES == ("pope", "opera", "keepsight", "first_word", "mention")
    assert tuple(parse_yes_no(text, rule) for rule in YES_NO_RULES) == readings
    assert parse_yes_no(text, "first") == readings[2]  # the earlier name of "keepsight"


def test_the_scorers_read_yes_no_by_their_rules():
    from keepsight.metrics.answers import match
    from keepsight.metrics.pope import parser_name

    record = {"image": "s0", "category": "existence", "answer": "no", "prediction": "There is no dog."}
    assert yes_no_scores([record])["overall_acc"] == 0.0  # the world's rule: the first word answers
    assert match("yesno", "There is no dog.", "no")  # eval score: the first yes / no mentioned
    with pytest.raises(ValueError, match="unknown yes/no parsing rule 'mention'"):
        parser_name("mention")  # POPE offers its own three rules only
    with pytest.raises(ValueError, match=r"expected one of \['pope', 'opera', 'keepsight', 'first_word'"):
        from keepsight.metrics import parse_yes_no

        parse_yes_no("yes", "llava")


def test_a_wilson_interval_holds_its_rate_at_the_ends():
    from keepsight.metrics import wilson
    for n in (1, 7, 52, 320, 4800):
        for k in (0, 1, n // 2, n - 1, n):
            low, high = wilson(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0
    assert wilson(320, 320)[1] == 1.0 and wilson(0, 320)[0] == 0.0  # exact at the ends (rounding once gave 1 - 1e-16)


def test_median_ci_is_the_order_statistic_interval():
    """The textbook order-statistic intervals for a median (n = 9: the 2nd and 8th values, 96.1%; n = 15: the 4th and
    12th, 96.5%); too few values for 95% give no interval; the coverage is at least the level for every n."""
    import math

    from keepsight.metrics.stats import median_ci

    nine = median_ci([9, 1, 8, 2, 7, 3, 6, 4, 5])
    assert (nine["median"], nine["low"], nine["high"]) == (5, 2, 8) and abs(nine["coverage"] - 0.9609375) < 1e-12
    fifteen = median_ci(range(1, 16))
    assert (fifteen["low"], fifteen["high"]) == (4, 12) and abs(fifteen["coverage"] - 0.96484375) < 1e-12
    assert median_ci([1, 2, 3, 4, 5])["low"] is None and median_ci([])["median"] is None
    for n in range(6, 60):
        c = median_ci(range(n))
        k = int(c["low"]) + 1  # the k-th smallest value
        assert c["coverage"] >= 0.95 and c["high"] == n - k
        widened_tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n  # one step tighter would fall below 95%
        assert 1 - 2 * widened_tail < 0.95
