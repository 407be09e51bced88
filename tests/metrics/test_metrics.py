import pytest

from keepsight.metrics import (
    accuracy_by_index,
    chair,
    distinct_n,
    normalise_answer,
    rep_n,
    repetition_ratio,
    slope,
    yes_no_scores,
)


def obj(shape, colour, size, row, col):
    return {"shape": shape, "colour": colour, "size": size, "row": row, "col": col}


SCENE = {
    "scene": "beach",
    "preferred_colour": "red",
    "preferred_shape": "circle",
    "objects": [
        obj("circle", "red", "small", 0, 0),  # a1
        obj("square", "blue", "large", 0, 2),  # a3
        obj("star", "red", "large", 1, 1),  # b2
        obj("circle", "green", "small", 2, 3),  # c4
    ],
}


def test_chair_perfect_description():
    text = ("this is a beach scene . there are four objects . at a1 a small red circle . "
            "at a3 a large blue square . at b2 a large red star . at c4 a small green circle .")
    r = chair([text], [SCENE])
    assert r["mentions"] == 4
    assert r["chair_i"] == 0 and r["chair_s"] == 0 and r["hallucination_rate"] == 0
    assert r["recall"] == 1 and r["object_recall"] == 1 and r["exact_recall"] == 1
    assert r["attribute_error_rate"] == 0 and r["repeated_mentions"] == 0


def test_chair_hallucinations_attribute_errors_and_repeats():
    text = ("this is a beach scene . at a1 a small red circle . at a1 a small red circle . "  # repeat
            "at a3 a large blue triangle . "  # wrong shape, and triangle is not in the scene at all
            "at d4 a large red diamond . "  # empty cell, diamond absent: hallucination at both levels
            "at b2 a small red star .")  # wrong size
    r = chair([text, "this is a beach scene ."], [SCENE, SCENE])
    assert r["mentions"] == 5
    # category level: triangle and diamond are not in the scene -> 2 of 5 mentions, 1 of 2 descriptions
    assert r["chair_i"] == pytest.approx(2 / 5)
    assert r["chair_s"] == pytest.approx(1 / 2)
    # categories covered: circle, star of {circle, square, star} in the first; none in the second
    assert r["recall"] == pytest.approx(2 / 6)
    # instance level: only d4 is an empty cell
    assert r["hallucination_rate"] == pytest.approx(1 / 5)
    assert r["attribute_errors"] == {"colour": 0, "shape": 1, "size": 1}
    assert r["attribute_error_rate"] == pytest.approx(2 / 5)
    assert r["repeated_mentions"] == 1
    # true objects named at their cell: a1, a3, b2 of 4 (first description), none of 4 (second)
    assert r["object_recall"] == pytest.approx(3 / 8)
    assert r["exact_recall"] == pytest.approx(1 / 8)  # only a1 is fully right


def test_chair_length_mismatch():
    with pytest.raises(ValueError, match="2 descriptions but 1 scenes"):
        chair(["a", "b"], [SCENE])


def test_accuracy_by_index_and_counter_prior():
    text = ("at a1 a small red circle . at a3 a large red square . "  # colour wrong (blue, counter-prior)
            "at b2 a large red star .")  # c4 never named
    rows = accuracy_by_index([text], [SCENE])
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert [r["named"] for r in rows] == [1, 1, 1, 0]
    assert [r["colour"] for r in rows] == [1, 0, 1, 0]
    assert [r["exact"] for r in rows] == [1, 0, 1, 0]
    # counter-prior colours: a3 (blue) and c4 (green); counter-prior shapes: a3, b2
    assert [r["colour_counter_prior"] for r in rows] == [None, 0, None, 0]
    assert [r["shape_counter_prior"] for r in rows] == [None, 1, 1, None]
    assert slope(rows, "exact") == pytest.approx(-0.2)
    assert slope([rows[0]], "exact") is None


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
