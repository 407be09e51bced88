"""The multi-turn dilution regime: conversations about one image, their labels, the history probe and its
scoring."""

import pytest
import torch

from keepsight.data import VLMCollator
from keepsight.world import generate_scenes, world_config
from keepsight.world.dialog import (
    PROBE_CATEGORIES,
    conversation,
    describe_then_ask,
    history_probe,
    question_pool,
)
from keepsight.world.evaluate import evaluate_history
from keepsight.world.models import build_model
from keepsight.world.tasks import VLMDataset, WorldSamples, chat_sample


@pytest.fixture(scope="module")
def samples():
    cfg = world_config()
    return WorldSamples.from_scenes(cfg, generate_scenes(cfg, 6, seed=4))


def test_history_probe_is_deterministic_and_never_asks_its_final_category(samples):
    s = samples.scenes[0]
    hist, final = history_probe(s, samples.config, 15, seed=0)
    again = history_probe(s, samples.config, 15, seed=0)
    assert (hist, final) == again
    assert history_probe(s, samples.config, 15, seed=1) != (hist, final)
    assert final["kind"] in PROBE_CATEGORIES and final["answer"] in ("yes", "no")
    assert all(q["kind"] != final["kind"] for q in hist) and len(hist) == 15
    short, final_short = history_probe(s, samples.config, 4, seed=0)
    assert final_short == final and short == hist[:4]  # one fixed order: every length is a prefix
    pool = question_pool(s, samples.config)
    assert 17 <= len(pool) <= 20 and len({q["question"] for q in pool}) == len(pool)
    with pytest.raises(ValueError, match="history questions"):
        history_probe(s, samples.config, 19)


def test_conversation_labels_every_answer_and_nothing_else(samples, processor):
    import numpy as np

    turns = conversation(samples.scenes[1], samples.config, np.random.default_rng(0), 3)
    batch = VLMCollator(processor)([chat_sample(turns, samples.images[1])])
    tok = processor.tokenizer
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    labelled = tok.convert_ids_to_tokens(ids[labels != -100].tolist())
    want = []
    for t in turns:
        want += t["answer"].split() + ["<eos>"]
    assert labelled == want
    # each labelled span starts right after "assistant :"
    starts = [i for i in range(1, len(labels)) if labels[i] != -100 and labels[i - 1] == -100]
    assert [tok.convert_ids_to_tokens(ids[i - 2 : i].tolist()) for i in starts] == [["assistant", ":"]] * 3


def test_chat_task_in_the_instruct_mix(samples):
    data = VLMDataset(samples, ("yes_no", "chat"), seed=0, max_turns=5)
    chats = [data[i] for i in range(len(data)) if i in data.chats]
    assert len(chats) == len(samples)
    assert all(2 <= sum(m["role"] == "assistant" for m in c.messages) <= 5 for c in chats)
    assert chats[0].messages[0]["content"][0] == {"type": "image"}  # the image comes with the first question


def test_chat_image_task_shows_the_image_again_before_one_later_question(samples, processor):
    data = VLMDataset(samples, ("chat", "chat_image"), seed=0, max_turns=6)
    plain = [i for i in data.chats if data.category(i) == "chat"]
    again = [i for i in data.chats if data.category(i) == "chat_image"]
    assert len(plain) == len(again) == len(samples) and not set(plain) & set(data.reinsert)
    for i in again:
        sample, at = data[i], data.reinsert[i]
        users = [m for m in sample.messages if m["role"] == "user"]
        assert 1 <= at < len(users) and len(sample.images) == 2
        assert [any(p == {"type": "image"} for p in u["content"]) for u in users] == [
            j in (0, at) for j in range(len(users))]
        batch = VLMCollator(processor)([sample])  # the processor expands both images
        assert int((batch["input_ids"] == processor.tokenizer.image_token_id).sum()) == 2 * 17
    turns = data.chats[again[0]]
    oracle = chat_sample(turns, samples.images[0], answer_last=False, reinsert_image=True)
    assert oracle.messages == chat_sample(turns, samples.images[0], answer_last=False,
                                          reinsert_at=len(turns) - 1).messages
    assert chat_sample(turns[:1], samples.images[0], reinsert_image=True).images == [samples.images[0]]
    with pytest.raises(ValueError, match="reinsert_at must be in"):
        chat_sample(turns, samples.images[0], reinsert_at=0)
    with pytest.raises(ValueError, match="not both"):
        chat_sample(turns, samples.images[0], reinsert_image=True, reinsert_at=1)


def test_describe_then_ask_trains_the_answer_only_and_its_wrong_descriptions_follow_the_image(samples, processor):
    import numpy as np

    from keepsight.world.grammar import parse_description
    from keepsight.world.texts import DESCRIBE_PROMPT, description, place

    rng = np.random.default_rng(0)
    wrong = 0
    for _ in range(40):
        s = samples.scenes[int(rng.integers(len(samples)))]
        desc, final = describe_then_ask(s, samples.config, rng)
        assert desc["question"] == DESCRIBE_PROMPT and desc["context"] and final["answer"] in ("yes", "no")
        assert final["kind"] in PROBE_CATEGORIES
        if desc["answer"] == description(s):
            continue
        wrong += 1  # one object's colour or shape is stated wrong, and the question asks about that object
        truth, told = parse_description(description(s)), parse_description(desc["answer"])
        diff = [(a, b) for a, b in zip(truth.objects, told.objects) if a != b]
        assert len(truth.objects) == len(told.objects) and len(diff) == 1
        true_obj, told_obj = diff[0]
        attr = "colour" if true_obj.colour != told_obj.colour else "shape"
        assert final["kind"] == attr and true_obj.shape == told_obj.shape or attr == "shape"
        words = final["question"].split()
        assert words[4] == place(true_obj.row, true_obj.col)
        want = {getattr(true_obj, attr): "yes", getattr(told_obj, attr): "no"}
        assert want[words[-2]] == final["answer"]
    assert 10 <= wrong <= 30  # about half
    with pytest.raises(ValueError, match="wrong must be in"):
        describe_then_ask(samples.scenes[0], samples.config, rng, wrong=1.5)
    data = VLMDataset(samples, ("describe_ask",), seed=0)
    assert len(data) == len(samples) and 0 < len(data.reinsert) < len(samples)
    for i in range(len(data)):
        batch = VLMCollator(processor)([data[i]])
        ids, labels = batch["input_ids"][0], batch["labels"][0]
        labelled = processor.tokenizer.convert_ids_to_tokens(ids[labels != -100].tolist())
        assert labelled == [data.chats[i][1]["answer"], "<eos>"]  # the description is read, not trained on
        n_images = int((ids == processor.tokenizer.image_token_id).sum())
        assert n_images == (2 if i in data.reinsert else 1) * 17
    only_context = chat_sample(data.chats[0][:1], samples.images[0])
    with pytest.raises(ValueError, match="every assistant turn is marked context"):
        VLMCollator(processor)([only_context])


def test_count_task_adds_four_count_items_per_scene_and_leaves_other_mixes_alone(samples):
    plain = VLMDataset(samples, ("yes_no", "open"), seed=0)
    data = VLMDataset(samples, ("yes_no", "open", "count_yes_no"), seed=0)
    assert len(data) == len(plain) + 4 * len(samples)
    n_count = sum(c == "count" for c in data.categories) - sum(c == "count" for c in plain.categories)
    assert n_count == 4 * len(samples)
    answers = [a for (_, _, a), c in zip(data.items, data.categories) if c == "count"]
    assert answers.count("yes") == answers.count("no")
    # the other tasks' items and their order are unchanged by adding the task
    assert [it for it, c in zip(data.items, data.categories) if c != "count"] == \
        [it for it, c in zip(plain.items, plain.categories) if c != "count"]


def test_history_scoring_counts_what_the_model_answers(samples, processor):
    model = build_model("tiny-llava", processor.tokenizer).eval()
    res = evaluate_history(model, processor, samples, lengths=(0, 2), batch_size=4)
    tok = processor.tokenizer
    for h in (0, 2):
        hits = 0
        for s, img in zip(samples.scenes, samples.images):  # one row at a time, by hand
            hist, final = history_probe(s, samples.config, 2)
            from keepsight.data import render_prompt

            c = chat_sample(hist[:h] + [final], img, answer_last=False)
            enc = processor(text=[render_prompt(processor, c)], images=c.images, return_tensors="pt")
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=1, do_sample=False, pad_token_id=tok.pad_token_id)
            hits += tok.decode(out[0, -1:], skip_special_tokens=True).strip() == final["answer"]
        row = res["by_length"][str(h)]
        assert row["n"] == len(samples) and row["acc"] == pytest.approx(hits / len(samples))
        assert len(res["hits"][str(h)]) == len(samples) and res["hits"][str(h)].count("1") == hits
        assert row["low"] <= row["acc"] <= row["high"] and 0 < row["omega_v"] < 1
    assert res["by_length"]["2"]["text_tokens"] > res["by_length"]["0"]["text_tokens"]


def test_oracle_recovery_is_paired_by_scene():
    from keepsight.world.evaluate import oracle_recovery as recovery

    def hist(short, long):  # 4 scenes, lengths 0 and 15
        d = sum(map(int, short)) / 4 - sum(map(int, long)) / 4
        return {"lengths": [0, 15], "hits": {"0": short, "15": long}, "drop": {"diff": d}}

    base, oracle = hist("1111", "1100"), hist("1111", "1110")  # the base loses 2 scenes, the oracle wins 1 back
    rec = recovery(oracle, base)
    assert rec["recovered_share"] == pytest.approx(0.5)
    assert rec["recovered_interval"][0] <= 0.25 <= rec["recovered_interval"][1]
    assert recovery(oracle, {k: v for k, v in base.items() if k != "hits"}) == {}  # an earlier keepsight's results
    assert recovery(oracle, hist("1100", "1100"))["recovered_share"] is None  # no drop to recover
