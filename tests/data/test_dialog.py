"""The multi-turn dilution regime: conversations about one image, their labels, the history probe and its
scoring, and the interval statistics it reports."""

import math

import pytest
import torch

from keepsight.data import VLMCollator
from keepsight.metrics import mean_ci, paired_bootstrap, wilson
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

    from keepsight.metrics.parse import parse_description
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


def test_interval_statistics_on_hand_made_cases():
    low, high = wilson(8, 10)  # p = 0.8: the Wilson interval is (0.490, 0.943)
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)
    assert wilson(0, 0)[0] != wilson(0, 0)[0]  # nan for no trials
    ci = mean_ci([0.70, 0.80, 0.90])  # sd 0.1, t(2) = 4.303: half-width 0.248
    assert ci["mean"] == pytest.approx(0.8) and ci["high"] - ci["mean"] == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert mean_ci([0.5])["low"] == 0.5 and mean_ci([])["mean"] is None
    boot = paired_bootstrap([1, 1, 1, 0], [0, 0, 1, 0])
    assert boot["diff"] == pytest.approx(0.5) and boot["low"] <= 0.5 <= boot["high"] and boot["n"] == 4
    assert paired_bootstrap([1, 1], [1, 1])["low"] == 0.0


def test_aggregate_over_seeds_gives_intervals_paired_differences_and_verdicts():
    from keepsight.experiments.aggregate import aggregate
    from keepsight.report.seeds import seeds_markdown

    def seed(base_acc, pvm_acc):
        cmp = {arm: {"yes_no_acc": acc, "history_short_acc": acc, "history_long_acc": acc - 0.1,
                     "history_drop": 0.1, "object_recall": 0.5, "exact_recall": 0.2, "late_exact_recall": 0.1}
               for arm, acc in (("base", base_acc), ("pvm_sft", pvm_acc))}
        hist = {arm: {"history": {"by_length": {"0": {"acc": acc}, "15": {"acc": acc - 0.1}}}}
                for arm, acc in (("base", base_acc), ("pvm_sft", pvm_acc))}
        base = {"yes_no": {"overall_acc": base_acc, "categories": {"count": {"acc": 0.55}}}}
        return {"base": base, "pvm": {"comparison": cmp, "arms": hist}}

    agg = aggregate([seed(0.70, 0.90), seed(0.71, 0.91), seed(0.72, 0.92)])
    assert agg["n_seeds"] == 3
    assert agg["base"]["yes_no.overall_acc"]["values"] == [0.70, 0.71, 0.72]
    # 0.2 above the base on every seed; no per-seed verdicts (the comparison has no intervals within a seed)
    assert agg["verdicts"]["pvm"]["pvm_sft"]["yes_no_acc"] == {"over_seeds": 1, "per_seed": []}
    assert agg["verdicts"]["pvm"]["pvm_sft"]["history_drop"]["over_seeds"] == 0  # equal drops: no verdict
    md = seeds_markdown(agg)
    assert "| yes/no, all | 0.710 [0.685, 0.735] | 0.700 / 0.710 / 0.720 |" in md
    # the per-seed differences are all 0.2: the paired interval has no width
    assert "| pvm | pvm_sft | yes_no_acc | 0.910 [0.885, 0.935] | base 0.710 [0.685, 0.735] | 0.200 [0.200, 0.200] | higher |" in md
    assert "| base | 0.710 | 0.610 |" in md and "| pvm_sft | 0.910 | 0.810 |" in md


def test_diffusion_claims_need_a_model_that_describes():
    from keepsight.report.claims import _diffusion_claims

    def row(steps, method, recall, rep, share):
        return {"steps": steps, "method": method, "object_recall": recall, "repetition_ratio": rep,
                "repeats_in_mask_top10": share, "distinct_2": 0.03, "chair_i": 0.0}

    methods = ("none", "mps", "mrs", "both")
    weak = {"grid": [row(t, m, 0.0, (0.2 if m == "mps" else 0.3) if t == 4 else 0.02, 0.97)
                     for t in (4, 64) for m in methods]}
    rows = {r["claim"]: r for r in _diffusion_claims(weak, "diffusion")}
    rising = rows["MPS/MRS: repetition rises as the steps T fall (no fix)"]
    assert rising["verdict"] == "partly (the model describes poorly: object recall 0.000 at T = 64)"
    assert rows["MPS (papers' settings) lowers repetition at few steps"]["verdict"].startswith("partly (one seed")
    assert rows["MRS (papers' settings) lowers repetition at few steps"]["verdict"] == "not reproduced (no change)"
    assert not any("CHAIR" in c for c in rows)  # no CHAIR claim from a model that does not describe
    describing = {"grid": [row(t, m, 0.5, 0.2 if t == 4 else 0.01, 0.97) for t in (4, 64) for m in methods]}
    verdicts = {r["claim"].split(":")[0]: r["verdict"] for r in _diffusion_claims(describing, "diffusion")}
    assert verdicts["MPS/MRS"] == "reproduced" and verdicts["MPS"] == "reproduced"


def test_diffusion_fix_claims_are_read_at_the_fewest_steps_that_still_describe():
    from keepsight.report.claims import DESCRIBES, _diffusion_claims

    recall = {4: 0.0, 16: DESCRIBES / 2, 32: DESCRIBES + 0.05, 64: 0.2}  # describes from T = 32 on

    def row(steps, method):
        better = method in ("mps", "both") and steps == 32  # MPS helps only at T = 32
        return {"steps": steps, "method": method, "object_recall": recall[steps], "repeats_in_mask_top10": 0.9,
                "repetition_ratio": 0.3 if steps == 4 else 0.05, "distinct_2": 0.2 if better else 0.1,
                "chair_i": 0.1}

    res = {"grid": [row(t, m) for t in recall for m in ("none", "mps", "mrs", "both")]}
    rows = {r["claim"]: r for r in _diffusion_claims(res, "diffusion")}
    rising = rows["MPS/MRS: repetition rises as the steps T fall (no fix)"]
    assert rising["verdict"] == "reproduced" and "0.050 at T = 32, the fewest steps with recall" in rising["ours"]
    mps = rows["MPS (papers' settings) raises distinct-n and lowers CHAIR at few steps"]
    assert "(T = 32, one seed)" in mps["ours"] and mps["verdict"] == "reproduced (one seed)"
    mrs = rows["MRS (papers' settings) raises distinct-n and lowers CHAIR at few steps"]
    assert mrs["verdict"] == "not reproduced (no change)"


def test_claims_name_the_profile_that_produced_them():
    from keepsight.report.claims import claims_table

    res = {"profile": "extended", "base": {"diagnosis": {"slope": -0.5, "tvr_plateau": 7.0}}}
    demo = [r["command"] for r in claims_table(res) if not r["command"].startswith("pytest")]
    assert len(demo) == 2 and set(demo) == {"keepsight demo --profile extended"}
    full = {r["command"] for r in claims_table({**res, "profile": "full"}) if not r["command"].startswith("pytest")}
    assert full == {"keepsight demo"}


def test_description_regime_claims_from_one_seed_and_from_several():
    from keepsight.experiments.aggregate import aggregate
    from keepsight.report.claims import claims_table

    def seed(drop, recovery, base_acc, pvm_acc):
        ad = {"none": {"acc": 0.85}, "description": {"acc": 0.85 - drop}, "oracle": {"acc": 0.85 - drop + recovery},
              "drop": {"diff": drop, "low": drop - 0.07, "high": drop + 0.07},
              "recovery": {"diff": recovery, "low": recovery - 0.07, "high": recovery + 0.07},
              "recovered_share": recovery / drop}
        cmp = {arm: {"description_regime_acc": acc} for arm, acc in (("base", base_acc), ("pvm_grpo", pvm_acc))}
        paper = {"long_rel": 0.273, "short_rel": 0.061}
        return {"base": {"after_description": ad}, "pvm": {"comparison": cmp, "paper": paper}}

    one = seed(0.2, 0.05, 0.65, 0.66)
    rows = {r["claim"].split(" (")[0]: r for r in claims_table(one)}
    premise = rows["Premise: a visual answer degrades after the model's own description"]
    assert premise["ours"] == "+0.200 [+0.130, +0.270] (one seed)" and premise["verdict"] == "no verdict (one seed)"
    claim = "PVM (SFT + GRPO) improves a visual answer after the model's own description"
    pvm = {r["claim"]: r for r in claims_table(one)}[claim]
    assert pvm["ours"] == "0.660 vs base 0.650" and pvm["verdict"] == "no verdict (one seed)"
    seeds = [seed(0.20, 0.05, 0.65, 0.75), seed(0.21, -0.04, 0.66, 0.76), seed(0.19, 0.00, 0.64, 0.74)]
    res = {**seeds[0], "aggregate": aggregate(seeds)}
    rows = {r["claim"].split(" (")[0]: r for r in claims_table(res)}
    assert rows["Premise: a visual answer degrades after the model's own description"]["verdict"] == "reproduced"
    limited = rows["Premise: access to the image limits that regime"]
    assert limited["verdict"] == "not reproduced (interval includes 0)" and limited["ours"].startswith("0.003 [")
    # drops of 0.10 / 0.45 / 0.12, each with its interval above 0: the t interval of three drops holds 0, each seed
    # alone shows it; recoveries above 0 on two seeds of three
    spread = [seed(0.10, 0.09, 0.65, 0.65), seed(0.45, 0.44, 0.66, 0.66), seed(0.12, 0.05, 0.64, 0.64)]
    agg = aggregate(spread)
    assert agg["seed_intervals"]["base"]["after_description.drop"][1]["low"] == pytest.approx(0.38)
    rows = {r["claim"].split(" (")[0]: r for r in claims_table({**spread[0], "aggregate": agg})}
    premise = rows["Premise: a visual answer degrades after the model's own description"]
    assert premise["ours"].startswith("0.223 [-0.") and premise["verdict"] == (
        "reproduced on each of the 3 seeds (each seed's own interval above 0)")
    assert rows["Premise: access to the image limits that regime"]["verdict"] == (
        "partly (2 of 3 seeds' own intervals above 0)")
    assert {r["claim"]: r for r in claims_table(res)}[claim]["verdict"] == "reproduced (higher)"
