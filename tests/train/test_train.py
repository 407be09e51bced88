import json

import pytest
import torch

from keepsight.data import IGNORE_INDEX, VLMCollator
from keepsight.train.trainer import last_complete_checkpoint
from keepsight.world import generate_scenes, world_config
from keepsight.world.base import STAGES, StageConfig, TrainConfig, train_base, train_stage
from keepsight.world.tasks import VLMDataset, WorldSamples


def answer_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor, tokenizer) -> torch.Tensor:
    """The world template's labels found by its marker: the ids after the last "assistant :"; IGNORE_INDEX
    elsewhere (an independent check of the collator's prompt-prefix labels)."""
    marker = tokenizer.convert_tokens_to_ids("assistant")
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    for b in range(input_ids.shape[0]):
        pos = (input_ids[b] == marker).nonzero()
        if len(pos) == 0:
            raise ValueError(f"row {b} has no assistant turn; cannot build labels")
        start = int(pos[-1]) + 2  # skip "assistant" and ":"
        labels[b, start:] = input_ids[b, start:]
    labels[attention_mask == 0] = IGNORE_INDEX
    return labels


@pytest.fixture(scope="module")
def samples():
    cfg = world_config()
    return WorldSamples.from_scenes(cfg, generate_scenes(cfg, 48, seed=0))


def tiny_train_config(**kw) -> TrainConfig:
    base = dict(lm=StageConfig(30, 3e-3, 8), vision=StageConfig(6, 2e-3, 8), align=StageConfig(4, 2e-3, 4),
                instruct=StageConfig(30, 2e-3, 4), save_every=10)
    base.update(kw)
    return TrainConfig(**base)


def test_answer_labels_cover_only_the_answer(processor, samples):
    batch = VLMCollator(processor)([VLMDataset(samples, ("yes_no",))[i] for i in range(2)])
    tok = processor.tokenizer
    for ids, labels in zip(batch["input_ids"], batch["labels"]):
        kept = ids[labels != -100]
        assert tok.convert_ids_to_tokens(kept.tolist())[-1] == "<eos>"
        assert tok.decode(kept, skip_special_tokens=True) in ("yes", "no")
        start = int((labels != -100).nonzero()[0])
        assert tok.convert_ids_to_tokens(ids[start - 2 : start].tolist()) == ["assistant", ":"]
    same = answer_labels(batch["input_ids"], batch["attention_mask"], tok)  # the marker-based labels agree
    assert torch.equal(same, batch["labels"])
    with pytest.raises(ValueError, match="no assistant turn"):
        answer_labels(torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.long), tok)


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_lm_stage_lowers_loss_and_resume_continues_the_same_run(samples, tmp_path):
    tc = tiny_train_config()
    # uninterrupted run
    full = train_stage("lm", tmp_path / "a", tc, samples, progress=False)
    assert full["last_loss"] < 0.6 * full["first_loss"]
    # interrupted after step 10 (a checkpoint), then resumed by running the same call again
    assert train_stage("lm", tmp_path / "b", tc, samples, stop_after=10, progress=False) is None
    ck = last_complete_checkpoint(tmp_path / "b" / "stages" / "lm-checkpoints")
    assert ck is not None and ck.endswith("checkpoint-10")
    resumed = train_stage("lm", tmp_path / "b", tc, samples, progress=False)
    assert resumed is not None
    wa, wb = _weights(tmp_path / "a" / "stages" / "lm"), _weights(tmp_path / "b" / "stages" / "lm")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)
    # the finished stage is not trained again, and its checkpoints are cleaned up
    assert train_stage("lm", tmp_path / "b", tc, samples, progress=False)["last_loss"] == resumed["last_loss"]
    assert not (tmp_path / "b" / "stages" / "lm-checkpoints").exists()


def test_incomplete_checkpoint_is_skipped(tmp_path):
    (tmp_path / "checkpoint-10").mkdir()
    (tmp_path / "checkpoint-10" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-20").mkdir()  # interrupted mid-write: no trainer_state.json
    assert last_complete_checkpoint(tmp_path).endswith("checkpoint-10")


def test_staged_build_trains_and_loads(samples, processor, tmp_path):
    from tiny_checkpoints import load_vlm

    tc = tiny_train_config(instruct=StageConfig(100, 3e-3, 8))
    with pytest.raises(RuntimeError, match="needs stage 'lm' first"):
        train_stage("align", tmp_path, tc, samples, progress=False)
    # held-out batch: instruction loss before (after alignment) and after instruction tuning
    summaries = train_base(tmp_path, tc, samples, stages=STAGES[:3], progress=False)
    assert set(summaries) == {"lm", "vision", "align"}
    assert not (tmp_path / "config.json").exists()  # not finalised before instruct
    held = WorldSamples.from_scenes(samples.config, generate_scenes(samples.config, 8, seed=99))
    batch = VLMCollator(processor)([VLMDataset(held)[i] for i in range(16)])
    from transformers import LlavaForConditionalGeneration

    before = LlavaForConditionalGeneration.from_pretrained(tmp_path / "stages" / "align")
    with torch.no_grad():
        loss_before = before(**batch).loss.item()
    train_base(tmp_path, tc, samples, progress=False)
    model, proc = load_vlm(tmp_path)
    with torch.no_grad():
        loss_after = model(**batch).loss.item()
    print("held-out loss", loss_before, loss_after)
    assert loss_after < 0.9 * loss_before
    # the tower stayed frozen in align and instruct: equal to the vision stage's weights
    from transformers import CLIPVisionModel

    tower = CLIPVisionModel.from_pretrained(tmp_path / "stages" / "vision")
    trained = model.model.vision_tower.state_dict()
    assert tower.state_dict().keys() == trained.keys()
    for k, v in tower.state_dict().items():
        assert torch.equal(v, trained[k]), k
    info = json.loads((tmp_path / "stages" / "instruct" / "keepsight_stage.json").read_text())
    assert info["stage"] == "instruct" and info["log_history"]


def test_a_ground_stage_sits_between_align_and_instruct(samples, tmp_path):
    from transformers import LlavaForConditionalGeneration

    plain = tiny_train_config()
    assert plain.stages == ("lm", "vision", "align", "instruct") and plain.requires("instruct") == ("align",)
    with pytest.raises(ValueError, match="no ground stage"):
        train_stage("ground", tmp_path / "plain", plain, samples, progress=False)
    tc = tiny_train_config(ground=StageConfig(4, 1e-3, 4), instruct=StageConfig(2, 1e-3, 4), count_head=True)
    assert tc.stages == STAGES and tc.requires("instruct") == ("ground",)
    assert TrainConfig(**json.loads(json.dumps(tc.to_dict()))) == tc  # train_config.json round trip
    train_base(tmp_path, tc, samples, stages=STAGES[:3], progress=False)
    with pytest.raises(RuntimeError, match="needs stage 'ground' first"):
        train_stage("instruct", tmp_path, tc, samples, progress=False)
    train_base(tmp_path, tc, samples, progress=False)
    assert (tmp_path / "config.json").is_file()
    # ground trains the projector and language model from align's weights, tower frozen
    align, ground = (LlavaForConditionalGeneration.from_pretrained(tmp_path / "stages" / s) for s in ("align", "ground"))
    a, g = align.state_dict(), ground.state_dict()
    assert all(torch.equal(a[k], g[k]) for k in a if "vision_tower" in k)
    assert not torch.equal(a["lm_head.weight"], g["lm_head.weight"])


def test_yes_no_categories_sets_the_instruct_stages_yes_no_share(samples):
    from keepsight.world.tasks import instruct_data

    assert "yes_no_categories" not in tiny_train_config().to_dict()  # the default keeps earlier cache keys
    tc = tiny_train_config(yes_no_categories=6)
    assert TrainConfig(**json.loads(json.dumps(tc.to_dict()))) == tc
    for bad in (0, 7, 2.0, True):
        with pytest.raises(ValueError, match="yes_no_categories"):
            tiny_train_config(yes_no_categories=bad)
    cats = {"existence", "count", "colour", "shape", "position", "scene"}
    for k in (2, 6):
        data = instruct_data(samples, tasks=("yes_no",), yes_no_categories=k)
        assert len(data) == 2 * k * len(samples) and set(data.categories) <= cats
    assert set(instruct_data(samples, tasks=("yes_no",), yes_no_categories=6).categories) == cats
    # the method recipes train on the base's own mix, its yes/no share included
    mix = tiny_train_config(yes_no_categories=6, instruct_tasks=("yes_no",)).instruct_mix(samples, 0)
    assert len(mix) == 12 * len(samples)


def test_rehearsal_sets_the_rehearse_tasks_share_and_keys_only_the_recipes_that_use_it(samples):
    from keepsight.world.base import GROUNDED_RECIPE

    assert "rehearsal" not in tiny_train_config().to_dict()  # a mix without "rehearse" keeps its cache key
    assert GROUNDED_RECIPE.to_dict()["rehearsal"] == [4, 4]
    tc = tiny_train_config(instruct_tasks=("rehearse",), rehearsal=(1, 2))
    assert TrainConfig(**json.loads(json.dumps(tc.to_dict()))) == tc
    assert len(tc.instruct_mix(samples, 0)) == 3 * len(samples)
    for bad in ((0, 0), (1,), (1, -1), (1.0, 2), (True, 2), "44"):
        with pytest.raises(ValueError, match="rehearsal"):
            tiny_train_config(instruct_tasks=("rehearse",), rehearsal=bad)

def test_the_count_head_reads_the_number_of_objects_from_cls(samples):
    from transformers import CLIPVisionModel

    from keepsight.world.base import VisionPretrainer
    from keepsight.world.models import get_preset, preset_processor, vision_config
    from keepsight.world.tasks import VisionCollator, VisionDataset

    torch.manual_seed(0)
    net = VisionPretrainer(CLIPVisionModel(vision_config(get_preset("tiny-llava"))), samples.config, count_head=True)
    data = VisionDataset(samples, count=True)
    assert data[0]["count"] == len(samples.scenes[0].objects) and "count" not in VisionDataset(samples)[0]
    batch = VisionCollator(preset_processor("tiny-llava").image_processor, count=True)([data[i] for i in range(8)])
    out = net(**batch)
    assert out["logits_count"].shape == (8, samples.config.max_objects + 1) and torch.isfinite(out["loss"])
    with torch.no_grad():  # the count's cross-entropy is part of the loss
        net.count_head.bias.add_(torch.nn.functional.one_hot(batch["count"][0], samples.config.max_objects + 1) * 50)
        assert net(**batch)["loss"] != out["loss"]
    with pytest.raises(ValueError, match="needs the count target"):
        net(**{k: v for k, v in batch.items() if k != "count"})


def test_train_config_errors():
    with pytest.raises(ValueError, match="unknown preset"):
        TrainConfig(preset="nope")
    with pytest.raises(ValueError, match="LLaVA-family presets only"):
        TrainConfig(preset="tiny-qwen3vl")
    with pytest.raises(ValueError, match="lm: steps"):
        TrainConfig(lm=StageConfig(0, 1e-3))
