import pytest
import torch
from safetensors.torch import load_file

from keepsight.pvm import PVMConfig
from keepsight.train.pvm_sft import PVMTrainConfig, train_pvm_sft
from keepsight.world import generate, world_config
from keepsight.world.data import WorldSamples
from keepsight.world.models import build_model


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
    return WorldSamples.from_scenes(cfg, generate(cfg, 12, seed=0))


def test_sft_trains_only_the_adapter_and_moves_the_gate(base_dir, samples, processor, tmp_path):
    cfg = PVMTrainConfig(steps=8, lr=1e-2, gate_lr=5e-2, batch_size=4, save_every=4)
    summary = train_pvm_sft(base_dir, samples, tmp_path / "a", PVMConfig(layers=[1, 2]), cfg, progress=False)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["pvm.safetensors", "pvm_config.json",
                                                                    "pvm_train.json"]
    weights = load_file(str(tmp_path / "a" / "pvm.safetensors"))
    assert set(weights) == {f"pvm.{i}.{k}" for i in (1, 2) for k in ("down.weight", "up.weight", "gate")}
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
    train_pvm_sft(base_dir, samples, tmp_path / "full", pvm, cfg, progress=False)
    assert train_pvm_sft(base_dir, samples, tmp_path / "split", pvm, cfg, stop_after=3, progress=False) is None
    train_pvm_sft(base_dir, samples, tmp_path / "split", pvm, cfg, progress=False)
    a = load_file(str(tmp_path / "full" / "pvm.safetensors"))
    b = load_file(str(tmp_path / "split" / "pvm.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_sft_config_errors():
    with pytest.raises(ValueError, match="gate_lr must be > 0"):
        PVMTrainConfig(gate_lr=0)
