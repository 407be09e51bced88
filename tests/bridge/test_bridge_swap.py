import pytest
import torch

from keepsight.bridge.swap import LlavaBridgeForConditionalGeneration, replace_projector
from keepsight.data import chat_example
from keepsight.world import generate_scenes, world_config
from keepsight.world.models import build_model
from keepsight.world.tasks import WorldSamples
from keepsight.world.texts import DESCRIBE_PROMPT
from tiny_checkpoints import load_vlm


@pytest.fixture(scope="module")
def samples():
    cfg = world_config()
    return WorldSamples.from_scenes(cfg, generate_scenes(cfg, 8, seed=0))


def _inputs(processor, samples, n=2):
    return processor(text=[chat_example(processor, DESCRIBE_PROMPT)] * n, images=samples.images[:n],
                     return_tensors="pt")


@pytest.mark.parametrize("kind", ["lia_mtr", "attention_sdpa", "linear_attention"])
def test_swap_generates_and_reloads_identically(kind, processor, samples, tmp_path):
    model = build_model("tiny-llava", processor.tokenizer)
    keep = {n: p.clone() for n, p in model.named_parameters() if "multi_modal_projector" not in n}
    model = replace_projector(model, kind).eval()
    assert isinstance(model, LlavaBridgeForConditionalGeneration)
    assert model.config.model_type == "keepsight_llava" and model.config.bridge["kind"] == kind
    for n, p in model.named_parameters():  # everything but the projector kept
        if n in keep:
            assert torch.equal(p, keep[n]), n
    enc = _inputs(processor, samples)
    with torch.no_grad():
        logits = model(**enc).logits
        gen = model.generate(**enc, max_new_tokens=6, do_sample=False)
    assert gen.shape[1] == enc["input_ids"].shape[1] + 6
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    again, _ = load_vlm(tmp_path)
    assert type(again) is LlavaBridgeForConditionalGeneration
    with torch.no_grad():
        assert torch.equal(again(**enc).logits, logits)
        assert torch.equal(again.generate(**enc, max_new_tokens=6, do_sample=False), gen)


def test_swap_rejects_other_architectures(processor):
    model = build_model("tiny-qwen3vl", processor.tokenizer)
    with pytest.raises(ValueError, match="supports LLaVA-family models"):
        replace_projector(model, "lia_mtr")
    llava = build_model("tiny-llava", processor.tokenizer)
    with pytest.raises(ValueError, match="unknown bridge kind"):
        replace_projector(llava, "qformer")


def test_pvm_attaches_to_a_bridged_model(processor, samples):
    from keepsight.pvm import PVMConfig, attach_pvm, detach_pvm

    model = replace_projector(build_model("tiny-llava", processor.tokenizer), "lia_mtr").eval()
    enc = _inputs(processor, samples)
    with torch.no_grad():
        ref = model(**enc).logits
        attach_pvm(model, PVMConfig(layers=[1]))
        assert torch.equal(model(**enc).logits, ref)
        detach_pvm(model)


def test_bridge_phases(processor, samples, tmp_path):
    from keepsight.train.bridge import BridgeTrainConfig, train_bridge
    from keepsight.world.tasks import caption_data, instruct_data

    base = build_model("tiny-llava", processor.tokenizer)
    base.save_pretrained(tmp_path / "base")
    processor.save_pretrained(tmp_path / "base")
    p1 = train_bridge(tmp_path / "base", caption_data(samples, 2), tmp_path / "p1",
                      BridgeTrainConfig(phase=1, steps=3, lr=1e-2, batch_size=4, bridge="lia_mtr"), progress=False)
    assert p1["bridge"]["kind"] == "lia_mtr" and p1["bridge_parameters"] > 0
    m1, _ = load_vlm(tmp_path / "p1")
    after = dict(m1.named_parameters())
    for n, p in base.named_parameters():
        if "multi_modal_projector" not in n:
            assert torch.equal(p, after[n]), f"phase 1 changed {n}"
    train_bridge(tmp_path / "p1", instruct_data(samples, 2), tmp_path / "p2",
                 BridgeTrainConfig(phase=2, steps=2, lr=1e-2, batch_size=4), progress=False)
    m2, _ = load_vlm(tmp_path / "p2")
    changed = {n for (n, p), (_, q) in zip(m1.named_parameters(), m2.named_parameters()) if not torch.equal(p, q)}
    assert any("language_model" in n for n in changed) and not any("vision_tower" in n for n in changed)
    with pytest.raises(ValueError, match="has no bridge"):
        train_bridge(tmp_path / "base", instruct_data(samples, 2), tmp_path / "bad", BridgeTrainConfig(phase=2),
                     progress=False)
