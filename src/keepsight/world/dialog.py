"""Conversations about one image: the world's multi-turn data and its dilution probe.

A conversation is a list of (question, answer) turns about one scene, drawn from the scene's short questions
(yes/no of every category, open answers, "what is at b3 ?" grounding). The first user turn carries the
image, so every later question sits further from the visual tokens: the k-th answer of a conversation is a
visual fact read through k - 1 turns of text (the multi-turn dilution regime of the PVM paper's setting).

The *history probe* asks one fixed visual question of each scene after 0, 1, 2, ... turns of history (other
questions of the same scene with their true answers, in the same order for every length): accuracy of that
final answer against the history length is the dilution curve, paired by scene.
"""

from __future__ import annotations

import numpy as np

from .scene import Scene
from .texts import cell_questions, open_questions, yes_no_questions

# the visual facts the history probe asks last (a category whose yes/no answer needs the image)
PROBE_CATEGORIES = ("colour", "shape", "position", "existence")


def question_pool(scene: Scene, config) -> list[dict]:
    """Every distinct short question of ``scene`` as ``{"question", "answer", "kind"}`` (kind: the yes/no category,
    or open-count / open-colour / ... , or cell): up to 20."""
    pool = [{"question": q["question"], "answer": q["answer"], "kind": q["category"]}
            for q in yes_no_questions(scene, config)]
    pool += [{"question": q["question"], "answer": q["answer"], "kind": f"open-{q['kind']}"}
             for q in open_questions(scene)]
    pool += [{"question": q["question"], "answer": q["answer"], "kind": "cell"} for q in cell_questions(scene, config)]
    seen: set[str] = set()
    return [q for q in pool if not (q["question"] in seen or seen.add(q["question"]))]  # a cell may be drawn twice


def conversation(scene: Scene, config, rng: np.random.Generator, n_turns: int) -> list[dict]:
    """``n_turns`` distinct questions of the scene in random order (at most the pool's size)."""
    pool = question_pool(scene, config)
    order = rng.permutation(len(pool))[: min(n_turns, len(pool))]
    return [pool[i] for i in order]


def history_probe(scene: Scene, config, max_history: int, seed: int = 0) -> tuple[list[dict], dict]:
    """(history, final question) for ``scene``: the final question is one yes/no question of a
    ``PROBE_CATEGORIES`` category (yes or no, drawn by the scene); the history is up to ``max_history`` other
    questions of the scene (never the final question's category), in a fixed order - ask after
    ``history[:h]`` for h = 0 .. max_history."""
    rng = np.random.default_rng([scene.seed, scene.index, 5, seed])
    pool = question_pool(scene, config)
    finals = [q for q in pool if q["kind"] in PROBE_CATEGORIES]
    final = finals[int(rng.integers(len(finals)))]
    others = [q for q in pool if q["kind"] != final["kind"]]
    order = rng.permutation(len(others))
    history = [others[i] for i in order[:max_history]]
    if len(history) < max_history:
        raise ValueError(f"scene {scene.id}: only {len(history)} history questions for max_history {max_history}")
    return history, final
