import pytest
import torch
from safetensors.torch import load_file

from keepsight.pvm import PVMConfig
from keepsight.pvm.readings import BranchConfig
from keepsight.train.pvm_sft import PVMTrainConfig, train_pvm_sft
from keepsight.world import generate_scenes, world_config
from keepsight.world.models import build_model
from keepsight.world.tasks import WorldSamples, instruct_data

PVM_CONFIGS = {"released": PVMConfig, "branch": BranchConfig}  # each block's settings


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, processor):
    d = tmp_path_factory.mktemp("base")
    model = build_model("tiny-llava", processor.tokenizer)
    model.save_pretrained(d)
    processor.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def samples():
    cfg = world_config()
    return WorldSamples.from_scenes(cfg, generate_scenes(cfg, 12, seed=0))


@pytest.mark.parametrize("variant", ["released", "branch"])
def test_sft_trains_only_the_adapter_and_moves_the_gate(variant, base_dir, samples, processor, tmp_path):
    from keepsight.pvm import build_block

    cfg = PVMTrainConfig(steps=8, lr=1e-2, gate_lr=5e-2, batch_size=4, save_every=4)
    summary = train_pvm_sft(base_dir, instruct_data(samples), tmp_path / "a",
                            PVM_CONFIGS[variant](layers=[1, 2]), cfg, progress=False)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [".keepsight", "pvm.safetensors", "pvm_config.json",
                                                                    "pvm_train.json"]
    weights = load_file(str(tmp_path / "a" / "pvm.safetensors"))
    block = build_block(build_model("tiny-llava", processor.tokenizer).config.text_config, PVM_CONFIGS[variant]())
    assert set(weights) == {f"pvm.{i}.{k}" for i in (1, 2) for k, _ in block.named_parameters()}
    if variant == "branch":
        assert {k for k, _ in block.named_parameters()} == {"down.weight", "up.weight", "gate"}
    assert all(v["gate_mean"] == 0 for v in summary["before"].values())
    assert all(v["relative_norm"] == 0 for v in summary["before"].values())  # identity at init
    assert all(abs(v["gate_mean"]) > 1e-3 and v["relative_norm"] > 0 for v in summary["after"].values())
    # the base model directory was not touched and the adapter alone carries the change
    from transformers import LlavaForConditionalGeneration

    base = build_model("tiny-llava", processor.tokenizer)  # the same seeded init the fixture saved
    reloaded = LlavaForConditionalGeneration.from_pretrained(base_dir)
    for (n, p), (_, q) in zip(base.named_parameters(), reloaded.named_parameters()):
        assert torch.equal(p, q), n


def test_sft_resume_continues_the_same_run(base_dir, samples, tmp_path):
    cfg = PVMTrainConfig(steps=6, lr=1e-2, gate_lr=5e-2, batch_size=4, save_every=3)
    pvm = PVMConfig(layers=[2])
    data = instruct_data(samples)
    train_pvm_sft(base_dir, data, tmp_path / "full", pvm, cfg, progress=False)
    assert train_pvm_sft(base_dir, data, tmp_path / "split", pvm, cfg, stop_after=3, progress=False) is None
    train_pvm_sft(base_dir, data, tmp_path / "split", pvm, cfg, progress=False)
    a = load_file(str(tmp_path / "full" / "pvm.safetensors"))
    b = load_file(str(tmp_path / "split" / "pvm.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_sft_config_errors():
    with pytest.raises(ValueError, match="gate_lr must be > 0"):
        PVMTrainConfig(gate_lr=0)


# ----------------------------------------------------------------------------- stage 2: GRPO


def _varied_reward(completions, **_):
    """Stands in for the world rewards on an untrained model (whose completions all score 0, so GRPO's
    advantages would vanish): a deterministic, completion-dependent reward in [0, 1)."""
    import zlib

    from keepsight.world.rewards import completion_text

    return [zlib.crc32(completion_text(c).encode()) % 1000 / 1000 for c in completions]


@pytest.fixture(scope="module")
def stage1_dir(base_dir, tmp_path_factory):
    from keepsight.pvm import attach_pvm, save_pvm
    from tiny_checkpoints import load_vlm

    d = tmp_path_factory.mktemp("stage1")
    model, _ = load_vlm(base_dir)
    attach_pvm(model, PVMConfig(layers=[1, 3]))
    with torch.no_grad():
        for name, p in model.pvm.named_parameters():
            if name.endswith(("gate", "gate_alpha")):
                p.fill_(0.1)  # a stage-1 adapter that contributes
    save_pvm(model, d)
    return d


def test_grpo_reference_carries_stage1_pvm_and_only_pvm_trains(base_dir, stage1_dir, samples, monkeypatch,
                                                                  tmp_path):
    import keepsight.train.pvm_grpo as g
    from keepsight.world import rewards
    from keepsight.world.grpo import world_grpo_data
    from tiny_checkpoints import load_vlm

    monkeypatch.setattr(rewards, "answer_reward", _varied_reward)
    cfg = g.GRPOTrainConfig(steps=2, lr=1e-2, gate_lr=1e-1, num_generations=2, prompts_per_step=2,
                            max_completion_length=6, save_every=100)
    data = world_grpo_data(samples, ["describe", "open"])
    trainer = g.build_grpo_trainer(base_dir, stage1_dir, data, tmp_path / "g", cfg, progress=False)
    stage1 = load_file(str(stage1_dir / "pvm.safetensors"))
    ref = trainer.accelerator.unwrap_model(trainer.ref_model)
    assert ref._keepsight_pvm is not None
    for k, v in stage1.items():
        assert torch.equal(dict(ref.named_parameters())[k], v), k
    trainer.train()
    base, _ = load_vlm(base_dir)
    policy = dict(trainer.model.named_parameters())
    for n, p in base.named_parameters():
        assert torch.equal(policy[n], p), f"backbone parameter {n} changed"
    moved = [k for k, v in stage1.items() if not torch.equal(policy[k].detach(), v)]
    assert moved, "no PVM parameter moved"
    for k, v in stage1.items():  # the reference stays at stage 1
        assert torch.equal(dict(ref.named_parameters())[k], v), k


def test_grpo_writes_the_adapter_and_resumes(base_dir, stage1_dir, samples, monkeypatch, tmp_path):
    import keepsight.train.pvm_grpo as g
    from keepsight.world import rewards
    from keepsight.world.grpo import world_grpo_data

    monkeypatch.setattr(rewards, "answer_reward", _varied_reward)
    cfg = g.GRPOTrainConfig(steps=2, num_generations=2, prompts_per_step=2, max_completion_length=6, save_every=1,
                            beta=0.0)
    data = world_grpo_data(samples)
    assert g.train_pvm_grpo(base_dir, stage1_dir, data, tmp_path / "g", cfg, stop_after=1,
                            progress=False) is None
    assert (tmp_path / "g" / "checkpoints" / "checkpoint-1").is_dir()
    summary = g.train_pvm_grpo(base_dir, stage1_dir, data, tmp_path / "g", cfg, progress=False)
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == [".keepsight", "pvm.safetensors", "pvm_config.json",
                                                                    "pvm_grpo.json"]
    assert summary["rewards"] and summary["init"] == str(stage1_dir)
    assert set(summary["after"]) == {"1", "3"}


def test_grpo_released_preset_trains_the_language_model_and_writes_the_released_layout(
        base_dir, stage1_dir, samples, monkeypatch, tmp_path):
    """The released stage 2: the language model and PVM train (the tower and projector do not); the output is a
    whole checkpoint in the released layout that the loader reads back with its blocks, resumed exactly."""
    import keepsight.train.pvm_grpo as g
    from keepsight.models import load_checkpoint
    from keepsight.world import rewards
    from keepsight.world.grpo import world_grpo_data
    from tiny_checkpoints import load_vlm

    monkeypatch.setattr(rewards, "answer_reward", _varied_reward)
    cfg = g.GRPOTrainConfig.released(steps=2, num_generations=2, prompts_per_step=2, max_completion_length=6,
                                     save_every=1, lr=1e-3, gate_lr=1e-3)
    assert (cfg.trainable, cfg.beta, cfg.loss_type, cfg.schedule, cfg.warmup_ratio) == ("llm+pvm", 0.0, "dapo",
                                                                                        "constant", 0.0)
    data = world_grpo_data(samples)
    assert g.train_pvm_grpo(base_dir, stage1_dir, data, tmp_path / "g", cfg, stop_after=1, progress=False) is None
    g.train_pvm_grpo(base_dir, stage1_dir, data, tmp_path / "g", cfg, progress=False)
    model, _ = load_checkpoint(tmp_path / "g", dtype=None, device="cpu")
    assert model._keepsight_pvm.config.variant == "released" and (tmp_path / "g" / "pvm_grpo.json").is_file()
    base, _ = load_vlm(base_dir)
    trained = dict(model.named_parameters())
    changed = {n for n, p in base.named_parameters() if not torch.equal(trained[n], p)}
    assert any("language_model" in n for n in changed), "the language model did not train"
    assert not any("vision_tower" in n or "multi_modal_projector" in n for n in changed), sorted(changed)[:3]
    uninterrupted = g.train_pvm_grpo(base_dir, stage1_dir, data, tmp_path / "h", cfg, progress=False)
    again, _ = load_checkpoint(tmp_path / "h", dtype=None, device="cpu")
    for n, p in again.named_parameters():  # the resumed run ends where the uninterrupted one does
        assert torch.equal(p, trained[n]), n
    assert uninterrupted["last_reward"] is not None


def test_grpo_dataset_columns(samples):
    from keepsight.world.grpo import grpo_dataset

    ds = grpo_dataset(samples, ["describe", "open", "yes_no", "cell"])
    assert len(ds) == 4 * len(samples)
    assert set(ds.column_names) == {"prompt", "image", "kind", "answer", "scene"}
    assert ds[0]["prompt"][0]["content"][0]["type"] == "image"
    assert {"describe", "yes_no", "cell"} <= set(ds["kind"])


def test_grpo_config_errors():
    from keepsight.train.pvm_grpo import GRPOTrainConfig
    from keepsight.world.grpo import world_grpo_data

    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        GRPOTrainConfig(num_generations=1)
    with pytest.raises(ValueError, match="unknown"):
        world_grpo_data(None, tasks=["poetry"])


# ----------------------------------------------------------------------------- LoRA control


def test_lora_control_matches_pvm_size_and_merges(base_dir, samples, processor, tmp_path):
    from keepsight.train.lora_control import (
        LoRATrainConfig,
        apply_lora,
        pvm_parameter_count,
        train_lora_control,
    )
    from tiny_checkpoints import load_vlm

    pvm = PVMConfig(layers=[1, 2])
    cfg = LoRATrainConfig(steps=3, batch_size=4)
    summary = train_lora_control(base_dir, instruct_data(samples), tmp_path / "l", pvm, cfg, progress=False)
    base, _ = load_vlm(base_dir)
    n_pvm = pvm_parameter_count(base, pvm)
    assert summary["pvm_parameters"] == n_pvm
    per_rank = summary["lora_parameters"] // summary["rank"]
    assert abs(summary["lora_parameters"] - n_pvm) <= per_rank / 2  # the nearest rank
    assert (tmp_path / "l" / "adapter_model.safetensors").is_file() and not (tmp_path / "l" / "checkpoints").exists()
    merged = apply_lora(load_vlm(base_dir)[0], tmp_path / "l")
    changed = {n for (n, p), (_, q) in zip(base.named_parameters(), merged.named_parameters()) if not torch.equal(p, q)}
    assert changed and all(".layers.1." in n or ".layers.2." in n for n in changed)
    assert [n for n, _ in base.named_parameters()] == [n for n, _ in merged.named_parameters()]
    with pytest.raises(FileNotFoundError, match="adapter_config.json is missing"):
        apply_lora(base, tmp_path)
