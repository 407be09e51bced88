"""The world's stage-2 (GRPO) data: one prompt per scene and task with the columns the verifiable rewards
read (``keepsight.world.rewards``), in the shape ``keepsight.train.pvm_grpo`` trains on."""

from __future__ import annotations

import numpy as np
from datasets import Dataset

from ..data import user_message
from ..fingerprint import digest
from ..train.pvm_grpo import GRPOData
from . import rewards
from .evaluate import description_budget
from .tasks import WorldSamples, instruct_data
from .texts import DESCRIBE_PROMPT, cell_questions, description, open_questions, yes_no_questions

GRPO_TASKS = ("describe", "open", "yes_no", "cell")


def check_tasks(tasks) -> list[str]:
    tasks = list(tasks)
    bad = [t for t in tasks if t not in GRPO_TASKS]
    if bad or not tasks:
        raise ValueError(f"tasks: unknown {bad}; choose from {GRPO_TASKS}" if bad else "tasks: empty")
    return tasks


def grpo_dataset(samples: WorldSamples, tasks, seed: int = 0) -> Dataset:
    """One prompt per scene and task, shuffled: columns ``prompt`` (conversational, with an image part),
    ``image``, ``kind``, ``answer`` and ``scene`` (the scene graph as JSON, for the rewards)."""
    tasks = check_tasks(tasks)
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    for scene, img in zip(samples.scenes, samples.images):
        for task in tasks:
            if task == "describe":
                q = {"question": DESCRIBE_PROMPT, "kind": "describe", "answer": description(scene)}
            elif task == "open":
                q = dict(open_questions(scene)[int(rng.integers(4))])
            elif task == "yes_no":
                qs = yes_no_questions(scene, samples.config)
                q = {**qs[int(rng.integers(len(qs)))], "kind": "yes_no"}
            else:
                q = dict(cell_questions(scene, samples.config)[int(rng.integers(4))])
            rows.append({"prompt": user_message(q["question"]), "image": img, "kind": q["kind"],
                         "answer": q["answer"], "scene": scene.to_json()})
    order = rng.permutation(len(rows))
    return Dataset.from_list([rows[i] for i in order])


def world_grpo_data(samples: WorldSamples, tasks=("describe", "open"), seed: int = 0,
                    format_weight: float = 0.2) -> GRPOData:
    """Prompts of ``tasks`` for ``samples``; rewards: the answer reward (weight 1) and the format reward
    (``format_weight``); the PVM report on the first eight instruct samples; completions up to the world's
    description budget."""
    tasks = check_tasks(tasks)
    if not format_weight >= 0:
        raise ValueError(f"format_weight must be >= 0, got {format_weight!r}")
    report = instruct_data(samples, seed)
    return GRPOData(dataset=grpo_dataset(samples, tasks, seed), rewards=[rewards.answer_reward, rewards.format_reward],
                    weights=[1.0, float(format_weight)], report_items=[report[i] for i in range(min(8, len(report)))],
                    max_completion_length=description_budget(samples.config.max_objects),
                    fingerprint=digest([samples.fingerprint(), tasks, seed]))
