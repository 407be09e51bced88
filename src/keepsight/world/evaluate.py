"""Evaluate a world VLM against exact ground truth: yes/no by category, open answers, descriptions
(CHAIR and per-index accuracy, the dilution curve)."""

from __future__ import annotations

import contextlib

import torch

from ..inference import Pipeline
from ..metrics import distinct_n, paired_bootstrap, rep_n, repetition_ratio, wilson, yes_no_scores
from ..probes import VisualAttentionProbe
from .chair import chair
from .dialog import history_probe
from .dilution import accuracy_by_index, slope
from .tasks import WorldSamples, chat_sample
from .texts import DESCRIBE_PROMPT, open_questions, yes_no_questions


def _batches(pipe: Pipeline, prompts: list[str], images: list, batch_size: int, side: str):
    """One-turn chat prompts (one image each), encoded by ``pipe`` in padded (on ``side``) batches."""
    for i in range(0, len(prompts), batch_size):
        yield pipe.encode([pipe.chat_prompt(p, 1) for p in prompts[i : i + batch_size]],
                          [[im] for im in images[i : i + batch_size]], side)


@torch.no_grad()
def next_token_answers(model, processor, prompts: list[str], images: list, batch_size: int = 64) -> list[str]:
    """Greedy first answer token for each (prompt, image) (one forward pass, right padding)."""
    pipe = Pipeline.from_model(model, processor)
    out: list[str] = []
    for enc in _batches(pipe, prompts, images, batch_size, "right"):
        logits = model(**enc).logits  # [B, T, V]
        last = enc["attention_mask"].sum(1) - 1  # [B]: last real token of each row
        ids = logits[torch.arange(len(last)), last].argmax(-1)
        out += processor.tokenizer.batch_decode(ids[:, None], skip_special_tokens=True)
    return [o.strip() for o in out]


def generate_answers(model, processor, prompts: list[str], images: list, max_new_tokens: int,
                     batch_size: int = 32) -> list[str]:
    """Greedy generations (``keepsight.inference.Pipeline``: left padding, KV cache) for each (prompt, image)."""
    pipe = Pipeline.from_model(model, processor)
    out: list[str] = []
    for enc in _batches(pipe, prompts, images, batch_size, "left"):
        out += pipe.answer(enc, {"max_new_tokens": max_new_tokens})
    return out


def evaluate_yes_no(model, processor, samples: WorldSamples, batch_size: int = 64,
                    decode: bool = False, items: list[dict] | None = None) -> tuple[dict, list[dict]]:
    """Yes/no accuracy by category. ``decode``: the first answer token by ``generate`` (left padding; what a
    decoding-time method such as a ``keepsight.baselines`` one changes) instead of one right-padded forward.
    ``items``: the questions to ask, each naming its scene by index (``{"scene", "category", "question",
    "answer"}``, e.g. ``balanced.balanced_yes_no``) instead of every scene's ``yes_no_questions``."""
    if items is None:
        items = [{"scene": i, **q} for i, scene in enumerate(samples.scenes)
                 for q in yes_no_questions(scene, samples.config)]
    records, prompts, images = [], [], []
    for item in items:
        scene = samples.scenes[item["scene"]]
        records.append({"image": scene.id, **{k: v for k, v in item.items() if k != "scene"}})
        prompts.append(item["question"])
        images.append(samples.images[item["scene"]])
    if decode:
        preds = generate_answers(model, processor, prompts, images, max_new_tokens=1, batch_size=batch_size)
    else:
        preds = next_token_answers(model, processor, prompts, images, batch_size)
    for r, p in zip(records, preds):
        r["prediction"] = p
    return yes_no_scores(records), records


def evaluate_open(model, processor, samples: WorldSamples, batch_size: int = 64) -> dict:
    """Exact-match accuracy of short open answers, per kind (the verifiable rewards of GRPO)."""
    qs, images = [], []
    for scene, img in zip(samples.scenes, samples.images):
        for q in open_questions(scene):
            qs.append(q)
            images.append(img)
    preds = generate_answers(model, processor, [q["question"] for q in qs], images, 4, batch_size)
    by_kind: dict[str, list[bool]] = {}
    for q, p in zip(qs, preds):
        by_kind.setdefault(q["kind"], []).append(p.split()[:1] == [q["answer"]])
    return {k: sum(v) / len(v) for k, v in sorted(by_kind.items())}


def description_budget(max_objects: int) -> int:
    """New-token budget for a description: header + 7 tokens an object + slack."""
    return 7 * max_objects + 24


def evaluate_descriptions(model, processor, samples: WorldSamples, batch_size: int = 32,
                          max_new_tokens: int | None = None) -> dict:
    """Generate descriptions and score them: CHAIR family, per-index accuracy, diversity/repetition."""
    budget = max_new_tokens or description_budget(samples.config.max_objects)
    texts = generate_answers(model, processor, [DESCRIBE_PROMPT] * len(samples), samples.images, budget,
                             batch_size)
    rows = accuracy_by_index(texts, samples.scenes)
    return {
        "chair": chair(texts, samples.scenes, cells=samples.config.cells),
        "by_index": rows,
        "slope_exact": slope(rows, "exact"),
        "slope_colour": slope(rows, "colour"),
        "slope_colour_counter_prior": slope(rows, "colour_counter_prior"),
        "scene_acc": sum(t.startswith(f"this is a {s.scene} scene") for t, s in zip(texts, samples.scenes))
        / max(len(texts), 1),
        "distinct_2": distinct_n(texts, 2),
        "rep_4": sum(rep_n(t, 4) for t in texts) / max(len(texts), 1),
        "repetition_ratio": sum(repetition_ratio(t) for t in texts) / max(len(texts), 1),
        "texts": texts,
    }


# ----------------------------------------------------------------------------- the multi-turn dilution regime

HISTORY_LENGTHS = (0, 1, 2, 4, 8, 12, 15)  # turns of text history before the probed question


@torch.no_grad()
def evaluate_history(model, processor, samples: WorldSamples, lengths=HISTORY_LENGTHS, seed: int = 0,
                     batch_size: int = 32, probe: bool = True, reinsert_image: bool = False) -> dict:
    """Accuracy of one fixed visual yes/no question per scene asked after ``h`` turns of history (other questions
    of the scene with their true answers; ``keepsight.world.dialog.history_probe``), for each h in ``lengths``,
    with the share of attention on the image (Omega_V, mean over layers and heads) and TVR at the position that
    answers. Returns per length: ``acc`` with its 95% Wilson interval, ``omega_v``, ``tvr``, ``text_tokens``;
    ``drop``: accuracy at the shortest minus at the longest history, paired by scene, with a 95% bootstrap
    interval; and ``hits``: per length, each scene's outcome in order ("1" right, "0" wrong), for comparisons paired
    by scene between arms. ``probe=False`` leaves the attention probe out (Omega_V / TVR are then None): for methods that set
    their own attention function (``keepsight.baselines.PAI``). ``reinsert_image``: the oracle - the image again
    just before the final question (after any history), so that access to the image is no longer in question."""
    lengths = sorted(set(int(h) for h in lengths))
    if not lengths or lengths[0] < 0:
        raise ValueError(f"lengths must be non-negative turn counts, got {lengths}")
    tok = processor.tokenizer
    pipe = Pipeline.from_model(model, processor)
    probes = [history_probe(s, samples.config, lengths[-1], seed) for s in samples.scenes]
    per_length: dict[int, dict] = {}
    hits: dict[int, list[float]] = {}
    for h in lengths:
        chats = [chat_sample(hist[:h] + [final], img, s.id, answer_last=False, reinsert_image=reinsert_image)
                 for (hist, final), img, s in zip(probes, samples.images, samples.scenes)]
        right, omega, tvr, text = [], [], [], []
        for i in range(0, len(chats), batch_size):
            batch = chats[i : i + batch_size]
            enc = pipe.encode([pipe.sample_prompt(c) for c in batch], [list(c.images) for c in batch])
            with VisualAttentionProbe(model) if probe else contextlib.nullcontext() as watch:
                answers = pipe.answer(enc, {"max_new_tokens": 1})
            finals = [p[1] for p in probes[i : i + batch_size]]
            right += [float(a == f["answer"]) for a, f in zip(answers, finals)]
            if probe:
                ratio = watch.log_ratio[0]  # [L, B, H] at the answering position (left padding: the last column)
                omega += torch.sigmoid(ratio).mean((0, 2)).tolist()
                tvr += torch.exp(-ratio).mean((0, 2)).tolist()
            text += ((enc["input_ids"] != tok.image_token_id) & enc["attention_mask"].bool()).sum(1).tolist()
        hits[h] = right
        k = int(sum(right))
        low, high = wilson(k, len(right))
        per_length[h] = {"acc": k / len(right), "low": low, "high": high, "n": len(right),
                         "omega_v": sum(omega) / len(omega) if omega else None,
                         "tvr": sum(tvr) / len(tvr) if tvr else None,
                         "text_tokens": sum(text) / len(text)}
    return {"lengths": lengths, "by_length": {str(h): v for h, v in per_length.items()},
            "drop": paired_bootstrap(hits[lengths[0]], hits[lengths[-1]], seed=seed),
            "hits": {str(h): "".join(str(int(x)) for x in v) for h, v in hits.items()},  # per scene, "1" = right
            "categories": sorted({p[1]["kind"] for p in probes})}


def oracle_recovery(oracle: dict, base: dict) -> dict:
    """How much of the base's drop the oracle wins back after the longest history: the oracle's accuracy minus the
    base's there, paired by scene with a 95% bootstrap interval, and that gain as a share of the base's drop. Empty
    when either history was scored without per-scene outcomes (results of an earlier keepsight)."""
    long = str(oracle["lengths"][-1])
    if "hits" not in oracle or "hits" not in base or str(base["lengths"][-1]) != long:
        return {}
    diff = paired_bootstrap([float(c) for c in oracle["hits"][long]], [float(c) for c in base["hits"][long]])
    drop = base["drop"]["diff"]
    return {"recovered_interval": [diff["low"], diff["high"]],
            "recovered_share": diff["diff"] / drop if drop and drop > 0 else None}


@torch.no_grad()
def _final_hits(model, processor, chats: list, finals: list[dict], batch_size: int) -> list[float]:
    """1.0 where the greedy first token after each chat (left padding) is the final question's answer, else 0.0."""
    pipe = Pipeline.from_model(model, processor)
    hits: list[float] = []
    for i in range(0, len(chats), batch_size):
        batch = chats[i : i + batch_size]
        answers = pipe.generate_prompts([pipe.sample_prompt(c) for c in batch], [list(c.images) for c in batch],
                                        {"max_new_tokens": 1})
        hits += [float(a == f["answer"]) for a, f in zip(answers, finals[i : i + batch_size])]
    return hits


def evaluate_after_description(model, processor, samples: WorldSamples, seed: int = 0, batch_size: int = 32,
                               descriptions: list[str] | None = None) -> dict:
    """The generated-text regime (the PVM paper's setting: the model's own long text before the answer): each scene's
    probe question (``history_probe``'s final question) asked with no history, after the model's own description of
    the image (one turn: the describe prompt and its greedy description), and after the description with the image
    shown again just before the question (the oracle). Returns ``acc`` (with 95% Wilson interval) and per-scene
    ``hits`` for each of ``none`` / ``description`` / ``oracle``, ``drop`` (none - description, paired by scene, 95%
    bootstrap), ``recovery`` (oracle - description, paired) and ``recovered_share`` (recovery / drop), and the
    descriptions' mean length in words. ``descriptions``: the model's greedy descriptions of ``samples`` when already
    made (``evaluate_descriptions``' texts, the same prompt and budget), else they are generated here."""
    config = samples.config
    finals = [history_probe(s, config, 0, seed)[1] for s in samples.scenes]
    if descriptions is not None and len(descriptions) != len(samples):
        raise ValueError(f"{len(descriptions)} descriptions for {len(samples)} scenes")
    texts = descriptions if descriptions is not None else generate_answers(
        model, processor, [DESCRIBE_PROMPT] * len(samples), samples.images, description_budget(config.max_objects),
        batch_size)
    arms = {}
    for name, history, again in (("none", False, False), ("description", True, False), ("oracle", True, True)):
        chats = [chat_sample(([{"question": DESCRIBE_PROMPT, "answer": t}] if history else []) + [f], img, s.id,
                             answer_last=False, reinsert_image=again)
                 for t, f, img, s in zip(texts, finals, samples.images, samples.scenes)]
        hits = _final_hits(model, processor, chats, finals, batch_size)
        k = int(sum(hits))
        low, high = wilson(k, len(hits))
        arms[name] = {"acc": k / len(hits), "low": low, "high": high, "n": len(hits),
                      "hits": "".join(str(int(x)) for x in hits)}
    as_floats = {n: [float(c) for c in a["hits"]] for n, a in arms.items()}
    drop = paired_bootstrap(as_floats["none"], as_floats["description"], seed=seed)
    recovery = paired_bootstrap(as_floats["oracle"], as_floats["description"], seed=seed)
    return {**arms, "drop": drop, "recovery": recovery,
            "recovered_share": recovery["diff"] / drop["diff"] if drop["diff"] and drop["diff"] > 0 else None,
            "description_words": sum(len(t.split()) for t in texts) / max(len(texts), 1)}
