"""Conversations about one image: the world's multi-turn data and its dilution probe.

A conversation is a list of (question, answer) turns about one scene, drawn from the scene's short questions
(yes/no of every category, open answers, "what is at b3 ?" grounding). The first user turn carries the
image, so every later question sits further from the visual tokens: the k-th answer of a conversation is a
visual fact read through k - 1 turns of text (the multi-turn dilution regime of the PVM paper's setting).

*Describe, then ask* is the generated-text regime's format (the PVM paper's setting: the model's own long text
before the answer): a description turn, then one yes/no question about the image. In training the description is
sometimes wrong about one object, and the question then asks about that object, so the answer has to come from the
image, as it must when a model's own description is wrong.

The *history probe* asks one fixed visual question of each scene after 0, 1, 2, ... turns of history (other
questions of the same scene with their true answers, in the same order for every length): accuracy of that
final answer against the history length is the dilution curve, paired by scene.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .scene import Scene
from .texts import DESCRIBE_PROMPT, cell_questions, description, open_questions, place, yes_no_questions

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


def describe_then_ask(scene: Scene, config, rng: np.random.Generator, wrong: float = 0.5) -> list[dict]:
    """Two turns: the describe prompt with the scene's description, then one yes/no question of a
    ``PROBE_CATEGORIES`` category. With probability ``wrong`` the description states a wrong colour or shape for one
    object and the question asks about that object's attribute (its true value: "yes"; the stated one: "no"), so the
    answer follows the image, not the text before it. The description turn is ``context`` (read, not trained on:
    the model is never taught to write a wrong description)."""
    if not 0.0 <= wrong <= 1.0:
        raise ValueError(f"wrong must be in [0, 1], got {wrong}")
    told = scene
    if rng.random() >= wrong:
        pool = [q for q in yes_no_questions(scene, config) if q["category"] in PROBE_CATEGORIES]
        q = pool[int(rng.integers(len(pool)))]
        final = {"question": q["question"], "answer": q["answer"], "kind": q["category"]}
    else:
        k = int(rng.integers(len(scene.objects)))
        o = scene.objects[k]
        attr = ("colour", "shape")[int(rng.integers(2))]
        values = config.colours if attr == "colour" else config.shapes
        wrong_value = [v for v in values if v != getattr(o, attr)]
        stated = wrong_value[int(rng.integers(len(wrong_value)))]
        told = dataclasses.replace(scene, objects=[dataclasses.replace(o, **{attr: stated}) if j == k else x
                                                   for j, x in enumerate(scene.objects)])
        asked, answer = (getattr(o, attr), "yes") if rng.random() < 0.5 else (stated, "no")
        article = "" if attr == "colour" else "a "
        final = {"question": f"is the object at {place(o.row, o.col)} {article}{asked} ?", "answer": answer,
                 "kind": attr}
    return [{"question": DESCRIBE_PROMPT, "answer": description(told), "kind": "describe", "context": True}, final]
