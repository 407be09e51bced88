"""Parity with the authors' released MPS / MRS (github.com/hong-sujung/MPD-PAC, LLaDA-V) and LLaDA-V's prompt
(github.com/ML-GSAI/LLaDA-V), run under the release's transformers (4.49) by ``scripts/reference/mps_mrs_released.py``
on a tiny LLaDA built from keepsight's config: the MRS angle scales, MPS's mu / V_k / u, the logits of every sampler
step at every generation slot (replaying the slots the released sampler committed), the final tokens of keepsight's
batched sampler, and the prompt ids of an image, a text and a two-image question."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from keepsight.data import Sample, render_prompt
from keepsight.data.chat import user_message
from keepsight.diffusion import MaskPriorSuppression, MonotonicRoPEScaling, generate
from keepsight.models import load_checkpoint
from tiny_checkpoints import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "mps_mrs"
sys.path.insert(0, str(ROOT / "scripts" / "reference"))
import mps_mrs_released as gen  # noqa: E402  (the generator's tiny model and prompt, rebuilt here)

BANNED = [126081, 126080, 126346, 126347]  # the released sampler's bans at still-masked slots


@pytest.fixture(scope="module")
def ref():
    return json.loads((FIXTURES / "meta.json").read_text()), load_file(FIXTURES / "outputs.safetensors")


@pytest.fixture(scope="module")
def model(ref):
    meta, _ = ref
    m = gen.keepsight_model()
    assert gen.state_digest(m.state_dict()) == meta["base_digest"], "the tiny LLaDA no longer builds the weights the " \
        "reference ran on: regenerate the fixtures (scripts/reference/mps_mrs_released.py)"
    return m


def _fixes(model, setting: dict | None):
    """MPS + MRS as released at ``setting`` (None: neither), fitted on the model."""
    import contextlib

    stack = contextlib.ExitStack()
    if setting is not None:
        mps = MaskPriorSuppression(k=gen.K, lam=setting["lam"]).fit(model, _Tok())
        stack.enter_context(mps.apply(model))
        stack.enter_context(MonotonicRoPEScaling(beta=setting["beta"], eta=gen.ETA, tau0=gen.TAU0).apply(model))
    return stack


class _Tok:
    """What MPS's fit reads of a tokenizer: the mask id (LLaDA's)."""

    mask_token_id = 126336
    all_special_ids: list = []

    def __len__(self):
        return 126464


def test_the_fixture_is_the_release(ref):
    meta, _ = ref
    assert meta["transformers"] == "4.49.0" and meta["reference_commits"]["MPD-PAC"].startswith("b85d7e1")
    assert set(meta["settings"]) == {"plain", "released", "strong"}


def test_mrs_angle_scales_match_the_release(ref, model):
    meta, out = ref
    D = 64 // 4
    for name, s in meta["settings"].items():
        if s is None:
            continue
        ours = MonotonicRoPEScaling(beta=s["beta"], eta=gen.ETA, tau0=gen.TAU0).gains(D)  # [D/2]
        torch.testing.assert_close(torch.cat([ours, ours]).float(), out[f"mrs_scale_{name}"], atol=1e-6, rtol=1e-6)


def test_mps_subspace_matches_the_release(ref, model):
    _, out = ref
    mps = MaskPriorSuppression(k=gen.K).fit(model, _Tok())
    torch.testing.assert_close(mps.mu, out["mps_mu"], atol=1e-4, rtol=1e-4)
    signs = torch.sign((mps.U * out["mps_V"]).sum(0))  # singular vectors are defined up to sign
    torch.testing.assert_close(mps.U * signs, out["mps_V"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mps.u * signs, out["mps_u"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["plain", "released", "strong"])
def test_every_step_matches_the_release(ref, model, name):
    """Replaying the slots the released sampler committed, keepsight's logits at every generation slot of every step
    (before the bans) equal the release's: its 64 largest values and the log-sum-exp of all 126,464, to 1e-4."""
    meta, out = ref
    prompt = load_file(FIXTURES / "prompt.safetensors")["prompt"]
    P, G = prompt.shape[1], gen.GEN
    x = torch.cat([prompt, torch.full((1, G), 126336)], 1)
    tokens, transfer = out[f"{name}_tokens"], out[f"{name}_transfer"]
    moved = 0.0
    with _fixes(model, meta["settings"][name]), torch.no_grad():
        for t in range(gen.STEPS):
            logits = model(input_ids=x).logits[0, P:].float()  # [G, V]
            idx = out[f"{name}_top_indices"][t]  # [G, 64]
            torch.testing.assert_close(logits.gather(-1, idx), out[f"{name}_top_values"][t], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(logits.logsumexp(-1), out[f"{name}_logsumexp"][t], atol=1e-4, rtol=1e-4)
            moved = max(moved, float((out[f"{name}_top_values"][t] - out["plain_top_values"][t]).abs().max()))
            x[0, transfer[t]] = tokens[transfer[t] - P]
    if name != "plain":
        assert moved > 1e-3, "the fixes must change the logits for this comparison to mean anything"


@pytest.mark.parametrize("name", ["plain", "released", "strong"])
def test_keepsights_batched_sampler_commits_the_release_s_tokens(ref, model, name):
    meta, out = ref
    prompt = load_file(FIXTURES / "prompt.safetensors")["prompt"]
    with _fixes(model, meta["settings"][name]):
        got = generate(model, prompt.repeat(2, 1), gen_length=gen.GEN, steps=gen.STEPS, block_length=gen.BLOCK,
                       mask_token_id=126336, suppress_token_ids=BANNED)
    assert torch.equal(got.generated[0], out[f"{name}_tokens"]) and torch.equal(got.generated[1], got.generated[0])


def test_llada_v_prompt_ids_match_the_shipped_conversation(ref, tmp_path):
    """keepsight's LLaDA-V processor against conv_llava_llada + tokenizer_image_token (each image run collapsed to the
    shipped -200 placeholder)."""
    meta, out = ref
    model, proc = load_checkpoint(save_tiny_checkpoint("tiny-llada-v-official", tmp_path / "o"), dtype="float32",
                                  device="cpu")
    image_id = model.config.image_token_id
    img = Image.new("RGB", (64, 64), (10, 120, 200))
    samples = {"image": Sample.single_turn("Please describe the image in detail.", image=img),
               "text": Sample.single_turn("What is a scene?"),
               "two_images": Sample(user_message("What differs between the images?", 2), [img, img])}
    for name, sample in samples.items():
        text = render_prompt(proc, sample)
        assert text == meta["prompts"][name]
        enc = proc(text=[text], images=sample.images or None, return_tensors="pt")
        ids, per_image, collapsed, run = enc["input_ids"][0].tolist(), model.config.image_seq_length, [], 0
        for t in ids:  # each image's run of tokens becomes one -200 (two images' runs are adjacent here)
            run = run + 1 if t == image_id else 0
            if t != image_id:
                collapsed.append(t)
            elif run % per_image == 1:
                collapsed.append(-200)
        assert collapsed == out[f"prompt_ids_{name}"].tolist(), name
