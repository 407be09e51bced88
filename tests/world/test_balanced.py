"""The prior-balanced yes/no set: every question paired with the same words asked of a scene where the answer is the
other one, so a model that does not see the image scores exactly 0.5, whatever priors it learned."""

import zlib
from collections import Counter

import numpy as np
import pytest

from keepsight.metrics import yes_no_scores
from keepsight.world import generate_scenes, world_config, yes_no_questions
from keepsight.world.balanced import balanced_yes_no, question_category, yes_no_answer
from keepsight.world.tasks import VLMDataset, WorldSamples


@pytest.fixture(scope="module")
def world():
    cfg = world_config(max_objects=12)
    return cfg, generate_scenes(cfg, 120, seed=3)


def test_the_answer_read_from_the_words_agrees_with_every_generated_question(world):
    cfg, scenes = world
    for s in scenes:
        for q in yes_no_questions(s, cfg):
            assert yes_no_answer(s, q["category"], q["question"]) == q["answer"], (s.id, q)


def test_every_question_has_a_twin_with_the_other_answer_and_the_same_words(world):
    cfg, scenes = world
    items = balanced_yes_no(scenes, cfg)
    assert len(items) >= 0.98 * 2 * 12 * len(scenes)  # left out: questions no other scene answers the other way
    for a, b in zip(items[::2], items[1::2]):
        assert a["pair"] == b["pair"] and a["question"] == b["question"] and a["category"] == b["category"]
        assert {a["answer"], b["answer"]} == {"yes", "no"} and a["scene"] != b["scene"]
        assert yes_no_answer(scenes[b["scene"]], b["category"], b["question"]) == b["answer"]  # the twin's truth
    by_category = Counter(i["category"] for i in items)
    assert set(by_category) == {"existence", "count", "colour", "shape", "position", "scene"}
    assert by_category["scene"] == by_category["count"] == 4 * len(scenes)  # these always have a twin


def _records(items, scenes, predict):
    return [{"image": scenes[i["scene"]].id, "category": i["category"], "answer": i["answer"],
             "prediction": predict(i["question"], scenes[i["scene"]])} for i in items]


def test_any_answer_from_the_words_alone_scores_exactly_half_and_reading_scores_more(world):
    cfg, scenes = world
    items = balanced_yes_no(scenes, cfg)
    rng = np.random.default_rng(0)
    for _ in range(3):  # text-only predictors: a hash of the words, and "yes" to everything
        salt = int(rng.integers(1 << 30))
        by_text = _records(items, scenes, lambda q, s, salt=salt: "yes" if zlib.crc32(f"{salt}{q}".encode()) % 3 else "no")
        scores = yes_no_scores(by_text)
        assert scores["overall_acc"] == 0.5 and all(c["acc"] == 0.5 for c in scores["categories"].values())
    assert yes_no_scores(_records(items, scenes, lambda q, s: "yes"))["overall_acc"] == 0.5
    # reading the image: every answer right
    read = _records(items, scenes, lambda q, s: yes_no_answer(s, question_category(q), q))
    assert yes_no_scores(read)["overall_acc"] == 1.0


def test_words_that_do_not_apply_or_are_not_the_worlds_are_told_apart(world):
    cfg, scenes = world
    s = scenes[0]
    empty = next((r, k) for r in range(4) for k in range(4) if s.object_at(r, k) is None)
    cell = "abcd"[empty[0]] + str(empty[1] + 1)
    assert yes_no_answer(s, "colour", f"is the object at {cell} red ?") is None  # no object there
    assert yes_no_answer(s, "position", f"is there a star at {cell} ?") == "no"
    with pytest.raises(ValueError, match="not a colour question"):
        yes_no_answer(s, "colour", "is the thing at a1 red ?")
    with pytest.raises(ValueError, match="unknown yes/no category"):
        yes_no_answer(s, "size", "is it big ?")
    with pytest.raises(ValueError, match="none of the world's yes/no wordings"):
        question_category("is it big ?")
    with pytest.raises(ValueError, match="at least 2 scenes"):
        balanced_yes_no(scenes[:1], cfg)


def test_the_balanced_training_task_pairs_each_question_with_its_twin(world):
    cfg, scenes = world
    samples = WorldSamples.from_scenes(cfg, scenes[:40])
    data = VLMDataset(samples, ("yes_no_balanced",), seed=0, yes_no_categories=2)
    assert 0.9 * 40 * 8 <= len(data) <= 40 * 8  # two categories a scene, a yes and a no, each with its twin
    answers: dict[str, Counter] = {}
    for scene, question, answer in data.items:
        assert yes_no_answer(samples.scenes[scene], question_category(question), question) == answer
        answers.setdefault(question, Counter())[answer] += 1
    assert all(c["yes"] == c["no"] for c in answers.values())  # the words alone say nothing


def test_a_model_without_the_image_answers_both_questions_of_a_pair_alike(world):
    """The exactly-0.5 promise on a real model: with the image's tokens withheld, the two items of each pair are the
    same prompt, and a (here untrained) tiny LLaVA answers them alike in a batched, padded evaluation; with the image
    it does not."""
    import torch

    from keepsight.models.withhold import image_withheld
    from keepsight.world.evaluate import evaluate_yes_no
    from keepsight.world.models import build_model
    from keepsight.world.processor import build_processor

    cfg, scenes = world
    samples = WorldSamples.from_scenes(cfg, scenes[:24])
    items = balanced_yes_no(samples.scenes, cfg)
    processor = build_processor()
    torch.manual_seed(0)
    model = build_model("tiny-llava", processor.tokenizer).eval()

    def pairs_alike() -> float:
        records = evaluate_yes_no(model, processor, samples, batch_size=16, items=items)[1]
        return sum(a["prediction"] == b["prediction"] for a, b in zip(records[::2], records[1::2])) / (len(records) // 2)

    with image_withheld(model):
        assert pairs_alike() == 1.0
    assert pairs_alike() < 1.0
