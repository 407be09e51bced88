"""A user's datasets as ``Sample``s: every source gives the same samples for the same content, images are
opened lazily, the pre-flight check names bad rows, and every bad input is a clear error naming its row / file."""

import json

import datasets
import numpy as np
import pytest
from PIL import Image

from keepsight.data import HFSource, LlavaSource, export_llava, open_dataset, preflight
from keepsight.data import sources as sources_module
from keepsight.train.pvm_grpo import GRPOData
from keepsight.train.rewards import match_reward
from keepsight.world import generate_scenes, world_config
from keepsight.world.tasks import VLMDataset, WorldSamples


@pytest.fixture(scope="module")
def world_items():
    cfg = world_config()
    samples = WorldSamples.from_scenes(cfg, generate_scenes(cfg, 3, seed=5))
    return VLMDataset(samples, ("caption", "yes_no", "chat"), seed=0, yes_no_categories=1, max_turns=4)


@pytest.fixture(scope="module")
def llava_json(world_items, tmp_path_factory):
    root = tmp_path_factory.mktemp("llava")
    return export_llava(world_items, root / "data.json", root / "images")


def _pixels(im):
    return np.asarray(im.convert("RGB"))


def _same(a, b):
    assert len(a) == len(b)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x.messages == y.messages, i
        assert len(x.images) == len(y.images) and all((_pixels(p) == _pixels(q)).all()
                                                       for p, q in zip(x.images, y.images))


def _hf_rows(dataset, images_as):
    rows = []
    for i in range(len(dataset)):
        s = dataset[i]
        rows.append({"messages": s.messages, "images": images_as(i, s), "id": s.id})
    return rows


def test_every_source_gives_the_same_samples(world_items, llava_json, tmp_path):
    from_json = open_dataset(llava_json)
    assert isinstance(from_json, LlavaSource)
    _same(world_items, from_json)  # the world, exported, reads back exactly

    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in json.loads(llava_json.read_text())))
    _same(from_json, open_dataset(jsonl, image_folder=llava_json.parent))

    pil_rows = _hf_rows(world_items, lambda i, s: s.images)
    ds = datasets.Dataset.from_list(pil_rows)
    ds.save_to_disk(str(tmp_path / "disk"))
    from_disk = open_dataset(tmp_path / "disk")
    assert isinstance(from_disk, HFSource)
    _same(world_items, from_disk)

    (tmp_path / "pq").mkdir()
    ds.to_parquet(str(tmp_path / "pq" / "train-0.parquet"))
    _same(world_items, open_dataset(tmp_path / "pq"))

    # TRL's layout with image paths, in JSONL, resolved against --image-folder
    path_rows = _hf_rows(world_items, lambda i, s: [f"{i:06d}-{j}.png" for j in range(len(s.images))])
    hf_jsonl = tmp_path / "messages.jsonl"
    hf_jsonl.write_text("".join(json.dumps(r) + "\n" for r in path_rows))
    _same(world_items, open_dataset(hf_jsonl, image_folder=llava_json.parent / "images"))


def test_question_answer_columns(tmp_path):
    img = Image.new("RGB", (8, 8), (200, 10, 10))
    ds = datasets.Dataset.from_list([{"question": "what colour ?", "answer": "red", "image": img, "category": "c"}])
    ds.save_to_disk(str(tmp_path / "qa"))
    src = open_dataset(tmp_path / "qa")
    s = src[0]
    assert s.prompt == "what colour ?" and s.answer == "red" and len(s.images) == 1 and src.category(0) == "c"
    assert s.messages[0]["content"][0] == {"type": "image"}


def test_llava_layouts_placeholders_multi_image_and_text_only(tmp_path):
    for name, colour in (("a.png", (255, 0, 0)), ("b.png", (0, 0, 255))):
        Image.new("RGB", (8, 8), colour).save(tmp_path / name)
    rows = [
        {"id": "cap", "image": "a.png", "conversations": [{"from": "human", "value": "<image>\ndescribe"},
                                                          {"from": "gpt", "value": "red"}]},
        {"id": "late", "image": "a.png", "conversations": [{"from": "human", "value": "look: <image> what ?"},
                                                           {"from": "gpt", "value": "red"}]},
        {"id": "none", "image": "a.png", "conversations": [{"from": "human", "value": "no placeholder"},
                                                           {"from": "gpt", "value": "ok"}]},
        {"id": "two", "image": ["a.png", "b.png"],
         "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "<image> vs <image>"},
                           {"from": "gpt", "value": "red , blue"}, {"from": "human", "value": "and ?"},
                           {"from": "gpt", "value": "done"}]},
        {"id": "text", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
    ]
    (tmp_path / "d.json").write_text(json.dumps(rows))
    src = open_dataset(tmp_path / "d.json")
    cap, late, none, two, text = (src[i] for i in range(5))
    assert cap.messages[0]["content"] == [{"type": "image"}, {"type": "text", "text": "describe"}]
    assert late.messages[0]["content"] == [{"type": "text", "text": "look:"}, {"type": "image"},
                                           {"type": "text", "text": "what ?"}]
    assert none.messages[0]["content"][0] == {"type": "image"}  # LLaVA's convention: image first
    assert [m["role"] for m in two.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert [_pixels(im)[0, 0].tolist() for im in two.images] == [[255, 0, 0], [0, 0, 255]]
    assert text.images == [] and text.answer == "hello"
    _, report = preflight(src)
    assert (report.rows, report.turns, report.images, report.bad_rows) == (5, 13, 5, 0)


def test_no_image_is_opened_while_the_dataset_is_built(llava_json, tmp_path, monkeypatch, world_items):
    opened = []
    real = Image.open

    def counting(*a, **k):
        opened.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(sources_module.Image, "open", counting)
    src = open_dataset(llava_json)
    datasets.Dataset.from_list(_hf_rows(world_items, lambda i, s: s.images)).save_to_disk(str(tmp_path / "d"))
    opened.clear()
    hf = open_dataset(tmp_path / "d")
    assert opened == [] and len(src) == len(hf) == len(world_items)
    src[0]
    assert len(opened) == len(world_items[0].images)  # reading a row opens its images, and only those


def _bad(tmp_path, rows, name="bad.json"):
    path = tmp_path / name
    path.write_text(json.dumps(rows) if name.endswith(".json") else rows)
    return path


GOOD = [{"from": "human", "value": "<image> q"}, {"from": "gpt", "value": "a"}]


@pytest.mark.parametrize("rows, message", [
    ([{"id": "x1", "image": "gone.png", "conversations": GOOD}], r"row 0 \(id x1\): image .*gone.png is missing"),
    ([{"id": "x2", "image": "ok.png", "conversations": [{"from": "human", "value": "<image> <image>"},
                                                       {"from": "gpt", "value": "a"}]}],
     r"row 0 \(id x2\): 2 <image> placeholders but 1 images"),
    ([{"id": "x3", "image": "ok.png", "conversations": []}], r"row 0 \(id x3\): empty or missing 'conversations'"),
    ([{"id": "x4", "conversations": [{"from": "bot", "value": "a"}]}],
     r"row 0 \(id x4\): turn 0 is from an unknown speaker 'bot'"),
    ([{"id": "x5", "image": "text.png", "conversations": GOOD}], r"row 0 \(id x5\): image .*text.png is unreadable"),
    ([{"id": "x6", "image": "ok.png", "conversations": [{"from": "human", "value": "<image> q"}]}],
     r"row 0 \(id x6\): no assistant turn"),
])
def test_bad_rows_are_named(tmp_path, rows, message):
    Image.new("RGB", (4, 4)).save(tmp_path / "ok.png")
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(ValueError, match=message):
        preflight(open_dataset(_bad(tmp_path, rows)))


def test_malformed_json_line_names_path_and_line(tmp_path):
    path = _bad(tmp_path, json.dumps({"id": 1, "conversations": GOOD}) + "\n{oops\n", "bad.jsonl")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        open_dataset(path)


def test_a_file_that_is_no_dataset_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("not a dataset")
    with pytest.raises(ValueError, match=r"data file .*notes\.txt is not a dataset"):
        open_dataset(tmp_path / "notes.txt")
    (tmp_path / "rows.parquet").write_text("not parquet either")
    with pytest.raises(ValueError, match=r"data .*rows\.parquet is not readable as parquet"):
        open_dataset(tmp_path / "rows.parquet")


def test_skip_bad_rows_keeps_the_good_ones_and_counts(tmp_path):
    Image.new("RGB", (4, 4)).save(tmp_path / "ok.png")
    rows = [{"id": str(i), "image": "ok.png" if i % 2 else "gone.png", "conversations": GOOD} for i in range(6)]
    with pytest.raises(ValueError, match="3 of 6 rows are bad.*--skip-bad-rows"):
        preflight(open_dataset(_bad(tmp_path, rows)))
    ds, report = preflight(open_dataset(_bad(tmp_path, rows)), skip_bad_rows=True)
    assert len(ds) == 3 and [ds[i].id for i in range(3)] == ["1", "3", "5"]
    assert (report.bad_rows, report.skipped, report.missing_images) == (3, 3, 3) and "3 skipped" in report.line()


def test_grpo_on_data_without_answers_is_refused(tmp_path):
    Image.new("RGB", (4, 4)).save(tmp_path / "ok.png")
    rows = [{"id": "q", "image": "ok.png", "conversations": [{"from": "human", "value": "<image> q"}]}]
    src, _ = preflight(open_dataset(_bad(tmp_path, rows)), need_answers=False)
    with pytest.raises(ValueError, match=r"row 0 \(id q\): no assistant turn .* GRPO"):
        GRPOData.from_samples(src, [match_reward("exact")])


def test_grpo_data_from_samples_keeps_history_and_reference(llava_json):
    src = open_dataset(llava_json)
    data = GRPOData.from_samples(src, [match_reward("exact")])
    chat = next(i for i in range(len(src)) if len(src[i].messages) > 2)
    row = data.dataset[chat]
    # Arrow gives every content part both keys (an image part's text is None); chat templates read the type
    prompt = [{"role": m["role"], "content": [{k: v for k, v in p.items() if v is not None} for p in m["content"]]}
              for m in row["prompt"]]
    assert prompt == src[chat].prompt_messages and row["answer"] == src[chat].answer
    assert len(data.dataset) == len(src) and data.fingerprint == src.fingerprint()


def test_a_null_image_is_a_bad_row_not_a_text_only_one(tmp_path):
    rows = [{"id": "a", "image": None, "conversations": [{"from": "human", "value": "what is it ?"},
                                                          {"from": "gpt", "value": "a cat"}]},
            {"id": "b", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=r"1 of 2 rows are bad; the first: .*'image' is None; give the image path, "
                                         r"or drop the key for a text-only row"):
        preflight(open_dataset(path))
    ds, report = preflight(open_dataset(path), skip_bad_rows=True)
    assert len(ds) == 1 and report.skipped == 1 and ds[0].id == "b"


def test_empty_undecodable_and_all_bad_data_files_are_errors_naming_them(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty\.json: the file is empty \(no rows\)"):
        open_dataset(empty)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"id": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"latin\.jsonl: not UTF-8 text \(byte 11"):
        open_dataset(latin)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"id": "a", "image": "nope.png", "conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]))
    with pytest.raises(ValueError, match=r"no usable row: all 1 rows are bad; the first: .*nope\.png is missing"):
        preflight(open_dataset(bad), skip_bad_rows=True)


def test_a_decompression_bomb_is_an_unreadable_image(tmp_path, monkeypatch):
    from PIL import Image as PILImage

    Image.new("RGB", (64, 64)).save(tmp_path / "big.png")
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 1000)  # 64 x 64 is then more than twice the limit: a bomb
    with pytest.raises(ValueError, match=r"big\.png is not a readable image \(DecompressionBombError"):
        sources_module.open_image(tmp_path / "big.png")
    assert sources_module._check_image(tmp_path / "big.png") == "unreadable"
