"""Parity with LaViDa as its authors release it (github.com/jacklishufan/LaViDa), run: ``scripts/reference/
lavida_released.py`` builds the release's ``LlavaLladaForMaskedDiffusion`` under its transformers (4.50.3) from the tiny
LaViDa that keepsight writes in the released layout (``tiny-lavida-official``), loads its weights strictly (every key
matches), and records per test image (square, wide, tall, large) what the release computes. keepsight, loading the same
directory with ``load_checkpoint``, gives: the release's views (``process_images``: anyres crops on the pinpoints and
the base view), its prompt ids (``tokenizer_image_token`` on its ``conv_llava_llada`` prompt, which keepsight's
template renders to the same text), each view's pooled features (``get_2dPool``), the packed image
features it splices in (``spatial_unpad``: base view, unpadded crop grid, ``image_newline`` per row), the logits of
the prompt and 8 mask slots, the first Prefix-DLM step's logits, and every step of its ``generate`` (8 slots, one
block, one slot a step, temperature 0) with ``prefix_lm`` off (``cache="none"``) and on (``cache="prompt"``).

The release reads each ``image_grid_pinpoints`` pair as (width, height), transformers' LLaVA-OneVision classes as
(height, width): keepsight swaps the released pairs when it reads them (``keepsight.models.lavida.hf_pinpoints``).
Unswapped, an image whose two transposed canvases tie (on the tiny's pinpoints the 56 x 56 image; on the release's
every image no larger than 384 x 384) went onto the other canvas: other crops, features, logits and tokens
(``test_the_crop_grid_is_the_release_s`` names both canvases if that comes back).

Regenerate the fixtures (``tests/fixtures/reference/lavida/``) after changing the tiny LaViDa or the images:

    python scripts/reference/lavida_released.py --lavida /path/to/LaViDa   # a checkout or bare clone
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers.models.llava_onevision.modeling_llava_onevision import get_anyres_image_grid_shape

from keepsight.data import Sample, render_prompt
from keepsight.diffusion import generate
from keepsight.diffusion.sampler import transfer_schedule
from keepsight.models import load_checkpoint
from keepsight.models.lavida import hf_pinpoints
from keepsight.world.models import build_lavida
from tiny_checkpoints import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "lavida"
sys.path.insert(0, str(ROOT / "scripts" / "reference"))
import lavida_released as released  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

IMAGES = range(len(released.SIZES))
REGENERATE = "regenerate the fixtures (python scripts/reference/lavida_released.py --lavida <LaViDa checkout>)"


@pytest.fixture(scope="module")
def ref():
    return json.loads((FIXTURES / "meta.json").read_text()), load_file(FIXTURES / "outputs.safetensors")


@pytest.fixture(scope="module")
def loaded(ref, tmp_path_factory):
    meta, _ = ref
    built, _ = build_lavida(seed=released.SEED)
    assert released.state_digest(built.state_dict()) == meta["state_digest"], \
        f"build_lavida(seed={released.SEED}) no longer builds the weights the release ran on: {REGENERATE}"
    model, processor = load_checkpoint(save_tiny_checkpoint("tiny-lavida-official", tmp_path_factory.mktemp("lv")),
                                       dtype=None, device="cpu")
    return model.eval(), processor


def _run(model, processor, image, prompt, mask_id):
    """keepsight on one image: the processor's output, the pooled views (the projector's output), the embeddings the
    language model gets, the logits of the prompt + 8 mask slots, the first Prefix-DLM step's logits (a full forward
    whose prompt rows cannot see the slots: ``cache="prompt"``'s math), and every step's slots of the sampler without
    a cache and with ``cache="prompt"``."""
    G = released.GEN
    enc = processor(text=[prompt], images=[[image]], return_tensors="pt")
    images = {k: enc[k] for k in ("pixel_values", "image_sizes", "batch_num_images")}
    seen = {}
    projector, lm = model.model.multi_modal_projector, model.model.language_model
    hooks = [projector.register_forward_hook(lambda m, a, out: seen.update(pooled=out.detach())),
             lm.register_forward_pre_hook(lambda m, a, k: seen.update(embeds=k["inputs_embeds"].detach()),
                                          with_kwargs=True)]
    P = enc["input_ids"].shape[1]
    x = torch.cat([enc["input_ids"], torch.full((1, G), mask_id)], 1)
    blocked = torch.zeros(1, 1, P + G, P + G)
    blocked[..., :P, P:] = float("-inf")
    with torch.no_grad():
        try:
            logits = model(input_ids=x, **images).logits[0]
        finally:
            for h in hooks:
                h.remove()
        prefix_logits = model(input_ids=x, attention_mask=blocked, **images).logits[0, P:]
    out = {"enc": enc, "logits": logits, "prefix_logits": prefix_logits, **seen}
    for name, cache in (("plain", "none"), ("prefix", "prompt")):
        steps = []
        generate(model, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], gen_length=G, steps=G,
                 block_length=released.BLOCK, mask_token_id=mask_id, cache=cache, ban_mask=False,
                 model_kwargs={k: enc[k] for k in ("image_sizes", "batch_num_images")},
                 callback=lambda trace, ids, steps=steps: steps.append(ids[0, P:].clone()))
        out[f"{name}_steps"] = torch.stack(steps)
    # as predict.py decodes (Prefix-DLM, step_ratio 0.5, the shift schedule): the release's steps = int(16 * 0.5)
    S = released.SHIFT_GEN
    for name, shift in (("shift3", 3.0), ("shift033", 0.33)):
        steps = []
        generate(model, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], gen_length=S,
                 steps=int(S * released.SHIFT_RATIO), block_length=S, mask_token_id=mask_id, cache="prompt",
                 schedule="shift", shift=shift, ban_mask=False, model_kwargs={k: enc[k] for k in ("image_sizes", "batch_num_images")},
                 callback=lambda trace, ids, steps=steps: steps.append(ids[0, P:].clone()))
        out[f"{name}_steps"] = torch.stack(steps)
    return out


@pytest.fixture(scope="module")
def ours(ref, loaded):
    meta, _ = ref
    model, processor = loaded
    return [_run(model, processor, image, meta["prompt"], meta["mask_token_id"]) for image in released.sample_images()]


def test_the_fixture_is_the_release_on_keepsight_s_tiny_lavida(ref, loaded):
    meta, _ = ref
    model, processor = loaded
    assert meta["transformers"] == "4.50.3" and meta["reference_commits"]["LaViDa"].startswith("284ef5c")
    assert meta["missing_keys"] == [] and meta["unexpected_keys"] == []  # the released layout loads strictly
    assert meta["tower_layers_kept"] == model.config.vision_config.num_hidden_layers
    assert (meta["spatial_pool_mode"], meta["image_aspect_ratio"], meta["mm_patch_merge_type"]) == (
        model.config.spatial_pool_mode, "anyres", "spatial_unpad")
    assert meta["image_grid_pinpoints"] == hf_pinpoints(model.config.image_grid_pinpoints)  # released: (w, h)
    images = released.sample_images()
    assert [released.image_digest(im) for im in images] == meta["image_digests"], f"the test images changed: {REGENERATE}"
    assert released.state_digest(model.state_dict()) == meta["state_digest"]  # the released layout reads back to the weights
    prompt = render_prompt(processor, Sample.single_turn(released.QUESTION, image=images[0]))
    assert prompt == meta["prompt"] == meta["release_prompt"]  # keepsight's template renders conv_llava_llada's text


@pytest.mark.parametrize("i", IMAGES)
def test_the_crop_grid_is_the_release_s(ref, loaded, ours, i):
    """The canvas each image is padded onto: the release's ``select_best_resolution`` reads every pinpoint as
    (width, height); transformers' LLaVA-OneVision image processor and ``get_anyres_image_grid_shape`` read it as
    (height, width), so keepsight swaps the released pairs. Where two transposed canvases tie the first listed wins:
    unswapped, the square image would be cut side by side instead of stacked."""
    meta, _ = ref
    model, _ = loaded
    height, width = (int(v) for v in ours[i]["enc"]["image_sizes"][0])
    rows, cols = get_anyres_image_grid_shape((height, width), model.config.image_grid_pinpoints,
                                             model.config.vision_config.image_size)
    view = model.config.vision_config.image_size
    release_w, release_h = meta["images"][i]["best_resolution_width_height"]
    assert (cols * view, rows * view) == (release_w, release_h), (
        f"image {released.SIZES[i]} (width, height): keepsight pads it onto a canvas {cols * view} wide and "
        f"{rows * view} tall, the release onto {release_w} wide and {release_h} tall (its pinpoints are (width, "
        f"height))")


@pytest.mark.parametrize("i", IMAGES)
def test_views_are_the_release_s(ref, ours, i):
    _, out = ref
    got = ours[i]["enc"]["pixel_values"][0]
    want = out[f"views_{i}"]
    assert got.shape == want.shape, (released.SIZES[i], tuple(got.shape), tuple(want.shape))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)  # measured: bit for bit where the canvas agrees


@pytest.mark.parametrize("i", IMAGES)
def test_prompt_ids_are_the_release_s(ref, loaded, ours, i):
    """The release's ids hold one ``IMAGE_TOKEN_INDEX`` where keepsight's hold one image token per feature row; the
    text around it is the same ids (the token after the image dropped by both)."""
    meta, out = ref
    model, _ = loaded
    want, got = out["prompt_ids"], ours[i]["enc"]["input_ids"][0]
    at = int((want == meta["image_token_index"]).nonzero()[0, 0])
    n = meta["images"][i]["image_tokens"]
    assert torch.equal(got[:at], want[:at]) and torch.equal(got[at + n:], want[at + 1:])
    assert bool((got[at:at + n] == model.config.image_token_id).all()) and got.numel() == want.numel() - 1 + n


@pytest.mark.parametrize("i", IMAGES)
def test_image_features_are_the_release_s(ref, ours, i):
    """Each view pooled after the projector (the tower's last kept layer, ``mlp2x_gelu``, bilinear to 4 x 4), and the
    packed features spliced into the prompt (base view, unpadded crop grid, ``image_newline`` per row)."""
    _, out = ref
    mine = ours[i]
    torch.testing.assert_close(mine["pooled"], out[f"pooled_{i}"], atol=1e-5, rtol=1e-5)
    at = int((out["prompt_ids"] == ref[0]["image_token_index"]).nonzero()[0, 0])
    rows = mine["embeds"][0, at:at + out[f"features_{i}"].shape[0]]
    torch.testing.assert_close(rows, out[f"features_{i}"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("i", IMAGES)
def test_logits_are_the_release_s(ref, ours, i):
    _, out = ref
    torch.testing.assert_close(ours[i]["logits"], out[f"logits_{i}"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours[i]["prefix_logits"], out[f"prefix_logits_{i}"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("i", IMAGES)
@pytest.mark.parametrize("name", ["plain", "prefix"])
def test_sampler_commits_the_release_s_tokens_step_by_step(ref, ours, i, name):
    """``generate(..., cache="none")`` is the release's ``generate`` with ``prefix_lm=False``, ``cache="prompt"``
    with ``prefix_lm=True``: the same slots after every step (LaViDa bans no token)."""
    _, out = ref
    assert torch.equal(ours[i][f"{name}_steps"], out[f"{name}_steps_{i}"])


@pytest.mark.parametrize("i", IMAGES)
@pytest.mark.parametrize("name", ["shift3", "shift033"])
def test_sampler_with_the_shift_schedule_commits_the_release_s_tokens_step_by_step(ref, ours, i, name):
    """``generate(..., cache="prompt", schedule="shift", shift=...)`` on 16 slots in 8 steps is the release's
    ``generate`` as ``predict.py`` calls it (``prefix_lm=True, step_ratio=0.5, schedule="shift"``; shift 3, and the
    COCO evaluation's 0.33): the same slots after every step."""
    _, out = ref
    assert torch.equal(ours[i][f"{name}_steps"], out[f"{name}_steps_{i}"])


def test_slots_per_step_are_the_release_s_for_each_schedule(ref):
    """``transfer_schedule`` is the release's ``get_num_transfer_tokens_sch``: the shift schedule (shift 3 and 0.33),
    the logit-normal, the cosine and the linear one, on block sizes that divide evenly and one that does not (37 slots, 11 steps)."""
    meta, out = ref
    for name, (n, steps, schedule, shift) in meta["schedules"].items():
        ours = transfer_schedule(torch.tensor([n, n]), steps, schedule, shift)
        assert torch.equal(ours[0], out[f"transfer_{name}"]) and torch.equal(ours[1], ours[0]), name
        assert int(ours[0].sum()) == n and int(ours[0].min()) >= 1
