"""A yes/no set on which the question's text says nothing about its answer (the prior-balanced set).

Every question of ``yes_no_questions`` is asked of its own scene and, paired with it, of another scene of the set
for which the same words have the other answer. A model that does not see the image answers both alike (same
text, same prompt) and so scores exactly one of each pair: 0.5 overall and in every category, whatever priors it
learned. A model scores above 0.5 on this set only by reading the image: the yardstick of the PVM mechanism
control, where the LoRA control (no path to the image) learns the world's priors and, on the ordinary set,
rises above the base's text-only level without reading anything.
"""

from __future__ import annotations

import re

from .config import WorldConfig
from .grammar import NUMBER_WORDS, ROW_LETTERS
from .scene import Scene
from .texts import yes_no_questions

_CELL = r"([a-j])(\d+)"
_TEMPLATES = {  # the wording of each category in ``yes_no_questions``
    "existence": re.compile(r"is there a (\w+) (\w+) \?"),
    "count": re.compile(r"are there (\w+) objects \?"),
    "colour": re.compile(rf"is the object at {_CELL} (\w+) \?"),
    "shape": re.compile(rf"is the object at {_CELL} a (\w+) \?"),
    "position": re.compile(rf"is there a (\w+) at {_CELL} \?"),
    "scene": re.compile(r"is this a (\w+) scene \?"),
}


def _cell(letter: str, number: str) -> tuple[int, int]:
    return ROW_LETTERS.index(letter), int(number) - 1


def question_category(question: str) -> str:
    """The yes/no category whose wording ``question`` has (each question fits exactly one)."""
    for category, pattern in _TEMPLATES.items():
        if pattern.fullmatch(question):
            return category
    raise ValueError(f"{question!r} is in none of the world's yes/no wordings")


def yes_no_answer(scene: Scene, category: str, question: str) -> str | None:
    """The true answer ("yes" / "no") of a ``yes_no_questions`` question of ``category`` asked of ``scene``, or
    None where the words do not apply to it (a question about "the object at b3" when b3 is empty). Raises on a
    question that is not in the category's wording."""
    pattern = _TEMPLATES.get(category)
    if pattern is None:
        raise ValueError(f"unknown yes/no category {category!r}; expected one of {list(_TEMPLATES)}")
    m = pattern.fullmatch(question)
    if m is None:
        raise ValueError(f"{question!r} is not a {category} question of the world's wording ({pattern.pattern})")
    g = m.groups()
    if category == "existence":
        truth = any(o.colour == g[0] and o.shape == g[1] for o in scene.objects)
    elif category == "count":
        truth = len(scene.objects) == NUMBER_WORDS.index(g[0])
    elif category == "scene":
        truth = scene.scene == g[0]
    elif category == "position":
        there = scene.object_at(*_cell(g[1], g[2]))
        truth = there is not None and there.shape == g[0]
    else:  # colour, shape: about the object at a cell
        there = scene.object_at(*_cell(g[0], g[1]))
        if there is None:
            return None
        truth = getattr(there, category) == g[2]
    return "yes" if truth else "no"


def balanced_yes_no(scenes: list[Scene], config: WorldConfig) -> list[dict]:
    """The prior-balanced set of ``scenes``: for each question of each scene (in order), the question itself
    (``"scene"``: its scene's index) and its twin, the same words asked of the next scene (cyclically) where they
    have the other answer. Items ``{"scene", "category", "question", "answer", "pair"}``; the two items of a pair
    share ``pair``. A question no other scene answers the other way is left out (a "no" about a rare
    cell and colour: 2 of 2,400 questions on the demo's 200 held-out scenes); at least two scenes are needed."""
    if len(scenes) < 2:
        raise ValueError(f"a prior-balanced set pairs questions across scenes: needs at least 2 scenes, got {len(scenes)}")
    items: list[dict] = []
    for i, scene in enumerate(scenes):
        for q in yes_no_questions(scene, config):
            other = "no" if q["answer"] == "yes" else "yes"
            for step in range(1, len(scenes)):
                j = (i + step) % len(scenes)
                if yes_no_answer(scenes[j], q["category"], q["question"]) == other:
                    pair = len(items) // 2
                    items += [{"scene": i, **q, "pair": pair}, {"scene": j, **q, "answer": other, "pair": pair}]
                    break
    return items
