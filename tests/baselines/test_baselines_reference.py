"""Parity with the released VCD, PAI and MemVR, run under their own transformers (4.31 / 4.37 / 4.40) by
``scripts/reference/baselines_released.py`` on keepsight's tiny-llava-1.5 (a LLaMA LLaVA of 32 layers, 16 image
tokens; its LM head scaled by 10 so the plausibility cuts and MemVR's trigger have something to decide): every
decode step's logits of keepsight's methods at the released defaults equal the reference's to 1e-4, with the same
tokens cut (-inf) and, for MemVR, the same trigger and memory layers per forward. VCD gets the reference's noised
image (its noise comes from the global RNG, ours from a per-image generator; the schedule is checked separately).
DeCo has no public code: no fixture. Limits, from the fixture's notes: every method's greedy tokens equal the plain
ones here (the methods move the logits, not the argmax), so the feeding back of a method's own tokens is covered by
the formula twins in ``tests/baselines/test_baselines.py``, not here."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from keepsight.baselines import build_baseline
from keepsight.baselines import vcd as vcd_module

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "baselines"
sys.path.insert(0, str(ROOT / "scripts" / "reference"))
import mps_mrs_released as digests  # noqa: E402  (the fixtures' state digest)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def meta():
    return json.loads((FIXTURES / "meta.json").read_text())


@pytest.fixture(scope="module")
def setup(meta):
    from keepsight.data import chat_example
    from keepsight.world import generate_scenes, render, world_config
    from keepsight.world.models import build_model, preset_processor
    from keepsight.world.processor import build_tokenizer
    from keepsight.world.texts import DESCRIBE_PROMPT

    tok = build_tokenizer()
    model = build_model(meta["preset"], tok, seed=meta["seed"]).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(meta["lm_head_scale"])
    assert digests.state_digest(model.state_dict()) == meta["state_digest"], "tiny-llava-1.5 no longer builds the " \
        "weights the references ran on: regenerate the fixtures (scripts/reference/baselines_released.py)"
    proc = preset_processor(meta["preset"])
    cfg = world_config()
    image = render(generate_scenes(cfg, 1, seed=0)[0], cfg.noise_std)
    enc = proc(text=[chat_example(proc, DESCRIBE_PROMPT)], images=[image], return_tensors="pt")
    stored = load_file(FIXTURES / "inputs.safetensors")
    for k in ("input_ids", "attention_mask", "pixel_values"):
        assert torch.equal(enc[k], stored[k]), k
    return model, proc, enc


def _steps(model, proc, enc, method) -> tuple[list[torch.Tensor], torch.Tensor]:
    with method.apply(model):
        out = model.generate(**enc, max_new_tokens=6, do_sample=False, return_dict_in_generate=True,
                             output_logits=True, pad_token_id=proc.tokenizer.pad_token_id)
    return [s[0] for s in out.logits], out.sequences[0, enc["input_ids"].shape[1]:]


def _same(ours: list[torch.Tensor], ref: torch.Tensor) -> None:
    for t, (a, b) in enumerate(zip(ours, ref)):
        fin = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), fin), f"step {t}: another set of tokens cut"
        torch.testing.assert_close(a[fin], b[fin].to(a.dtype), rtol=1e-4, atol=1e-4, msg=f"step {t}")


@pytest.mark.parametrize("setting", ["released", "pope"])
def test_vcd_equals_the_release(setup, meta, monkeypatch, setting):
    model, proc, enc = setup
    ref = load_file(FIXTURES / "vcd.safetensors")
    monkeypatch.setattr(vcd_module, "distort", lambda pixel_values, *a, **k: ref["image_cd"].to(pixel_values.dtype))
    s = meta["vcd"]["settings"][setting]
    logits, tokens = _steps(model, proc, enc, build_baseline("vcd", alpha=s["cd_alpha"], beta=s["cd_beta"]))
    _same(logits, ref[f"{setting}.logits"])
    assert tokens.tolist() == ref[f"{setting}.tokens"].tolist()
    if setting == "released":
        assert build_baseline("vcd").config.beta == s["cd_beta"] and build_baseline("vcd").config.alpha == 1.0


def test_vcd_noise_schedule_is_the_release(meta):
    ref = load_file(FIXTURES / "vcd.safetensors")
    ab = vcd_module.alpha_bar(meta["vcd"]["noise_step"])
    assert math.sqrt(ab) == pytest.approx(float(ref["noise.sqrt_alpha_bar"]), abs=1e-6)
    assert math.sqrt(1 - ab) == pytest.approx(float(ref["noise.sqrt_one_minus_alpha_bar"]), abs=1e-6)


def test_pai_equals_the_release_with_its_text_only_subtraction(setup, meta):
    """The defaults (alpha 0.2, g = 1.1, layers 2 .. 31, the 0.1 cut, the prefill unamplified)."""
    model, proc, enc = setup
    ref = load_file(FIXTURES / "pai.safetensors")
    logits, tokens = _steps(model, proc, enc, build_baseline("pai"))
    _same(logits, ref["cfg.logits"])
    assert tokens.tolist() == ref["cfg.tokens"].tolist()


def test_pai_equals_the_release_with_attention_only(setup, meta):
    model, proc, enc = setup
    ref = load_file(FIXTURES / "pai.safetensors")
    s = meta["pai"]["settings"]["attn"]
    logits, _ = _steps(model, proc, enc, build_baseline("pai", alpha=s["alpha"], gamma=0.0, beta=0.0))
    _same(logits, ref["attn.logits"])
    assert not torch.allclose(torch.stack(logits), ref["plain.logits"])  # the amplification moved the logits


@pytest.mark.parametrize("setting", ["released", "split"])
def test_memvr_equals_the_release(setup, meta, setting):
    model, proc, enc = setup
    ref = load_file(FIXTURES / "memvr.safetensors")
    s = meta["memvr"]["settings"][setting]
    method = build_baseline("memvr", threshold=s["entropy_threshold"], ratio=s["retracing_ratio"],
                            start_layer=s["starting_layer"], end_layer=s["ending_layer"])
    logits, tokens = _steps(model, proc, enc, method)
    _same(logits, ref[f"{setting}.logits"])
    layers = [x for x in s["memory_layer"] if x >= 0]
    stats = method.stats()
    assert stats["triggered"] == len(layers)
    assert stats["layers"] == {layer: layers.count(layer) for layer in set(layers)}
    if setting == "released":  # the defaults are the release's on its 32-layer depth
        default = build_baseline("memvr")
        _same(_steps(model, proc, enc, default)[0], ref["released.logits"])
