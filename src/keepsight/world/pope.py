"""POPE on the world: the protocol of ``keepsight.metrics.pope`` with the scenes as images and the (colour, shape)
kinds as the object categories. Popular negatives are the most frequent kinds of the scene set (the world's prior:
``WorldConfig`` skews colours and shapes by scene type), adversarial ones the kinds that co-occur most with the
image's own. Questions read "is there a {colour} {shape} ?" (the world's words; answered yes / no like its yes/no
questions)."""

from __future__ import annotations

from ..metrics.pope import POPE_STRATEGIES, build_pope_questions, pope_scores
from .evaluate import generate_answers
from .tasks import WorldSamples


def world_instances(samples: WorldSamples) -> dict:
    """The scenes as a COCO instances dict: one image per scene, one category per (colour, shape) kind."""
    kinds = sorted({(o.colour, o.shape) for s in samples.scenes for o in s.objects})
    cat = {k: i + 1 for i, k in enumerate(kinds)}
    anns = []
    for i, s in enumerate(samples.scenes):
        for o in s.objects:
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": cat[(o.colour, o.shape)],
                         "area": 1.0 if o.size == "small" else 2.0, "iscrowd": 0})
    return {"images": [{"id": i, "file_name": s.id} for i, s in enumerate(samples.scenes)], "annotations": anns,
            "categories": [{"id": v, "name": f"{c} {sh}"} for (c, sh), v in cat.items()]}


def world_pope_questions(samples: WorldSamples, n_per_image: int = 3, seed: int = 0) -> list[dict]:
    """POPE records (every strategy) for every eligible scene, in the world's phrasing."""
    built = build_pope_questions(world_instances(samples), n_images=None, n_per_image=n_per_image,
                                 strategies=POPE_STRATEGIES, seed=seed)
    records = [r for rs in built.values() for r in rs]
    for r in records:
        r["question"] = f"is there a {r['object']} ?"
    return records


def evaluate_world_pope(model, processor, samples: WorldSamples, n_per_image: int = 3, seed: int = 0,
                        batch_size: int = 64) -> dict:
    """Accuracy, precision, recall, F1 and yes-ratio per strategy of the model's first answer word (keepsight's
    first-word rule, not POPE's: an answer that is neither yes nor no counts as no)."""
    records = world_pope_questions(samples, n_per_image, seed)
    images = [samples.images[r["image_id"]] for r in records]
    answers = generate_answers(model, processor, [r["question"] for r in records], images, max_new_tokens=1,
                               batch_size=batch_size)
    return pope_scores(records, {r["question_id"]: a for r, a in zip(records, answers)}, rule="keepsight")
