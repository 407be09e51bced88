import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from keepsight.data import IGNORE_INDEX
from keepsight.train.diffusion import (
    DiffusionCollator,
    DiffusionTrainConfig,
    MaskedDiffusionObjective,
    train_diffusion,
)
from keepsight.world import generate_scenes, world_config
from keepsight.world.tasks import VLMDataset, WorldSamples


@pytest.fixture(scope="module")
def samples():
    cfg = world_config()
    return WorldSamples.from_scenes(cfg, generate_scenes(cfg, 6, seed=0))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """The parts of a world base the diffusion VLM needs: train_config.json and a finished vision stage."""
    from transformers import CLIPVisionModel

    from keepsight.world.base import DONE_FILE, TrainConfig
    from keepsight.world.models import get_preset, vision_config

    d = tmp_path_factory.mktemp("base")
    (d / "train_config.json").write_text(json.dumps(TrainConfig().to_dict()))
    CLIPVisionModel(vision_config(get_preset("tiny-llava"))).save_pretrained(d / "stages" / "vision")
    (d / "stages" / "vision" / DONE_FILE).write_text("{}")
    return d


def test_collator_fills_the_window_with_eos_and_labels_only_answers(processor, samples):
    data = VLMDataset(samples, ("describe", "yes_no"), 0)
    batch = DiffusionCollator(processor, answer_length=12)([data[0], data[1]])
    tok = processor.tokenizer
    lab, ids, am = batch["labels"], batch["input_ids"], batch["attention_mask"]
    for i in range(2):
        ans = (lab[i] != IGNORE_INDEX).nonzero().flatten()
        assert len(ans) == 12 and ans.max() == am[i].sum() - 1  # the window ends each row
        assert torch.equal(ids[i, ans], lab[i, ans])
        prompt = ids[i, : ans.min()]
        assert (prompt == tok.image_token_id).sum() == 17  # the image is in the prompt, never a label
    yes_no = lab[1][lab[1] != IGNORE_INDEX]
    assert (yes_no[1:] == tok.eos_token_id).all()  # "yes" / "no", then eos to the end of the window


def test_objective_is_the_weighted_masked_cross_entropy(processor, samples):
    from keepsight.world.models import build_llada_v

    model = build_llada_v(processor)
    obj = MaskedDiffusionObjective(model, processor.tokenizer.mask_token_id, eps=1e-3)
    data = VLMDataset(samples, ("describe",), 0)
    batch = DiffusionCollator(processor, 16)([data[i] for i in range(3)])
    torch.manual_seed(5)
    loss = obj(**batch)["loss"]
    # the same draws by hand: t ~ U(eps, 1] per row, answer slots masked with probability t, CE / t
    torch.manual_seed(5)
    ids, lab = batch["input_ids"], batch["labels"]
    ans = lab != IGNORE_INDEX
    t = 1e-3 + (1 - 1e-3) * torch.rand(ids.shape[0])
    masked = ans & (torch.rand(ids.shape) < t[:, None])
    assert masked.any() and not (masked & ~ans).any()  # the prompt is never masked
    noisy = ids.masked_fill(masked, processor.tokenizer.mask_token_id)
    logits = model(input_ids=noisy, attention_mask=batch["attention_mask"], pixel_values=batch["pixel_values"]).logits
    total = 0.0
    for b, j in masked.nonzero().tolist():
        total += torch.nn.functional.cross_entropy(logits[b, j][None].float(), ids[b, j][None]) / t[b]
    torch.testing.assert_close(loss, total / ans.sum(), rtol=1e-5, atol=1e-6)


def test_train_diffusion_writes_a_loadable_model_and_resumes(base_dir, samples, tmp_path):
    import keepsight.diffusion  # noqa: F401
    from keepsight.world.base import llada_v_init
    from tiny_checkpoints import load_vlm

    cfg = DiffusionTrainConfig(steps=2, batch_size=4, answer_length=16, save_every=1)
    data = VLMDataset(samples, ("describe",), cfg.seed)
    init = lambda: llada_v_init(base_dir, cfg.seed)  # noqa: E731
    assert train_diffusion(init, data, tmp_path / "m", cfg, stop_after=1, progress=False) is None
    summary = train_diffusion(init, data, tmp_path / "m", cfg, progress=False)
    assert summary["last_loss"] is not None and not (tmp_path / "m" / "checkpoints").exists()
    model, _ = load_vlm(tmp_path / "m")
    assert type(model.model.language_model).__name__ == "LladaModel"
    with pytest.raises(FileNotFoundError, match="no finished vision stage"):
        train_diffusion(lambda: llada_v_init(tmp_path, cfg.seed), data, tmp_path / "x", cfg, progress=False)
    with pytest.raises(ValueError, match="eps must be in"):
        DiffusionTrainConfig(eps=0.0)


def test_curriculum_fine_tunes_the_first_stage_model_on_the_second_tasks(base_dir, samples):
    """DiffusionExperiment.finetune: the first stage's model (cached by its own key) is trained further on
    ``finetune_tasks``; the experiment evaluates the fine-tuned model and reports both stages."""
    from safetensors.torch import load_file

    from keepsight.experiments.arm import ExperimentContext
    from keepsight.experiments.diffusion import DiffusionExperiment, run_diffusion_experiment

    small = dict(batch_size=2, save_every=1000, answer_length=16)
    exp = DiffusionExperiment(train=DiffusionTrainConfig(steps=2, **small), tasks=("describe",),
                              finetune=DiffusionTrainConfig(steps=2, seed=1, **small), n_scenes=2, n_objects=2,
                              steps_grid=(4,), sweep_steps=4, sweeps={}, samplers={"plain": {}}, sampler_block=16,
                              attention_betas=())
    assert exp.varied  # scored with the varied phrasings: the second stage's texts
    logs = []
    ctx = ExperimentContext(base_dir, None, samples.config, None, None, lambda: samples, logs.append)
    res = run_diffusion_experiment(exp, ctx)
    tuned = base_dir.parent / f"{base_dir.name}-diffusion"
    dirs = sorted(p for p in tuned.iterdir() if p.is_dir())
    assert len(dirs) == 2 and res["model_dir"] in map(str, dirs)
    first = next(p for p in dirs if str(p) != res["model_dir"])
    summary = json.loads((tuned / res["model_dir"].split("/")[-1] / "diffusion_train.json").read_text())
    assert summary["base"] == str(first)  # trained from the first stage's model, not from the base
    assert res["training"]["first_stage"]["train"]["steps"] == 2 and res["training"]["train"]["seed"] == 1
    a, b = load_file(first / "model.safetensors"), load_file(tuned / res["model_dir"].split("/")[-1] / "model.safetensors")
    lm = [k for k in a if "language_model" in k]
    assert any(not torch.equal(a[k], b[k]) for k in lm)  # the second stage trained the language model
    assert all(torch.equal(a[k], b[k]) for k in a if "vision_tower" in k)  # and left the vision tower
    assert any("fine-tuned on ['describe_varied']" in m for m in logs)


def test_diffusion_experiment_rejects_a_curriculum_with_another_window_and_a_bad_block():
    from keepsight.experiments.diffusion import DiffusionExperiment

    with pytest.raises(ValueError, match="finetune.answer_length"):
        DiffusionExperiment(finetune=DiffusionTrainConfig(answer_length=32))
    with pytest.raises(ValueError, match="block_length 24 must divide answer_length 64"):
        DiffusionExperiment(block_length=24)
    assert DiffusionExperiment(block_length=16).block_length == 16


def test_training_seeds_give_each_seed_its_model_intervals_over_them_and_mps_effect(base_dir, samples):
    """DiffusionExperiment.seeds: one diffusion VLM per training seed (the first seed's trained exactly as with no
    seeds), each seed's grid and sweeps, their means and paired differences over the seeds, and MPS's effect at each
    of ``effect_lams`` (lam 0 moves nothing; the move grows linearly in lam: the gate does not depend on it)."""
    from keepsight.experiments.arm import ExperimentContext
    from keepsight.experiments.diffusion import DiffusionExperiment, run_diffusion_experiment

    small = dict(batch_size=2, save_every=1000, answer_length=16)
    exp = DiffusionExperiment(train=DiffusionTrainConfig(steps=2, **small), tasks=("describe",), n_scenes=2,
                              n_objects=2, steps_grid=(4, 16), sweep_steps=4,
                              sweeps={"lam": [0.3], "projection_lam": [0.0], "frequency_beta": [0.0]},
                              samplers={"plain": {}}, sampler_block=16, attention_betas=(), seeds=(0, 3),
                              effect_lams=(0.0, 0.1, 0.2))
    ctx = ExperimentContext(base_dir, None, samples.config, None, None, lambda: samples, print)
    res = run_diffusion_experiment(exp, ctx)
    first, other = res["seeds"]
    assert (first["seed"], other["seed"]) == (0, 3) and first["model_dir"] == res["model_dir"] != other["model_dir"]
    assert other["training"]["train"]["seed"] == 3 and "fast" not in other and res["fast"]
    ov = res["over_seeds"]
    assert ov["n"] == 2 and len(ov["grid"]) == 2 * 6 and len(ov["vs_none"]) == 2 * 5
    cell = next(r for r in ov["grid"] if (r["steps"], r["method"]) == (4, "mps"))
    assert cell["object_recall"]["values"] == [next(g["object_recall"] for g in r["grid"]
                                               if (g["steps"], g["method"]) == (4, "mps")) for r in res["seeds"]]
    diff = next(r for r in ov["vs_none"] if (r["steps"], r["method"]) == (16, "mrs"))
    none = [next(g for g in r["grid"] if (g["steps"], g["method"]) == (16, "none")) for r in res["seeds"]]
    mrs = [next(g for g in r["grid"] if (g["steps"], g["method"]) == (16, "mrs")) for r in res["seeds"]]
    assert diff["distinct_2"]["values"] == pytest.approx([m["distinct_2"] - n["distinct_2"] for m, n in zip(mrs, none)])
    assert ov["sweeps"][0]["param"] == "lam" and ov["sweeps"][0]["vs_none"]["chair_i"]["n"] == 2
    for run in res["seeds"]:
        # our earlier readings (keepsight.diffusion.readings) at zero strength sample what no method samples
        plain = next(g for g in run["grid"] if (g["steps"], g["method"]) == (4, "none"))
        for sweep in run["sweeps"][1:]:
            assert {k: sweep[k] for k in ("object_recall", "repeats", "distinct_2")} == \
                {k: plain[k] for k in ("object_recall", "repeats", "distinct_2")}, sweep["param"]
        still, a, b = run["mps_effect"]["by_lam"]
        assert still["move"] == 0.0 and still["argmax_changed"] == 0.0 and still["top10_before"] == still["top10_after"]
        assert b["move"] == pytest.approx(2 * a["move"], rel=1e-4, abs=1e-9)
        assert (a["move"] > 0) == (run["mps_effect"]["gate"] > 0)  # it moves wherever its gate opens
        assert len(run["mps_effect"]["state_norms"]) == 4  # layers 1 .. L-1 and the final norm's output (L = 4)
    with pytest.raises(ValueError, match="seeds must be distinct"):
        DiffusionExperiment(seeds=(1, 1))


def test_a_diffusion_vlm_can_start_from_an_autoregressive_models_language_model(base_dir, processor, tmp_path):
    """``llada_v_init(language_model_from=...)``: the AR model's language model, LM head and projector, weight for
    weight (Qwen3's q / k norms left out), the base's tower kept; another depth is refused by name."""
    from keepsight.world.base import llada_v_init
    from keepsight.world.models import build_model

    torch.manual_seed(1)
    ar = build_model("tiny-llava", processor.tokenizer, seed=1)
    ar.save_pretrained(tmp_path / "ar")
    fresh, _ = llada_v_init(base_dir, 0)
    model, _ = llada_v_init(base_dir, 0, language_model_from=tmp_path / "ar")
    theirs, mine, before = ar.state_dict(), model.state_dict(), fresh.state_dict()
    for k, v in mine.items():
        if "vision_tower" in k:
            assert torch.equal(v, before[k]), k  # the base's tower, not the AR model's
        else:
            assert torch.equal(v, theirs[k]), k
    assert any("q_norm" in k for k in theirs) and not any("q_norm" in k for k in mine)
    with pytest.raises(ValueError, match="does not fit this diffusion VLM: missing .*model.language_model.layers.4"):
        llada_v_init(base_dir, 0, text_layers=6, language_model_from=tmp_path / "ar")
    with pytest.raises(FileNotFoundError, match="language_model_from=.*nowhere: no model directory"):
        llada_v_init(base_dir, 0, language_model_from=tmp_path / "nowhere")


def test_the_diffusion_experiment_can_start_its_vlm_from_the_base_language_model(base_dir, processor, samples,
                                                                                 tmp_path):
    """``DiffusionExperiment(language_model_from="base")``: the VLM starts from the base model's language model (its
    own cache key, the source recorded in the training request); anything but None / "base" is refused."""
    import shutil

    from keepsight.experiments.arm import ExperimentContext
    from keepsight.experiments.diffusion import DiffusionExperiment, _train_model
    from keepsight.world.models import build_model

    base = tmp_path / "base"
    shutil.copytree(base_dir, base)
    build_model("tiny-llava", processor.tokenizer, seed=1).save_pretrained(base)  # the base model itself
    processor.save_pretrained(base)
    ctx = ExperimentContext(base, None, samples.config, None, None, lambda: samples, print)
    train = DiffusionTrainConfig(steps=1, batch_size=2, save_every=1000, answer_length=16)
    fresh_dir, _ = _train_model(DiffusionExperiment(train=train, tasks=("describe",)), ctx, 0)
    ar_dir, _ = _train_model(DiffusionExperiment(train=train, tasks=("describe",), language_model_from="base"), ctx, 0)
    assert ar_dir != fresh_dir and ar_dir.parent == fresh_dir.parent
    request = json.loads((ar_dir / "diffusion_train.json").read_text())["request"]
    assert "language_model_from" in request and "language_model_from" not in json.loads(
        (fresh_dir / "diffusion_train.json").read_text())["request"]
    with pytest.raises(ValueError, match="language_model_from must be None .* or 'base', got 'mine'"):
        DiffusionExperiment(language_model_from="mine")
    # base_finetune: the base fine-tuned on its descriptions first (one model for every seed), the VLM started from it
    from keepsight.train.finetune import FinetuneConfig

    tuned = DiffusionExperiment(train=train, tasks=("describe",), language_model_from="base",
                                base_finetune=FinetuneConfig(steps=1, batch_size=2, save_every=1000))
    ft_dir, _ = _train_model(tuned, ctx, 0)
    assert ft_dir not in (ar_dir, fresh_dir)
    request = json.loads((ft_dir / "diffusion_train.json").read_text())["request"]
    source = Path(request["language_model_from"]["path"])  # the fine-tuned base, fingerprinted
    assert source.name.startswith("base-describe-") and (source / "config.json").is_file()
    assert _train_model(replace(tuned, seeds=(0, 1)), ctx, 1)[0] != ft_dir  # another seed, the same fine-tuned base
    assert len(list(ft_dir.parent.glob("base-describe-*"))) == 1
    with pytest.raises(ValueError, match="base_finetune .* needs language_model_from='base'"):
        DiffusionExperiment(base_finetune=FinetuneConfig())
