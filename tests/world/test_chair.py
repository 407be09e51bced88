"""The world's own scoring against its scene graphs: CHAIR at category and instance level
(``keepsight.world.chair``) and the dilution curve (``keepsight.world.dilution``)."""

import pytest

from keepsight.world.chair import chair
from keepsight.world.dilution import accuracy_by_index, slope


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



def test_chance_recall_is_what_random_cells_would_name():
    """``object_recall_chance``: the expected recall of as many distinct cells drawn at random (checked against
    drawing them), so that a recall near it says the description names occupied cells no better than guessing."""
    import random

    texts = ["at a1 a small red circle . at a1 a small red circle . at d4 a large red star .",  # 2 distinct cells
             "this is a beach scene ."]  # none
    r = chair(texts, [SCENE, SCENE], cells=16)
    assert r["object_recall_chance"] == pytest.approx((2 * 4 / 16 + 0) / 8)
    rng = random.Random(0)
    cells = [(i, j) for i in range(4) for j in range(4)]
    true = {(o["row"], o["col"]) for o in SCENE["objects"]}
    draws = [len(true & set(rng.sample(cells, 2))) for _ in range(20000)]
    assert sum(draws) / len(draws) / 8 == pytest.approx(r["object_recall_chance"], abs=0.003)
    assert "object_recall_chance" not in chair(texts, [SCENE, SCENE])
    with pytest.raises(ValueError, match="cells must be >= 1, got 0"):
        chair(texts, [SCENE, SCENE], cells=0)
