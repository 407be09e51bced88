import hashlib
import json

import pytest

from keepsight.world import (
    build_world,
    description,
    generate_scenes,
    load_world,
    parse_description,
    world_config,
)
from keepsight.world.config import DIFFICULTIES, WorldConfig
from keepsight.world.dataset import read_world
from keepsight.world.render import png_bytes, render
from keepsight.world.texts import (
    YES_NO_CATEGORIES,
    caption,
    cell_questions,
    count_questions,
    lookup_questions,
    open_questions,
    place,
    rehearsal_questions,
    yes_no_questions,
)


def _digest(path):
    h = hashlib.sha256()
    for f in sorted(path.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(path).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def test_same_seed_same_bytes_different_seed_differs(tmp_path):
    cfg = world_config()
    a = build_world(tmp_path / "a", cfg, 12, seed=5)
    b = build_world(tmp_path / "b", cfg, 12, seed=5)
    c = build_world(tmp_path / "c", cfg, 12, seed=6)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


def test_scene_depends_only_on_seed_and_index():
    cfg = world_config()
    few, many = generate_scenes(cfg, 3, seed=1), generate_scenes(cfg, 30, seed=1)
    assert [s.to_json() for s in few] == [s.to_json() for s in many[:3]]
    assert png_bytes(render(few[2], cfg.noise_std)) == png_bytes(render(many[2], cfg.noise_std))


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_scenes_respect_config(difficulty):
    cfg = world_config(difficulty)
    for s in generate_scenes(cfg, 60, seed=3):
        assert cfg.min_objects <= len(s.objects) <= cfg.max_objects
        cells = [o.cell for o in s.objects]
        assert cells == sorted(cells) and len(set(cells)) == len(cells)  # raster order, one per cell
        for o in s.objects:
            assert o.shape in cfg.shapes and o.colour in cfg.colours and o.size in cfg.sizes
            assert 0 <= o.row < cfg.grid[0] and 0 <= o.col < cfg.grid[1]
            # the object's disc stays inside its own cell: objects never overlap
            cell = cfg.cell_px
            assert o.col * cell <= o.cx - o.radius and o.cx + o.radius <= (o.col + 1) * cell
            assert o.row * cell <= o.cy - o.radius and o.cy + o.radius <= (o.row + 1) * cell
        assert render(s, cfg.noise_std).size == (cfg.image_size, cfg.image_size)


def test_scene_priors_shape_the_attribute_distribution():
    cfg = world_config(prior_colour=0.8, prior_shape=0.8)
    objs = [(s, o) for s in generate_scenes(cfg, 300, seed=0) for o in s.objects]
    share = sum(o.colour == s.preferred_colour for s, o in objs) / len(objs)
    assert 0.75 < share < 0.85
    share = sum(o.shape == s.preferred_shape for s, o in objs) / len(objs)
    assert 0.75 < share < 0.85
    # different scene types prefer different colours: the prior is scene-dependent
    assert len({cfg.preferred(t)[0] for t in cfg.scenes}) == len(cfg.scenes)


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_description_parses_back_to_the_scene_graph(difficulty):
    cfg = world_config(difficulty)
    for s in generate_scenes(cfg, 100, seed=11):
        p = parse_description(description(s))
        assert p.scene == s.scene
        assert p.count == len(s.objects)
        assert [(m.size, m.colour, m.shape, m.row, m.col) for m in p.objects] == [
            (o.size, o.colour, o.shape, o.row, o.col) for o in s.objects
        ]
        words = caption(s).split()
        assert words[1] == s.scene and parse_description(f"there are {words[4]} objects").count == len(s.objects)


def _truth(s, q: str) -> str:
    """Answer a yes/no question from the scene graph, independently of how it was generated."""
    w = q.rstrip(" ?").split()
    at = {place(o.row, o.col): o for o in s.objects}
    if w[:3] == ["is", "there", "a"] and len(w) == 5:  # existence: is there a <colour> <shape>
        ok = any(o.colour == w[3] and o.shape == w[4] for o in s.objects)
    elif w[:2] == ["are", "there"]:  # count
        ok = parse_description(f"there are {w[2]} objects").count == len(s.objects)
    elif w[:4] == ["is", "the", "object", "at"] and w[5] == "a":  # shape
        ok = w[4] in at and at[w[4]].shape == w[6]
    elif w[:4] == ["is", "the", "object", "at"]:  # colour
        ok = w[4] in at and at[w[4]].colour == w[5]
    elif w[:3] == ["is", "there", "a"]:  # position: is there a <shape> at <cell>
        ok = w[5] in at and at[w[5]].shape == w[3]
    elif w[:2] == ["is", "this"]:
        ok = w[3] == s.scene
    else:
        raise AssertionError(q)
    return "yes" if ok else "no"


def test_yes_no_questions_are_true_and_balanced():
    cfg = world_config()
    for s in generate_scenes(cfg, 150, seed=2):
        qs = yes_no_questions(s, cfg)
        assert [q["category"] for q in qs] == [c for c in YES_NO_CATEGORIES for _ in range(2)]
        assert [q["answer"] for q in qs] == ["yes", "no"] * len(YES_NO_CATEGORIES)
        for q in qs:
            assert _truth(s, q["question"]) == q["answer"], (q, s.to_dict())


def test_count_questions_are_true_balanced_and_turn_on_the_number():
    cfg = world_config()
    near_seen = set()
    for s in generate_scenes(cfg, 150, seed=2):
        qs = count_questions(s, cfg)
        assert count_questions(s, cfg) == qs  # deterministic per scene
        assert [q["answer"] for q in qs] == ["yes", "no", "yes", "no"]
        assert {q["category"] for q in qs} == {"count"}
        for q in qs:
            assert _truth(s, q["question"]) == q["answer"], (q, s.to_dict())
        n = len(s.objects)
        numbers = [parse_description(f"there are {q['question'].split()[2]} objects").count for q in qs]
        assert numbers[0] == numbers[2] == n and all(1 <= m <= cfg.max_objects for m in numbers)
        assert abs(numbers[1] - n) == 1  # the near miss
        near_seen.add(numbers[1] - n)
    assert near_seen == {-1, 1}


def test_open_answers_match_scene_graph():
    cfg = world_config()
    for s in generate_scenes(cfg, 50, seed=4):
        at = {place(o.row, o.col): o for o in s.objects}
        for q in open_questions(s):
            w = q["question"].split()
            if q["kind"] == "count":
                assert parse_description(f"there are {q['answer']} objects").count == len(s.objects)
            elif q["kind"] == "colour":
                assert at[w[6]].colour == q["answer"]
            elif q["kind"] == "shape":
                assert at[w[6]].shape == q["answer"]
            else:
                assert q["answer"] == s.scene


def test_cell_questions_name_what_is_there():
    cfg = world_config()
    for s in generate_scenes(cfg, 50, seed=5):
        at = {place(o.row, o.col): o for o in s.objects}
        for q in cell_questions(s, cfg):
            cell = q["question"].split()[3]
            o = at.get(cell)
            assert q["answer"] == ("nothing" if o is None else f"a {o.size} {o.colour} {o.shape}")


def test_lookup_questions_read_every_object_and_some_empty_cells():
    from keepsight.world.tasks import VLMDataset, WorldSamples

    cfg = world_config()
    scenes = generate_scenes(cfg, 50, seed=5)
    for s in scenes:
        at = {place(o.row, o.col): o for o in s.objects}
        qs = lookup_questions(s, cfg)
        asked = {(q["kind"], q["question"].split()[-2]) for q in qs}
        kinds = ("colour", "shape", "colour_at", "shape_at")
        assert asked >= {(k, c) for c in at for k in kinds}  # every object, both attributes, both forms
        for q in qs:
            cell = q["question"].split()[-2]
            if q["kind"] == "empty":
                assert cell not in at and q["answer"] == "nothing"
            elif q["kind"].endswith("_at"):  # the cell restated, then its attribute
                assert q["answer"] == f"{cell} {getattr(at[cell], q['kind'][:-3])}"
            else:
                assert q["answer"] == getattr(at[cell], q["kind"])
        assert sum(q["kind"] == "empty" for q in qs) == min(2, 16 - len(s.objects))
        assert qs == lookup_questions(s, cfg)  # a function of the scene
    data = VLMDataset(WorldSamples.from_scenes(cfg, scenes[:4]), ("lookup",))
    assert len(data) == sum(len(lookup_questions(s, cfg)) for s in scenes[:4])
    assert {data.category(i) for i in range(len(data))} == {"lookup"}


def test_rehearsal_questions_are_some_lookups_and_true_colour_yes_nos():
    from keepsight.world.tasks import VLMDataset, WorldSamples

    cfg = world_config()
    scenes = generate_scenes(cfg, 50, seed=5)
    for s in scenes:
        at = {place(o.row, o.col): o for o in s.objects}
        lookups = lookup_questions(s, cfg)
        qs = rehearsal_questions(s, cfg, lookups=4, colour_yes_no=4)
        assert qs == rehearsal_questions(s, cfg, lookups=4, colour_yes_no=4)  # a function of the scene
        drawn = [q for q in qs if q["kind"] != "colour_yes_no"]
        assert len(drawn) == min(4, len(lookups)) and all(q in lookups for q in drawn)
        yes_nos = [q for q in qs if q["kind"] == "colour_yes_no"]
        assert [q["answer"] for q in yes_nos] == ["yes", "no", "yes", "no"]
        for q in yes_nos:
            words = q["question"].split()  # is the object at b3 red ?
            assert (at[words[4]].colour == words[5]) == (q["answer"] == "yes") and words[5] in cfg.colours
        assert len(rehearsal_questions(s, cfg, lookups=0, colour_yes_no=3)) == 3
        assert all(q in lookups for q in rehearsal_questions(s, cfg, lookups=2, colour_yes_no=0))
    data = VLMDataset(WorldSamples.from_scenes(cfg, scenes[:4]), ("rehearse",), rehearsal=(2, 2))
    assert len(data) == 16 and [data.category(i) for i in range(4)] == ["lookup", "lookup", "colour", "colour"]

def test_load_world_returns_a_dataset(tmp_path):
    cfg = world_config()
    path = build_world(tmp_path / "w", cfg, 5, seed=0)
    ds = load_world(path)
    assert len(ds) == 5
    assert set(ds.column_names) == {"id", "image", "scene", "description", "caption", "yes_no", "open"}
    row = ds[0]
    assert row["image"].size == (cfg.image_size, cfg.image_size)
    scene = json.loads(row["scene"])
    assert parse_description(row["description"]).count == len(scene["objects"])
    assert len(row["yes_no"]) == 12


def test_world_config_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="image_size 16 is too small for grid"):
        WorldConfig(image_size=16, grid=(4, 4))
    with pytest.raises(ValueError, match="max_objects 20 exceeds the 16 cells"):
        WorldConfig(max_objects=20)
    with pytest.raises(ValueError, match="min_objects"):
        WorldConfig(min_objects=0)
    with pytest.raises(ValueError, match="n_objects 13 out of range"):
        generate_scenes(world_config(), 1, seed=0, n_objects=13)
    with pytest.raises(ValueError, match="unknown difficulty"):
        world_config("impossible")
    with pytest.raises(ValueError, match="colours: unknown values"):
        WorldConfig(colours=("red", "mauve"))


def test_bad_world_dirs_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_world(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="world.json is missing"):
        read_world(tmp_path / "empty")
    path = build_world(tmp_path / "w", world_config(), 3, seed=0)
    (path / "scenes.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no scenes"):
        read_world(path)
    path = build_world(tmp_path / "w", world_config(), 3, seed=0, overwrite=True)
    with open(path / "scenes.jsonl", "a") as f:
        f.write("{not json\n")
    with pytest.raises(ValueError, match=r"scenes.jsonl:4: not valid JSON"):
        read_world(path)
    path = build_world(tmp_path / "w", world_config(), 3, seed=0, overwrite=True)
    next((path / "images").iterdir()).unlink()
    with pytest.raises(FileNotFoundError, match="is missing"):
        read_world(path)
    with pytest.raises(FileExistsError):
        build_world(path, world_config(), 3, seed=0)
