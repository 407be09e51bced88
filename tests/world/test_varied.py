"""The diffusion regime's data: varied descriptions (many right answers per scene), deterministic by seed, read back
by the varied parser on hand-made cases."""

import numpy as np
import pytest

from keepsight.world import generate_scenes, world_config
from keepsight.world.chair import chair
from keepsight.world.grammar import parse_description
from keepsight.world.tasks import VLMDataset, WorldSamples
from keepsight.world.texts import scene_vocabulary, varied_description


def test_varied_descriptions_are_deterministic_varied_and_in_the_vocabulary():
    cfg = world_config()
    scenes = generate_scenes(cfg, 40, seed=2)
    a = [varied_description(s, np.random.default_rng(7)) for s in scenes]
    b = [varied_description(s, np.random.default_rng(7)) for s in scenes]
    assert a == b
    per_scene = {varied_description(scenes[0], np.random.default_rng(k)) for k in range(20)}
    assert len(per_scene) >= 15  # many right answers for one scene
    vocab = set(scene_vocabulary())
    assert all(set(t.split()) <= vocab for t in a)  # the shared tokenizer covers them
    assert chair(a, scenes, varied=True)["object_recall"] == 1.0  # every object named, whatever the phrasing


def test_varied_parser_on_hand_made_cases():
    text = ("the image is a snow scene . three objects . a large red circle at b3 . at a1 there is a blue star . "
            "c2 : a small green ring . at d4 a pink cross .")
    p = parse_description(text, varied=True)
    assert p.scene == "snow" and p.count == 3
    assert [(m.size, m.colour, m.shape, m.row, m.col) for m in p.objects] == [
        ("large", "red", "circle", 1, 2), (None, "blue", "star", 0, 0), ("small", "green", "ring", 2, 1),
        (None, "pink", "cross", 3, 3)]
    # the canonical parser is unchanged: it reads only "at <cell> a <size> <colour> <shape>"
    assert len(parse_description(text).objects) == 0
    assert len(parse_description("at b3 a small red circle .").objects) == 1


def test_unstated_sizes_are_not_errors_but_not_exact():
    cfg = world_config()
    scene = generate_scenes(cfg, 1, seed=5, n_objects=1)[0]
    o = scene.objects[0]
    cell = "abcdefghij"[o.row] + str(o.col + 1)
    r = chair([f"a {o.colour} {o.shape} at {cell} ."], [scene], varied=True)
    assert r["attribute_error_rate"] == 0.0 and r["object_recall"] == 1.0 and r["exact_recall"] == 0.0


def test_the_varied_task_in_the_dataset_is_seeded():
    cfg = world_config()
    samples = WorldSamples.from_scenes(cfg, generate_scenes(cfg, 5, seed=1))
    one, two = VLMDataset(samples, ("describe_varied",), seed=3), VLMDataset(samples, ("describe_varied",), seed=3)
    assert [one[i].answer for i in range(5)] == [two[i].answer for i in range(5)]
    assert [one[i].answer for i in range(5)] != [VLMDataset(samples, ("describe_varied",), seed=4)[i].answer
                                                 for i in range(5)]
    assert {one.category(i) for i in range(5)} == {"describe_varied"}


def test_varied_repeats_sets_the_share_of_varied_descriptions():
    """``varied_repeats``: each scene gets that many varied descriptions, each drawn anew, beside
    ``describe_repeats`` copies of the fixed one (by default as many of each)."""
    cfg = world_config()
    samples = WorldSamples.from_scenes(cfg, generate_scenes(cfg, 4, seed=1))
    mix = ("describe", "describe_varied")
    same = VLMDataset(samples, mix, seed=3, describe_repeats=2)
    assert [same.category(i) for i in range(len(same))].count("describe_varied") == 8 and len(same) == 16
    more = VLMDataset(samples, mix, seed=3, describe_repeats=2, varied_repeats=3)
    cats = [more.category(i) for i in range(len(more))]
    assert cats.count("describe") == 8 and cats.count("describe_varied") == 12
    first = [more[i].answer for i in range(len(more)) if more.items[i][0] == 0 and cats[i] == "describe_varied"]
    assert len(set(first)) == 3  # drawn anew, not copies
    with pytest.raises(ValueError, match="varied_repeats must be >= 1"):
        VLMDataset(samples, mix, varied_repeats=0)


def test_phrased_descriptions_keep_the_raster_order_and_vary_only_the_words():
    """``describe_phrased``: the varied phrasings with the objects in ``description``'s raster order, so what each
    place in the text says is fixed by the image and only the words around it (and their count) vary."""
    cfg = world_config()
    scenes = generate_scenes(cfg, 30, seed=2)
    texts = [varied_description(s, np.random.default_rng(7), shuffle=False) for s in scenes]
    for s, t in zip(scenes, texts):
        parsed = parse_description(t, varied=True)
        assert [(m.row, m.col, m.colour, m.shape) for m in parsed.objects] == [
            (o.row, o.col, o.colour, o.shape) for o in s.objects]  # every object, in raster order
    per_scene = {varied_description(scenes[0], np.random.default_rng(k), shuffle=False) for k in range(20)}
    assert len(per_scene) >= 10 and len({len(t.split()) for t in per_scene}) >= 3  # words and lengths vary
    shuffled = [varied_description(s, np.random.default_rng(7)) for s in scenes]
    assert any(parse_description(t, varied=True).objects != parse_description(u, varied=True).objects
               for t, u in zip(texts, shuffled))
    data = VLMDataset(WorldSamples.from_scenes(cfg, scenes[:4]), ("describe_phrased",), seed=3, varied_repeats=2)
    assert len(data) == 8 and {data.category(i) for i in range(8)} == {"describe_phrased"}
