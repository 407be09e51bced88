"""Every supported architecture loads from a saved tiny directory through ``load_checkpoint`` (the path
real checkpoints take), in the asked dtype, and each method applies to it."""

import json

import pytest
import torch
from PIL import Image

from keepsight.data import chat_example
from keepsight.models import checkpoint_kind, load_checkpoint, resolve_device, resolve_dtype
from tiny_checkpoints import save_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

PRESETS = {"tiny-llava": "llava", "tiny-qwen3vl": "qwen3_vl", "tiny-qwen25vl": "qwen2_5_vl", "tiny-llada-v": "llada_v"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {name: save_tiny_checkpoint(name, root / name) for name in PRESETS}


def _inputs(processor, n=2):
    imgs = [Image.new("RGB", (64, 64), c) for c in ((220, 30, 30), (30, 220, 30))][:n]
    return processor(text=[chat_example(processor, "describe the scene .")] * n, images=imgs, return_tensors="pt",
                     padding=True)


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_architecture_loads_in_fp32_and_bf16(saved, name):
    path = saved[name]
    assert checkpoint_kind(path) == PRESETS[name]
    model, processor = load_checkpoint(path, dtype="float32", device="cpu")
    assert next(model.parameters()).dtype == torch.float32 and not model.training
    enc = _inputs(processor)
    with torch.no_grad():
        ref = model(**enc).logits
    again, _ = load_checkpoint(path, dtype="fp32", device="auto")  # CUDA when present
    with torch.no_grad():
        assert torch.allclose(again(**enc.to(again.device)).logits.cpu(), ref, atol=1e-4)
    half, _ = load_checkpoint(path, dtype="bf16", device="cpu")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        low = half(**enc).logits.float()
    assert torch.isfinite(low).all() and (low - ref).abs().max() < 0.1 * ref.abs().max() + 0.1


@pytest.mark.parametrize("name", ["tiny-llava", "tiny-qwen3vl", "tiny-qwen25vl"])
def test_pvm_and_diagnostics_apply_to_each_autoregressive_architecture(saved, name):
    from keepsight.probes import LogitLens, VisualAttentionProbe
    from keepsight.pvm import PVMConfig, attach_pvm, pvm_parameters

    model, processor = load_checkpoint(saved[name], dtype="float32", device="cpu")
    enc = _inputs(processor)
    with torch.no_grad():
        base = model(**enc).logits
    attach_pvm(model, PVMConfig(layers=[0, 1]))
    assert sum(p.numel() for p in pvm_parameters(model)) > 0
    with torch.no_grad():
        assert torch.allclose(model(**enc).logits, base, atol=1e-5)  # gate 0: the base model
        for p in pvm_parameters(model):
            p.add_(0.5)  # open the gates (and move every PVM weight): the branch now changes the output
        assert not torch.allclose(model(**enc).logits, base, atol=1e-4)
    with VisualAttentionProbe(model) as probe, torch.no_grad():
        model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert probe.omega_v().shape[0] == 3 and torch.isfinite(probe.omega_v()).all()
    lens = LogitLens(model)
    with torch.no_grad():
        out = lens.from_hidden_states(model(**enc, output_hidden_states=True).hidden_states)
    assert out["kl"].shape == (len(lens.info.layers), 2) and float(out["kl"][-1].abs().max()) < 1e-4


def test_bridge_applies_to_llava_and_refuses_qwen_clearly(saved):
    from keepsight.bridge.swap import replace_projector

    model, processor = load_checkpoint(saved["tiny-llava"], dtype="float32", device="cpu")
    replace_projector(model, "lia_mtr")
    with torch.no_grad():
        assert torch.isfinite(model(**_inputs(processor)).logits).all()
    qwen, _ = load_checkpoint(saved["tiny-qwen3vl"], dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="LLaVA-family"):
        replace_projector(qwen, "lia_mtr")


def test_mps_mrs_and_the_sampler_apply_to_the_llada_v_directory(saved):
    from keepsight.diffusion import MaskPriorSuppression, MonotonicRoPEScaling, generate

    model, processor = load_checkpoint(saved["tiny-llada-v"], dtype="float32", device="cpu")
    enc = _inputs(processor, n=1)
    P = enc["input_ids"].shape[1]
    kw = dict(gen_length=8, steps=4, generator=torch.Generator().manual_seed(0))
    plain = generate(model, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], **kw).generated
    mps = MaskPriorSuppression(k=2, lam=0.0).fit(model, processor.tokenizer)
    kw["generator"] = torch.Generator().manual_seed(0)
    with mps.apply(model), MonotonicRoPEScaling(beta=0.0).apply(model, gen_start=P):
        same = generate(model, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], **kw).generated
    assert torch.equal(plain, same)  # lam = 0 and beta = 0 are exact no-ops on a loaded checkpoint


def test_mrs_applies_to_autoregressive_qwen(saved):
    from keepsight.diffusion import MonotonicRoPEScaling

    model, processor = load_checkpoint(saved["tiny-qwen25vl"], dtype="float32", device="cpu")
    enc = _inputs(processor, n=1)
    with torch.no_grad():
        base = model(**enc).logits
        with MonotonicRoPEScaling(beta=0.0).apply(model):
            assert torch.equal(model(**enc).logits, base)
        with MonotonicRoPEScaling(beta=1.0).apply(model):
            assert not torch.equal(model(**enc).logits, base)


def test_bad_checkpoints_and_options(saved, tmp_path, processor, capsys):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(tmp_path / "empty")
    lm = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(processor.tokenizer), hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    lm.save_pretrained(tmp_path / "qwen3")
    with pytest.raises(ValueError, match="unsupported architecture model_type='qwen3'"):
        load_checkpoint(tmp_path / "qwen3")
    with pytest.raises(ValueError, match="is an autoregressive checkpoint .*needs a diffusion one"):
        load_checkpoint(saved["tiny-llava"], expect="diffusion")
    from keepsight.cli import main

    assert main(["world", "build", "--out", str(tmp_path / "w"), "--n", "2"]) == 0
    assert main(["world", "eval", "--model", str(saved["tiny-llada-v"]), "--data", str(tmp_path / "w")]) == 2
    assert "is a diffusion checkpoint (llada_v); this needs an autoregressive one" in capsys.readouterr().err
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("int8")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("tpu:x")
    cfg = json.loads((saved["tiny-llava"] / "config.json").read_text())
    broken = tmp_path / "noweights"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises((OSError, ValueError)):
        load_checkpoint(broken)


@pytest.mark.parametrize("name", ["tiny-qwen3vl", "tiny-qwen25vl"])
def test_training_and_eval_commands_take_a_qwen_directory(saved, name, tmp_path, capsys):
    """The commands that take --model run on a Qwen-VL directory (labels from the prompt prefix of its
    own chat template; image-only processor without torchvision)."""
    from keepsight.cli import main

    data = tmp_path / "data"
    assert main(["world", "build", "--out", str(data), "--n", "4", "--seed", "1"]) == 0
    common = ["--model", str(saved[name]), "--data", str(data)]
    assert main(["pvm", "train", "--stage", "sft", *common, "--out", str(tmp_path / "pvm"), "--steps", "2",
                 "--batch-size", "2", "--device", "cpu"]) == 0
    assert main(["lora", "train", *common, "--out", str(tmp_path / "lora"), "--steps", "2", "--batch-size", "2"]) == 0
    assert main(["world", "eval", *common, "--limit", "2", "--pvm", str(tmp_path / "pvm"), "--dtype", "fp32"]) == 0
    assert "CHAIRi" in capsys.readouterr().out
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:  # GRPO with the real processor: tests/lmms (make test-lmms)
        assert main(["pvm", "train", "--stage", "grpo", *common, "--init", str(tmp_path / "pvm"),
                     "--out", str(tmp_path / "g"), "--steps", "1"]) == 2
        assert "install torchvision" in capsys.readouterr().err


def test_world_eval_history_scores_the_regime_and_its_oracle(saved, tmp_path, capsys):
    from keepsight.cli import main

    data = tmp_path / "data"
    assert main(["world", "build", "--out", str(data), "--n", "3", "--seed", "1"]) == 0
    out = tmp_path / "scores.json"
    assert main(["world", "eval", "--model", str(saved["tiny-llava"]), "--data", str(data), "--history",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "history  accuracy by turns of history 0:" in printed and "oracle after 15 turns:" in printed
    res = json.loads(out.read_text())
    for name in ("history", "oracle"):
        assert res[name]["lengths"][-1] == 15 and all(len(h) == 3 for h in res[name]["hits"].values())
    long = res["oracle"]["by_length"]["15"]["acc"] - res["history"]["by_length"]["15"]["acc"]
    low, high = res["oracle_recovery"]["recovered_interval"]
    assert low <= long + 1e-9 and long - 1e-9 <= high
    assert "after its own description" in printed
    ad = res["after_description"]
    for arm in ("none", "description", "oracle"):
        assert len(ad[arm]["hits"]) == 3 and ad[arm]["acc"] == ad[arm]["hits"].count("1") / 3
    assert ad["drop"]["diff"] == pytest.approx(ad["none"]["acc"] - ad["description"]["acc"])
    assert ad["recovery"]["diff"] == pytest.approx(ad["oracle"]["acc"] - ad["description"]["acc"])
    # with no history the question is the probe's final one, answered as in the history regime's length 0
    assert ad["none"]["hits"] == res["history"]["hits"]["0"]


def test_dtype_none_keeps_the_saved_dtype(tmp_path):
    path = save_tiny_checkpoint("tiny-llava", tmp_path / "m")
    model, processor = load_checkpoint(path, dtype="bf16", device="cpu")
    model.save_pretrained(tmp_path / "bf16")
    processor.save_pretrained(tmp_path / "bf16")
    assert next(load_checkpoint(tmp_path / "bf16", dtype=None, device="cpu")[0].parameters()).dtype == torch.bfloat16
    assert next(load_checkpoint(tmp_path / "bf16", dtype="auto", device="cpu")[0].parameters()).dtype == torch.float32
