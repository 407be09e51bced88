"""POPE (keepsight.metrics.pope) on a small hand-made COCO instances file, its answer parsers (POPE's own,
keepsight's, OPERA's), and POPE's published question files."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest

from keepsight.metrics.pope import (
    build_pope_questions,
    load_coco_instances,
    parse_yes_no,
    pope_file_strategy,
    pope_question,
    pope_scores,
    read_answers_jsonl,
    read_pope_question_file,
    read_pope_question_files,
    read_questions_jsonl,
    write_questions_jsonl,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pope"

# ----------------------------------------------------------------------------- a tiny COCO

CATEGORIES = {1: "person", 2: "bicycle", 3: "car", 17: "cat", 18: "dog", 44: "bottle", 47: "cup", 62: "chair",
              67: "dining table", 79: "oven", 80: "toaster"}  # toaster: listed, never annotated
ID = {name: cid for cid, name in CATEGORIES.items()}

# image id -> its categories, largest area first (the k-th of m listed gets area 100 * (m - k)).
IMAGES = {
    1: ["person", "car", "bicycle", "dog"],
    2: ["person", "car", "bicycle", "cup"],
    3: ["person", "car", "chair", "dining table"],
    4: ["person", "car", "chair", "dining table", "cup"],
    5: ["person", "chair", "dining table", "cup"],
    6: ["person", "car", "chair", "bottle"],
    7: ["person", "chair", "dining table", "oven"],  # the oven is 10 small instances (area 5 each)
    8: ["car", "dog", "cat"],
    9: ["cat", "oven"],  # 2 objects: not eligible for POPE with 3 per image
    10: ["oven", "bottle"],  # 2 objects: not eligible
    11: [],  # no annotation
}
ELIGIBLE = [1, 2, 3, 4, 5, 6, 7, 8]

# Worked out by hand over the eligible images 1-8 (counts_from="selected"), images containing each:
#   person 7, car 6, chair 5, dining table 4, cup 3, bicycle 2, dog 2, cat 1, bottle 1, oven 1
# (counted per image: the 10 ovens of image 7 count once; per instance the oven would be first).
# Popular order (ties by category id): person car chair table cup bicycle dog cat bottle oven.
# With images 9-10 too (counts_from="all"): oven 3, cat 2, bottle 2, so after the top four:
#   cup (3, id 47), oven (3, id 79), bicycle, cat, dog, bottle (2 each, by id), ...
#
# Co-occurrences used below (images 1-8), number of images containing both:
#   car:   person 5, chair 3, bicycle 2, dog 2, cup 2, dining table 2, bottle 1, cat 1
#   dog:   car 2, person 1, bicycle 1, cat 1          cat:  car 1, dog 1
#   person: car 5, chair 5, dining table 4, cup 3, bicycle 2, dog 1, bottle 1, oven 1
#   chair: person 5, dining table 4, car 3, cup 2, bottle 1, oven 1
#   dining table: person 4, chair 4, car 2, cup 2, oven 1
# Pooled scores (sum over the image's objects) of the absent categories:
#   image 2 (person car bicycle cup): chair 10, dining table 8, dog 4, bottle 2, oven 1, cat 1
#   image 6 (person car chair bottle): dining table 10, cup 7, bicycle 4, dog 3, oven 2, cat 1


def _instances() -> dict:
    anns = []
    for imid, cats in IMAGES.items():
        for k, name in enumerate(cats):
            area = 100.0 * (len(cats) - k)
            copies = 10 if (imid, name) == (7, "oven") else 1
            for _ in range(copies):
                anns.append({"id": len(anns) + 1, "image_id": imid, "category_id": ID[name],
                             "area": area / copies, "bbox": [0, 0, 1, 1], "iscrowd": 0})
    anns.append({"id": len(anns) + 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 2, 5], "iscrowd": 1})
    return {
        "images": [{"id": i, "file_name": f"COCO_val2014_{i:012d}.jpg"} for i in IMAGES],
        "annotations": anns,
        "categories": [{"id": c, "name": n, "supercategory": "x"} for c, n in CATEGORIES.items()],
    }


@pytest.fixture(scope="module")
def instances():
    return _instances()


@pytest.fixture
def coco_root(tmp_path):
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "instances_val2014.json").write_text(json.dumps(_instances()))
    return tmp_path


def _negatives(records, imid):
    return [r["object"] for r in records if r["image_id"] == imid and r["label"] == "no"]


def _positives(records, imid):
    return [r["object"] for r in records if r["image_id"] == imid and r["label"] == "yes"]


def _cooc():
    cooc = Counter()
    for imid in ELIGIBLE:
        for a in IMAGES[imid]:
            for b in IMAGES[imid]:
                if a != b:
                    cooc[a, b] += 1
    return cooc


# ----------------------------------------------------------------------------- loading


def test_load_instances_finds_files(coco_root, tmp_path_factory):
    data = load_coco_instances(coco_root)
    assert len(data["images"]) == 11
    assert load_coco_instances(coco_root / "annotations") == data
    assert load_coco_instances(coco_root / "annotations" / "instances_val2014.json") == data
    other = tmp_path_factory.mktemp("coco2017")
    (other / "instances_train2017.json").write_text(json.dumps(data))
    assert load_coco_instances(other, split="train") == data
    # a path works directly in build_pope_questions
    assert build_pope_questions(coco_root, n_images=None) == build_pope_questions(data, n_images=None)


def test_load_instances_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_coco_instances(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"no COCO instances file.*instances_val2014\.json"):
        load_coco_instances(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        build_pope_questions(tmp_path / "missing.json")
    bad = tmp_path / "instances_val2014.json"
    bad.write_text(json.dumps({"annotations": [], "images": []}))
    with pytest.raises(ValueError, match=r"instances_val2014\.json.*'categories'"):
        load_coco_instances(tmp_path)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"instances_val2014\.json: not valid JSON"):
        load_coco_instances(bad)
    with pytest.raises(ValueError, match="split"):
        load_coco_instances(tmp_path, split="test")


# ----------------------------------------------------------------------------- building


def test_records_balance_and_shared_positives(instances):
    out = build_pope_questions(instances, n_images=None)
    assert list(out) == ["random", "popular", "adversarial"]
    ids = [r["question_id"] for rs in out.values() for r in rs]
    assert len(ids) == len(set(ids)) == 3 * 8 * 6
    for strategy, records in out.items():
        assert sorted({r["image_id"] for r in records}) == ELIGIBLE
        for imid in ELIGIBLE:
            mine = [r for r in records if r["image_id"] == imid]
            assert [r["label"] for r in mine] == ["yes", "no"] * 3  # balanced, alternating as in POPE
            pos, neg = _positives(records, imid), _negatives(records, imid)
            assert set(pos) <= set(IMAGES[imid]) and len(set(pos)) == 3
            assert not set(neg) & set(IMAGES[imid]) and len(set(neg)) == 3
            assert "toaster" not in neg  # never annotated: not in the vocabulary
            assert pos == _positives(out["random"], imid)  # same positives for every strategy
        r = records[0]
        assert set(r) == {"question_id", "image_id", "image", "object", "label", "strategy", "question"}
        assert r["strategy"] == strategy and r["question_id"] == f"{strategy}-0"
        assert r["image"] == f"COCO_val2014_{r['image_id']:012d}.jpg"
        assert r["question"] == f"Is there a {r['object']} in the image?".replace("a oven", "an oven")


def test_question_text():
    assert pope_question("dining table") == "Is there a dining table in the image?"
    assert pope_question("oven") == "Is there an oven in the image?"


def test_random_negatives_are_uniform_over_absent(instances):
    seen = set()
    for seed in range(40):
        recs = build_pope_questions(instances, None, strategies=["random"], seed=seed)["random"]
        seen |= set(_negatives(recs, 8))
    assert seen == {"person", "bicycle", "bottle", "cup", "chair", "dining table", "oven"}


def test_popular_negatives_follow_frequency(instances):
    recs = build_pope_questions(instances, n_images=None, strategies=("popular",), seed=3)["popular"]
    assert _negatives(recs, 1) == ["chair", "dining table", "cup"]
    assert _negatives(recs, 2) == ["chair", "dining table", "dog"]
    assert _negatives(recs, 8) == ["person", "chair", "dining table"]
    assert _negatives(recs, 6) == ["dining table", "cup", "bicycle"]  # tie at 2: bicycle (id 2), not dog (18)
    assert _negatives(recs, 5) == ["car", "bicycle", "dog"]
    everything = build_pope_questions(instances, None, strategies="popular", counts_from="all")["popular"]
    assert _negatives(everything, 5) == ["car", "oven", "bicycle"]  # images 9-10 lift the oven to 3 images


def test_adversarial_negatives_follow_cooccurrence(instances):
    recs = build_pope_questions(instances, None, strategies=["adversarial"], positives="area")["adversarial"]
    # image 8 (car dog cat): car -> person (5); dog -> bicycle (person used); cat co-occurs only with
    # present objects, so its negative is drawn at random from the rest.
    assert _positives(recs, 8) == ["car", "dog", "cat"]
    neg8 = _negatives(recs, 8)
    assert neg8[:2] == ["person", "bicycle"]
    assert neg8[2] in {"chair", "dining table", "cup", "bottle", "oven"}
    fallbacks = set()
    for seed in range(10):
        again = build_pope_questions(instances, None, strategies=["adversarial"], seed=seed, positives="area")
        fallbacks.add(_negatives(again["adversarial"], 8)[2])
    assert len(fallbacks) > 1  # a random draw, not a fixed order
    # image 7 (person chair table oven): person -> car (5 > cup 3); chair -> cup (2 > bottle 1);
    # dining table: nothing left that co-occurs -> random.
    assert _positives(recs, 7) == ["person", "chair", "dining table"]
    neg7 = _negatives(recs, 7)
    assert neg7[:2] == ["car", "cup"] and neg7[2] in {"bicycle", "cat", "dog", "bottle"}

    pooled = build_pope_questions(instances, None, strategies=["adversarial"], adversarial="pooled")
    pooled = pooled["adversarial"]
    assert _negatives(pooled, 2) == ["chair", "dining table", "dog"]
    assert _negatives(pooled, 6) == ["dining table", "cup", "bicycle"]

    # With random positives, each negative is the absent, unused category co-occurring most with its positive.
    cooc = _cooc()
    for seed in range(3):
        recs = build_pope_questions(instances, None, strategies=["adversarial"], seed=seed)["adversarial"]
        for imid in ELIGIBLE:
            used = []
            for p, n in zip(_positives(recs, imid), _negatives(recs, imid)):
                left = [c for c in CATEGORIES.values() if c not in IMAGES[imid] + used + ["toaster"]]
                best = max(cooc[p, c] for c in left)
                if best:
                    assert cooc[p, n] == best
                    assert ID[n] == min(ID[c] for c in left if cooc[p, c] == best)
                used.append(n)


def test_seeded_and_deterministic(instances):
    a = build_pope_questions(instances, n_images=5, seed=7)
    assert a == build_pope_questions(instances, n_images=5, seed=7)
    assert a != build_pope_questions(instances, n_images=5, seed=8)
    image_sets = {tuple(sorted({r["image_id"] for r in build_pope_questions(instances, 5, seed=s)["random"]}))
                  for s in range(10)}
    assert len(image_sets) > 1  # the images are drawn at random too
    chosen = sorted({r["image_id"] for r in a["random"]})
    assert len(chosen) == 5 and set(chosen) <= set(ELIGIBLE)
    assert [r["image_id"] for r in a["popular"]] == sorted(r["image_id"] for r in a["popular"])
    # a strategy's questions do not depend on the other strategies built
    assert build_pope_questions(instances, 5, seed=7, strategies=["random"])["random"] == a["random"]
    only = build_pope_questions(instances, image_ids=[8, 2], strategies=["popular"])["popular"]
    assert [r["image_id"] for r in only][::6] == [8, 2]


def test_build_errors(instances):
    with pytest.raises(ValueError, match="frequent"):
        build_pope_questions(instances, strategies=("random", "frequent"))
    with pytest.raises(ValueError, match=r"only 8 images.*9 requested"):
        build_pope_questions(instances, n_images=9)
    with pytest.raises(ValueError, match=r"not eligible.*\[9\]"):
        build_pope_questions(instances, image_ids=[1, 9])
    with pytest.raises(ValueError, match=r"not in the annotations.*\[99\]"):
        build_pope_questions(instances, image_ids=[99])
    with pytest.raises(ValueError, match="adversarial"):
        build_pope_questions(instances, adversarial="hardest")


# ----------------------------------------------------------------------------- parsing and scores


@pytest.mark.parametrize(("text", "keepsight", "pope", "opera"), [
    ("Yes, there is.", "yes", "yes", "yes"),
    ("no", "no", "no", "no"),
    ("No", "no", "no", "no"),
    ("There is no dog.", "no", "no", "no"),
    ("I cannot tell", None, "yes", "yes"),
    ("YES", "yes", "yes", "yes"),
    ("NO", "no", "yes", "no"),  # POPE matches "No"/"no"/"not" case-sensitively; OPERA lists "NO" too
    ("NO.", "no", "yes", "no"),
    ("no!", "no", "yes", "yes"),  # exact tokens: "no!" is not "no"
    ("Not", "no", "yes", "yes"),
    ("Not that I can see.", "no", "yes", "yes"),
    ("isn't", None, "yes", "no"),  # OPERA: any word ending in n't
    ("I don't see one.", None, "yes", "no"),
    ("Yes, but not a dog.", "yes", "no", "no"),  # POPE: any "not" in the first sentence
    ("Yes, there is a dog. There is not a cat.", "yes", "yes", "no"),  # POPE: first sentence only; OPERA: all
    ("I see a cat. There is no dog.", "no", "yes", "no"),
    ("No\nThere is none", "no", "yes", "yes"),  # split on single spaces: "No\nThere" is one token
    ("No, there is not", "no", "no", "no"),
    ("", None, "yes", "yes"),  # empty: no "unknown" class under POPE / OPERA
])
def test_parse_yes_no(text, keepsight, pope, opera):
    assert parse_yes_no(text) == pope  # POPE's evaluate.py is the default
    assert parse_yes_no(text, rule="pope") == pope
    assert parse_yes_no(text, rule="keepsight") == keepsight
    assert parse_yes_no(text, rule="first") == keepsight  # the earlier name
    assert parse_yes_no(text, rule="opera") == opera


def _pope_reference(text: str) -> str:
    """POPE's evaluate.py, lines 9-21, verbatim but for the names."""
    if text.find('.') != -1:
        text = text.split('.')[0]
    text = text.replace(',', '')
    words = text.split(' ')
    return 'no' if ('No' in words or 'not' in words or 'no' in words) else 'yes'


def _opera_reference(line: str) -> str:
    """OPERA's pope_eval.py recorder, for one answer."""
    neg_words = ["No", "not", "no", "NO"]
    line = line.replace('.', '').replace(',', '')
    words = line.split(' ')
    return 'no' if any(w in neg_words for w in words) or any(w.endswith("n't") for w in words) else 'yes'


def test_parsers_match_the_reference_code():
    import random
    rng = random.Random(0)
    pieces = ["No", "no", "NO", "not", "Not", "yes", "Yes", "isn't", "don't", "there", "is", "a", "dog", ".", ",",
              " ", "  ", "\n", "!", "no.", "No,", "n't"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) + rng.choice(["", " "]) for _ in range(rng.randint(0, 8)))
        assert parse_yes_no(text, "pope") == _pope_reference(text), text
        assert parse_yes_no(text, "opera") == _opera_reference(text), text
    with pytest.raises(ValueError, match="unknown yes/no parsing rule 'llava'"):
        parse_yes_no("yes", "llava")
    with pytest.raises(ValueError, match="unknown yes/no parsing rule"):
        pope_scores([{"question_id": 1, "label": "yes"}], {1: "yes"}, rule="llava")


def _scored_set():
    labels = {"random": ["yes", "yes", "yes", "no", "no", "no"], "popular": ["yes", "no", "yes", "no"]}
    texts = {"random": ["Yes", "yes there is", "No.", "Yes", "no", "I cannot tell"],
             "popular": ["Yes", "Yes", "Yes", "Yes"]}
    records, answers = [], []
    for s in labels:
        for k, (label, text) in enumerate(zip(labels[s], texts[s])):
            records.append({"question_id": f"{s}-{k}", "label": label, "strategy": s})
            answers.append({"question_id": f"{s}-{k}", "answer": text})
    return records, answers


def test_pope_scores_by_hand():
    records, answers = _scored_set()
    s = pope_scores(records, answers, rule="keepsight")  # keepsight's rule: unparsed counts as no
    # random: preds yes yes no | yes no None(->no) vs labels yes yes yes | no no no: TP 2 FN 1 FP 1 TN 2
    r = s["random"]
    assert (r["tp"], r["fn"], r["fp"], r["tn"], r["n"], r["n_unparsed"]) == (2, 1, 1, 2, 6, 1)
    assert r["accuracy"] == pytest.approx(4 / 6)
    assert r["precision"] == pytest.approx(2 / 3) and r["recall"] == pytest.approx(2 / 3)
    assert r["f1"] == pytest.approx(2 / 3) and r["yes_ratio"] == pytest.approx(0.5)
    # popular: all yes on yes no yes no: TP 2 FP 2
    p = s["popular"]
    assert (p["tp"], p["fp"], p["tn"], p["fn"]) == (2, 2, 0, 0)
    assert (p["accuracy"], p["precision"], p["recall"], p["yes_ratio"]) == (0.5, 0.5, 1.0, 1.0)
    assert p["f1"] == pytest.approx(2 / 3)
    # all: TP 4 FP 3 TN 2 FN 1
    a = s["all"]
    assert (a["tp"], a["fp"], a["tn"], a["fn"], a["n"], a["n_unparsed"]) == (4, 3, 2, 1, 10, 1)
    assert a["accuracy"] == pytest.approx(0.6) and a["precision"] == pytest.approx(4 / 7)
    assert a["recall"] == pytest.approx(0.8) and a["f1"] == pytest.approx(2 / 3)
    assert a["yes_ratio"] == pytest.approx(0.7)
    # 95% Wilson interval of 6/10 by hand: centre (0.6 + z²/20) / (1 + z²/10), half-width
    # z * sqrt(0.6 * 0.4 / 10 + z² / 400) / (1 + z²/10), z = 1.96 -> [0.3127, 0.8318]
    z = 1.96
    centre, half = (0.6 + z * z / 20) / (1 + z * z / 10), z * math.sqrt(0.024 + z * z / 400) / (1 + z * z / 10)
    assert (a["accuracy_low"], a["accuracy_high"]) == (pytest.approx(centre - half), pytest.approx(centre + half))
    assert (round(a["accuracy_low"], 4), round(a["accuracy_high"], 4)) == (0.3127, 0.8318)
    assert r["accuracy_low"] < r["accuracy"] < r["accuracy_high"]
    # POPE's rule (the default) reads "I cannot tell" as yes: random gets a 2nd FP and nothing unparsed
    for ref in (pope_scores(records, {a["question_id"]: a["answer"] for a in answers})["random"],
                pope_scores(records, answers, rule="pope")["random"]):
        assert (ref["tp"], ref["fp"], ref["tn"], ref["fn"], ref["n"], ref["n_unparsed"]) == (2, 2, 1, 1, 6, 0)
        assert ref["accuracy"] == pytest.approx(0.5) and ref["precision"] == pytest.approx(0.5)
        assert ref["recall"] == pytest.approx(2 / 3) and ref["f1"] == pytest.approx(4 / 7)
        assert ref["yes_ratio"] == pytest.approx(4 / 6)
    # the output keys are those keepsight always wrote, plus the interval
    assert set(a) == {"accuracy", "accuracy_low", "accuracy_high", "precision", "recall", "f1", "yes_ratio", "n",
                      "n_unparsed", "tp", "fp", "tn", "fn"}
    # all right / all wrong: the interval stays in [0, 1]
    ok = pope_scores([{"question_id": 1, "label": "yes"}, {"question_id": 2, "label": "no"}], {1: "Yes", 2: "No"})
    assert ok["all"]["accuracy"] == ok["all"]["accuracy_high"] == 1.0 and 0 < ok["all"]["accuracy_low"] < 1
    # no yes at all: precision / recall / F1 are 0, not a division error
    none = pope_scores([{"question_id": 1, "label": "yes"}], {1: "no"})["all"]
    assert (none["precision"], none["recall"], none["f1"], none["accuracy"]) == (0.0, 0.0, 0.0, 0.0)
    assert none["accuracy_low"] == 0.0
    with pytest.raises(ValueError, match=r"1 question\(s\) have no answer"):
        pope_scores(records, answers[1:])
    with pytest.raises(ValueError, match="no POPE questions"):
        pope_scores([], answers)


def test_jsonl_round_trip_and_errors(tmp_path, instances):
    out = build_pope_questions(instances, n_images=4, seed=1)
    qpath = write_questions_jsonl(tmp_path / "sub" / "pope.jsonl", out)
    records = read_questions_jsonl(qpath)
    assert records == [r for rs in out.values() for r in rs]
    apath = tmp_path / "answers.jsonl"
    apath.write_text("".join(json.dumps({"question_id": r["question_id"], "answer": r["label"].title() + "."})
                             + "\n" for r in records) + "\n")
    scores = pope_scores(records, read_answers_jsonl(apath))
    assert set(scores) == {"random", "popular", "adversarial", "all"}
    assert all(v["accuracy"] == 1.0 and v["f1"] == 1.0 and v["yes_ratio"] == 0.5 for v in scores.values())

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": "random-0", "answer": "yes"}\nnot json\n')
    with pytest.raises(ValueError, match=re.escape(f"{bad}:2") + ": not valid JSON"):
        read_answers_jsonl(bad)
    bad.write_text('{"question_id": "random-0", "answer": "yes"}\n\n{"question_id": "random-1"}\n')
    with pytest.raises(ValueError, match=re.escape(f"{bad}:3") + ": no string answer"):
        read_answers_jsonl(bad)
    bad.write_text('{"question_id": "q", "answer": "yes"}\n{"question_id": "q", "text": "no"}\n')
    where = re.escape(f"{bad}:2") + ".*already answered at " + re.escape(f"{bad}:1")
    with pytest.raises(ValueError, match=where):
        read_answers_jsonl(bad)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_answers_jsonl(tmp_path / "nope.jsonl")


# ----------------------------------------------------------------------------- keepsight eval pope


def test_eval_pope_runs_a_model_and_scores_an_answers_file(coco_root, tmp_path, capsys):
    from PIL import Image

    from keepsight.cli import main
    from tiny_checkpoints import save_tiny_checkpoint

    (coco_root / "val2014").mkdir()
    for i in IMAGES:
        Image.new("RGB", (32, 32), (10 * i, 0, 0)).save(coco_root / "val2014" / f"COCO_val2014_{i:012d}.jpg")
    model = save_tiny_checkpoint("tiny-llava", tmp_path / "m")
    out = tmp_path / "pope"
    argv = ["eval", "pope", "--coco", str(coco_root), "--images", "4", "--per-image", "2", "--out", str(out)]
    assert main([*argv, "--model", str(model), "--max-new-tokens", "2", "--batch-size", "5"]) == 0
    questions = [json.loads(x) for x in (out / "questions.jsonl").read_text().splitlines()]
    assert len(questions) == 3 * 4 * 2 * 2 and {q["strategy"] for q in questions} == {"random", "popular",
                                                                                      "adversarial"}
    answers = read_answers_jsonl(out / "answers.jsonl")
    assert set(answers) == {q["question_id"] for q in questions}
    scores = json.loads((out / "scores.json").read_text())["scores"]
    assert scores == pope_scores(questions, answers)
    assert "adversarial" in capsys.readouterr().out

    # a hand-written answers file: "yes" to every question -> recall 1, precision = yes share = 0.5
    given = tmp_path / "all-yes.jsonl"
    given.write_text("".join(json.dumps({"question_id": q["question_id"], "text": "Yes."}) + "\n" for q in questions))
    out2 = tmp_path / "pope2"
    assert main(["eval", "pope", "--coco", str(coco_root), "--images", "4", "--per-image", "2", "--out", str(out2),
                 "--answers", str(given)]) == 0
    s = json.loads((out2 / "scores.json").read_text())["scores"]["all"]
    assert (s["recall"], s["precision"], s["accuracy"], s["yes_ratio"]) == (1.0, 0.5, 0.5, 1.0)
    assert abs(s["f1"] - 2 / 3) < 1e-12
    assert main(["eval", "pope", "--coco", str(coco_root), "--out", str(tmp_path / "p3")]) == 2
    assert "give --model" in capsys.readouterr().err


# ----------------------------------------------------------------------------- POPE's published question files


def _line(qid=1, image="COCO_val2014_000000000001.jpg", text="Is there a dog in the image?", label="yes", **kw):
    d = {"question_id": qid, "image": image, "text": text, "label": label, **kw}
    return json.dumps({k: v for k, v in d.items() if v is not ...})


def test_read_published_question_file_crlf(tmp_path):
    head = read_pope_question_file(FIXTURES / "coco_pope_random_head.json")  # the reference file's first lines
    assert [r["label"] for r in head] == ["yes", "no"] * 3
    assert head[0] == {"question_id": "random-1", "pope_question_id": 1, "image": "COCO_val2014_000000310196.jpg",
                       "question": "Is there a snowboard in the image?", "label": "yes", "strategy": "random",
                       "line": 1}
    # the same lines with CRLF endings (as POPE's repository has them), a blank line and a final CRLF
    lines = (FIXTURES / "coco_pope_random_head.json").read_text().splitlines()
    crlf = tmp_path / "coco_pope_adversarial.json"
    crlf.write_bytes(("\r\n".join(lines[:3] + [""] + lines[3:]) + "\r\n").encode())
    again = read_pope_question_file(crlf)
    assert [r["question"] for r in again] == [r["question"] for r in head]
    assert {r["strategy"] for r in again} == {"adversarial"} and again[3]["line"] == 5
    assert again[1]["question_id"] == "adversarial-2"
    assert not any("\r" in r["question"] or "\r" in r["label"] for r in again)
    # images are checked under a root when one is given
    root = tmp_path / "val2014"
    root.mkdir()
    (root / "COCO_val2014_000000310196.jpg").write_bytes(b"x")
    assert read_pope_question_file(crlf, image_root=root) == again
    assert pope_file_strategy("x/aokvqa_pope_popular.json") == "popular"
    assert pope_file_strategy("mine.jsonl") == "mine"


@pytest.mark.parametrize(("line", "message"), [
    ("not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    (_line(image=...), "missing field 'image'"),
    (_line(text=...), "missing field 'text'"),
    (_line(label=...), "missing field 'label'"),
    (_line(qid=...), "missing field 'question_id'"),
    (_line(qid=True), "'question_id' must be an integer or a string"),
    (_line(text=""), "'text' must be a non-empty string"),
    (_line(image=None), "'image' must be a non-empty string"),
    (_line(label="Yes"), "'label' must be 'yes' or 'no', got 'Yes'"),
    (_line(label="unknown"), "'label' must be 'yes' or 'no'"),
    (_line(qid=1, label="no"), re.escape("question_id 1 already used at ") + r".*q\.json:1"),
    (_line(qid=2, image="COCO_val2014_000000000009.jpg"),
     "image 'COCO_val2014_000000000009.jpg' not found under"),
])
def test_question_file_bad_lines_name_the_line(tmp_path, line, message):
    root = tmp_path / "img"
    root.mkdir()
    (root / "COCO_val2014_000000000001.jpg").write_bytes(b"x")
    q = tmp_path / "q.json"
    q.write_bytes((_line() + "\r\n\r\n" + line + "\r\n").encode())  # the bad line is line 3
    with pytest.raises(ValueError, match=re.escape(f"{q}:3: ") + message):
        read_pope_question_file(q, image_root=root)


def test_question_files_together(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json"):
        read_pope_question_file(tmp_path / "missing.json")
    (tmp_path / "empty.json").write_text("\n\n")
    with pytest.raises(ValueError, match="empty.json: no questions"):
        read_pope_question_file(tmp_path / "empty.json")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for d in (a, b):
        for name in ("coco_pope_random.json", "coco_pope_popular.json"):
            (d / name).write_text(_line(1) + "\n" + _line(2, label="no") + "\n")
    (b / "aokvqa_pope_random.json").write_text(_line(1) + "\n")
    recs = read_pope_question_files([a / "coco_pope_random.json", a / "coco_pope_popular.json"])
    assert [r["question_id"] for r in recs] == ["random-1", "random-2", "popular-1", "popular-2"]
    # two "random" files: the stems name the strategies; the same stem twice is an error
    recs = read_pope_question_files([a / "coco_pope_random.json", b / "aokvqa_pope_random.json"])
    assert [r["question_id"] for r in recs] == ["coco_pope_random-1", "coco_pope_random-2", "aokvqa_pope_random-1"]
    with pytest.raises(ValueError, match="both named 'coco_pope_random'"):
        read_pope_question_files([a / "coco_pope_random.json", b / "coco_pope_random.json"])


def test_eval_pope_on_question_files(tmp_path, capsys):
    from PIL import Image

    from keepsight.cli import main
    from tiny_checkpoints import save_tiny_checkpoint

    root = tmp_path / "val2014"
    root.mkdir()
    for i in (1, 2):
        Image.new("RGB", (32, 32), (100 * i, 50, 0)).save(root / f"COCO_val2014_{i:012d}.jpg")
    rand, adv = tmp_path / "coco_pope_random.json", tmp_path / "coco_pope_adversarial.json"
    rand.write_bytes("\r\n".join(_line(k + 1, f"COCO_val2014_{k // 2 + 1:012d}.jpg", f"Is there a {obj} in the "
                                       "image?", label) for k, (obj, label) in
                                 enumerate([("dog", "yes"), ("cat", "no"), ("car", "yes")])).encode() + b"\r\n")
    adv.write_text(_line(1, "COCO_val2014_000000000002.jpg", "Is there an oven in the image?", "no") + "\n")
    model = save_tiny_checkpoint("tiny-llava", tmp_path / "m")
    out = tmp_path / "pope"
    argv = ["eval", "pope", "--questions", str(rand), "--questions", str(adv), "--image-root", str(root),
            "--out", str(out), "--model", str(model), "--max-new-tokens", "3", "--batch-size", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "'pope' rule" in printed and "adversarial" in printed
    questions = [json.loads(x) for x in (out / "questions.jsonl").read_text().splitlines()]
    assert [q["question_id"] for q in questions] == ["random-1", "random-2", "random-3", "adversarial-1"]
    assert questions[3]["question"] == "Is there an oven in the image?"
    answers = read_answers_jsonl(out / "answers.jsonl")
    assert set(answers) == {q["question_id"] for q in questions}
    result = json.loads((out / "scores.json").read_text())
    assert result["parser"] == "pope" and result["questions"] == [str(rand), str(adv)]
    assert result["image_root"] == str(root) and result["max_new_tokens"] == 3
    assert result["scores"] == pope_scores(questions, answers, rule="pope")
    assert set(result["scores"]) == {"random", "adversarial", "all"} and result["scores"]["all"]["n"] == 4
    # greedy: the same answers again
    out_again = tmp_path / "again"
    assert main([*argv[:-7], str(out_again), *argv[-6:]]) == 0
    assert read_answers_jsonl(out_again / "answers.jsonl") == answers

    # scoring a given answers file with another parser; with one file, POPE's own integer ids work too
    given = tmp_path / "given.jsonl"
    given.write_text("".join(json.dumps({"question_id": i, "answer": a}) + "\n"
                             for i, a in [(1, "NO, there isn't."), (2, "No"), (3, "Yes")]))
    for parser, (tp, fp, tn, fn) in [("pope", (2, 0, 1, 0)), ("opera", (1, 0, 1, 1)), ("keepsight", (1, 0, 1, 1))]:
        o = tmp_path / f"scored-{parser}"
        assert main(["eval", "pope", "--questions", str(rand), "--answers", str(given), "--parser", parser,
                     "--out", str(o)]) == 0
        res = json.loads((o / "scores.json").read_text())
        assert res["parser"] == parser and res["model"] is None
        s = res["scores"]["all"]
        assert (s["tp"], s["fp"], s["tn"], s["fn"], s["n"]) == (tp, fp, tn, fn, 3)
    o = tmp_path / "scored-first"
    assert main(["eval", "pope", "--questions", str(rand), "--answers", str(given), "--rule", "first",
                 "--out", str(o)]) == 0
    assert json.loads((o / "scores.json").read_text())["parser"] == "keepsight"
    capsys.readouterr()

    # errors, before any model is loaded
    bad = tmp_path / "bad.json"
    bad.write_text(_line(1) + "\n" + _line(2, "COCO_val2014_000000000007.jpg") + "\n")
    base = ["eval", "pope", "--model", str(model)]
    cases = [
        (["--questions", str(bad), "--image-root", str(root)], f"{bad}:2: image 'COCO_val2014_000000000007.jpg'"),
        (["--questions", str(rand)], "needs --image-root"),
        (["--questions", str(rand), "--coco", str(tmp_path)], "give --coco"),
        ([], "give --coco"),
        (["--questions", str(rand), "--image-root", str(root), "--images", "5"], "--images: for questions built"),
    ]
    for extra, message in cases:
        assert main([*base, *extra, "--out", str(tmp_path / "err")]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--questions", str(rand), "--parser", "llava", "--out", str(tmp_path / "err")])
    assert "unknown yes/no parsing rule 'llava'" in capsys.readouterr().err
    assert not (tmp_path / "err" / "answers.jsonl").exists()
