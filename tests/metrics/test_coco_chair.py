"""COCO CHAIR (keepsight.metrics.coco_chair) and `keepsight eval chair`, on small hand-made COCO files."""

from __future__ import annotations

import argparse
import json

import pytest

from keepsight.commands.eval import add_parser, run
from keepsight.metrics.coco_chair import (
    COCO_SYNONYMS,
    SYNONYM_TO_OBJECT,
    caption_objects,
    coco_chair,
    load_coco_ground_truth,
    read_captions_jsonl,
    singularize,
)

# ----------------------------------------------------------------------------- a tiny COCO

CATEGORIES = {1: "person", 3: "car", 4: "motorcycle", 6: "bus", 15: "bench", 18: "dog", 58: "hot dog",
              70: "toilet", 88: "teddy bear"}

# image id -> (split, instance categories, reference captions)
IMAGES = {
    # GT(1) = {person, dog} from instances + {bench} from the second reference caption.
    1: ("val", [1, 18, 18], ["A man walks his dog on a leash.",
                             "A person and a puppy on the sidewalk next to a bench."]),
    # GT(2) = {person, motorcycle}; "motor bike" in the reference caption is a motorcycle.
    2: ("val", [4, 1], ["A man riding a motor bike down the road."]),
    # GT(3) = {teddy bear, toilet}; "toilet seat" is a toilet (not a chair), "teddy bear" no bear.
    3: ("val", [88], ["A teddy bear sitting on a toilet seat."]),
    # GT(4) = {hot dog}; in the train split, so both splits must be read.
    4: ("train", [58], ["A hot dog with mustard on a plate."]),
}

# Generated captions, with the answers by hand:
#   c1 (img 1) "Two men and a puppy sit on a bench near a dog and a car."  15 words
#       mentions man->person, puppy->dog, bench, dog->dog (repeat counts again), car  = 5
#       hallucinated: car (1); covered {person, dog, bench} = 3 of 3
#   c2 (img 2) "A woman rides a motorbike past parked motorbikes and a bus."  11 words
#       mentions woman->person, motorbike, motorbike (-> motorcycle twice), bus      = 4
#       hallucinated: bus (1); covered {person, motorcycle} = 2 of 2
#   c3 (img 3) "A teddy bear sitting on a toilet seat."  8 words
#       mentions teddy bear, toilet seat -> toilet                                    = 2, none hallucinated
#       covered 2 of 2
#   c4 (img 4) "Two hot dogs on a plate."  6 words
#       mentions hot dog (not dog)                                                    = 1, none hallucinated
#       covered 1 of 1
#   c5 (img 1) "A dog."  2 words
#       mentions dog = 1, none hallucinated; covered {dog} = 1 of 3
# Totals: 5 captions, 13 mentions, 2 hallucinated mentions in 2 captions, covered 9 of 11 GT objects:
#   CHAIRs = 2/5 = 0.4, CHAIRi = 2/13, recall = 9/11, mean length = (15+11+8+6+2)/5 = 8.4
CAPTIONS = [
    {"image_id": 1, "caption": "Two men and a puppy sit on a bench near a dog and a car."},
    {"image_id": 2, "caption": "A woman rides a motorbike past parked motorbikes and a bus."},
    {"image_id": 3, "caption": "A teddy bear sitting on a toilet seat."},
    {"image_id": 4, "caption": "Two hot dogs on a plate."},
    {"image_id": 1, "caption": "A dog."},
]


def _write_coco(ann_dir, year="2014"):
    ann_dir.mkdir(parents=True, exist_ok=True)
    cats = [{"id": i, "name": n, "supercategory": "x"} for i, n in CATEGORIES.items()]
    for split in ("train", "val"):
        ids = [i for i, (s, _, _) in IMAGES.items() if s == split]
        images = [{"id": i, "file_name": f"COCO_{split}{year}_{i:012d}.jpg", "width": 64, "height": 64}
                  for i in ids]
        inst = [{"id": 100 * i + k, "image_id": i, "category_id": c, "bbox": [0, 0, 1, 1], "area": 1,
                 "iscrowd": 0} for i in ids for k, c in enumerate(IMAGES[i][1])]
        caps = [{"id": 100 * i + k, "image_id": i, "caption": t} for i in ids for k, t in enumerate(IMAGES[i][2])]
        (ann_dir / f"instances_{split}{year}.json").write_text(
            json.dumps({"images": images, "annotations": inst, "categories": cats}))
        (ann_dir / f"captions_{split}{year}.json").write_text(json.dumps({"images": images, "annotations": caps}))
    return ann_dir


@pytest.fixture
def coco(tmp_path):
    root = tmp_path / "coco"
    _write_coco(root / "annotations")
    return root


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ----------------------------------------------------------------------------- words -> objects


def test_synonym_table_has_the_80_categories():
    assert len(COCO_SYNONYMS) == 80
    assert all(SYNONYM_TO_OBJECT[cat] == cat for cat in COCO_SYNONYMS)
    assert SYNONYM_TO_OBJECT["puppy"] == "dog"
    assert SYNONYM_TO_OBJECT["motor bike"] == "motorcycle"  # the reference list's " motor bike" typo, fixed
    assert SYNONYM_TO_OBJECT["iphone"] == "cell phone"


@pytest.mark.parametrize("plural, singular", [
    ("men", "man"), ("women", "woman"), ("policemen", "policeman"), ("children", "child"),
    ("people", "person"), ("mice", "mouse"), ("geese", "goose"), ("teeth", "tooth"), ("feet", "foot"),
    ("knives", "knife"), ("oxen", "ox"), ("puppies", "puppy"), ("benches", "bench"), ("glasses", "glass"),
    ("buses", "bus"), ("bus", "bus"), ("tomatoes", "tomato"), ("canoes", "canoe"), ("ties", "tie"),
    ("skis", "ski"), ("taxis", "taxi"), ("tennis", "tennis"), ("scissors", "scissors"), ("skiing", "skiing"),
    ("dogs", "dog"), ("tvs", "tv"), ("gloves", "glove"), ("olives", "olive"), ("ramen", "ramen"),
])
def test_singularize(plural, singular):
    assert singularize(plural) == singular


@pytest.mark.parametrize("caption, words, objects", [
    ("Two puppies and three men", ["puppy", "man"], ["dog", "person"]),
    ("a motor bike, a motorbike and motorcycles", ["motor bike", "motorbike", "motorcycle"], ["motorcycle"] * 3),
    ("hot dogs next to a dog", ["hot dog", "dog"], ["hot dog", "dog"]),
    ("a teddy bear and a bear", ["teddy bear", "bear"], ["teddy bear", "bear"]),
    ("a teddy-bear", ["teddy bear"], ["teddy bear"]),
    ("a baby elephant and an adult giraffe", ["elephant", "giraffe"], ["elephant", "giraffe"]),
    ("a baby", ["baby"], ["person"]),
    ("a passenger train on the train tracks", ["train"], ["train"]),
    ("a man in a bow tie", ["man", "tie"], ["person", "tie"]),
    ("the seat of the toilet", ["toilet"], ["toilet"]),  # with a toilet, a seat is no chair
    ("a chair and a seat", ["chair", "seat"], ["chair", "chair"]),
    ("a man skiing down a hill", ["man"], ["person"]),  # no verb lemmatisation: skiing is not skis
    ("a red bus and two wine glasses", ["bus", "wine glass"], ["bus", "wine glass"]),
    ("a stop sign by a fire hydrant", ["stop sign", "fire hydrant"], ["stop sign", "fire hydrant"]),
])
def test_caption_objects(caption, words, objects):
    assert caption_objects(caption) == (words, objects)


# ----------------------------------------------------------------------------- ground truth


def test_ground_truth_joins_instances_and_reference_captions(coco):
    gt = load_coco_ground_truth(coco)
    assert gt == {1: {"person", "dog", "bench"}, 2: {"person", "motorcycle"}, 3: {"teddy bear", "toilet"},
                  4: {"hot dog"}}
    # the annotations folder itself works too, and image_ids restricts the result
    assert load_coco_ground_truth(coco / "annotations", image_ids=[2, 4]) == {2: {"person", "motorcycle"},
                                                                              4: {"hot dog"}}


def test_ground_truth_from_files_given_directly(coco):
    ann = coco / "annotations"
    gt = load_coco_ground_truth([ann / "instances_val2014.json"])  # instances only: no bench
    assert gt[1] == {"person", "dog"}
    result = coco_chair([{"image_id": 1, "caption": "a dog on a bench"}], gt)
    assert result["per_caption"][0]["hallucinated"] == [["bench", "bench"]]
    gt = load_coco_ground_truth([ann / "instances_val2014.json", ann / "captions_val2014.json"])
    assert gt[1] == {"person", "dog", "bench"}


def test_ground_truth_accepts_2017_names(tmp_path):
    _write_coco(tmp_path / "ann2017", year="2017")
    assert load_coco_ground_truth(tmp_path / "ann2017")[4] == {"hot dog"}


def test_missing_annotations_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_coco_ground_truth(tmp_path / "nowhere")
    (tmp_path / "empty" / "annotations").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"instances_train2014\.json.*captions_val2014\.json"):
        load_coco_ground_truth(tmp_path / "empty")
    only = tmp_path / "only"
    _write_coco(only)
    for p in only.glob("captions_*"):
        p.unlink()
    with pytest.raises(FileNotFoundError, match=r"no captions file.*captions_train2014\.json"):
        load_coco_ground_truth(only)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_coco_ground_truth([tmp_path / "nope.json"])


# ----------------------------------------------------------------------------- the metric


def test_coco_chair_hand_computed(coco):
    r = coco_chair(CAPTIONS, load_coco_ground_truth(coco))
    assert r["CHAIRs"] == pytest.approx(2 / 5)
    assert r["CHAIRi"] == pytest.approx(2 / 13)
    assert r["recall"] == pytest.approx(9 / 11)
    assert (r["n_captions"], r["n_mentions"], r["n_hallucinated"], r["n_hallucinated_captions"]) == (5, 13, 2, 2)
    assert (r["n_covered"], r["n_gt_objects"]) == (9, 11)
    assert r["mean_length"] == pytest.approx(8.4)
    c1, c2, c3, c4, c5 = r["per_caption"]
    assert c1["mentions"] == ["man", "puppy", "bench", "dog", "car"]
    assert c1["objects"] == ["person", "dog", "bench", "dog", "car"]
    assert c1["hallucinated"] == [["car", "car"]]
    assert (c1["chair_s"], c1["chair_i"], c1["recall"]) == (1, pytest.approx(1 / 5), 1.0)
    assert c2["objects"] == ["person", "motorcycle", "motorcycle", "bus"]
    assert c2["hallucinated"] == [["bus", "bus"]]
    assert c2["chair_i"] == pytest.approx(1 / 4)
    assert c3["objects"] == ["teddy bear", "toilet"] and c3["hallucinated"] == []
    assert c4["objects"] == ["hot dog"] and c4["chair_s"] == 0
    assert c5["recall"] == pytest.approx(1 / 3)
    assert c5["gt_objects"] == ["bench", "dog", "person"]


def test_repeated_hallucination_counts_each_time():
    gt = {7: {"person"}}
    r = coco_chair([{"image_id": 7, "caption": "a cat, another cat and a man"}], gt)
    assert (r["n_mentions"], r["n_hallucinated"]) == (3, 2)
    assert r["CHAIRi"] == pytest.approx(2 / 3) and r["CHAIRs"] == 1.0 and r["recall"] == 1.0


def test_no_mentions_and_errors():
    r = coco_chair([{"image_id": 7, "caption": "nothing to see here"}], {7: {"person"}})
    assert (r["CHAIRs"], r["CHAIRi"], r["recall"], r["n_mentions"]) == (0.0, 0.0, 0.0, 0)
    with pytest.raises(ValueError, match=r"2 image id\(s\) not in the COCO ground truth: 8, 9"):
        coco_chair([{"image_id": i, "caption": "a dog"} for i in (7, 9, 8)], {7: {"dog"}})
    with pytest.raises(ValueError, match="no captions"):
        coco_chair([], {7: {"dog"}})


# ----------------------------------------------------------------------------- JSONL


def test_read_captions_jsonl(tmp_path):
    path = tmp_path / "caps.jsonl"
    path.write_text('{"image_id": 1, "caption": "a dog"}\n\n{"image_id": "2", "text": "a cat"}\n'
                    '{"image_id": 3, "answer": "a bus", "question_id": 9}\n')
    assert read_captions_jsonl(path) == [{"image_id": 1, "caption": "a dog"}, {"image_id": 2, "caption": "a cat"},
                                         {"image_id": 3, "caption": "a bus"}]


@pytest.mark.parametrize("bad, message", [
    ('{"image_id": 3, "caption": "a cat"', r"caps\.jsonl:3: not valid JSON"),
    ('[3, "a cat"]', r"caps\.jsonl:3: expected a JSON object"),
    ('{"caption": "a cat"}', r"caps\.jsonl:3: 'image_id' missing"),
    ('{"image_id": "COCO_3.jpg", "caption": "a cat"}', r"caps\.jsonl:3: 'image_id' missing or not an integer"),
    ('{"image_id": 3, "caption": 5}', r"caps\.jsonl:3: no string caption"),
])
def test_read_captions_jsonl_names_the_bad_line(tmp_path, bad, message):
    path = tmp_path / "caps.jsonl"
    path.write_text('{"image_id": 1, "caption": "a dog"}\n{"image_id": 2, "caption": "a cat"}\n' + bad + "\n")
    with pytest.raises(ValueError, match=message):
        read_captions_jsonl(path)


# ----------------------------------------------------------------------------- CLI


def _parser():
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="command"))
    return p


def test_cli_prints_and_writes_json(coco, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    caps = _write_jsonl(tmp_path / "run" / "caps.jsonl", CAPTIONS)
    args = _parser().parse_args(["eval", "chair", "--captions", str(caps), "--coco", str(coco)])
    assert (args.command, args.eval_command, args.func) == ("eval", "chair", run)
    assert run(args) == 0
    out = capsys.readouterr().out
    assert "CHAIRs       40.00" in out
    assert "CHAIRi       15.38" in out
    assert "recall       81.82" in out
    assert "captions 5, mentions 13, hallucinated 2, mean length 8.4 words" in out
    written = tmp_path / "run" / "caps.chair.json"
    assert f"wrote {written}" in out
    data = json.loads(written.read_text())
    assert data["CHAIRi"] == pytest.approx(2 / 13) and data["n_captions"] == 5
    assert data["per_caption"][1]["hallucinated"] == [["bus", "bus"]]
    assert not list((tmp_path / "run").glob("*.tmp"))  # the temporary file was renamed into place


def test_cli_out_and_unknown_image(coco, tmp_path):
    caps = _write_jsonl(tmp_path / "caps.jsonl", CAPTIONS)
    out = tmp_path / "res" / "chair.json"
    assert run(_parser().parse_args(["eval", "chair", "--captions", str(caps), "--coco", str(coco),
                                     "--out", str(out)])) == 0
    assert json.loads(out.read_text())["CHAIRs"] == pytest.approx(0.4)
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"image_id": 999, "caption": "a dog"}])
    with pytest.raises(ValueError, match="999"):
        run(_parser().parse_args(["eval", "chair", "--captions", str(bad), "--coco", str(coco)]))
