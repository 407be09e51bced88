"""LaViDa (keepsight.models.lavida): its pooling of every view after the projector against a hand-written bilinear /
average pool, the packing (base view, unpadded crop grid, a newline per row) against its parts, the processor's token
counts against the model's features for images of several aspects and several images in a row, the released layout
(OLMo-style LLaDA names, the tower one layer shorter than its config) loading to the same logits as transformers'
layout, the errors that name a field, and the LLaDA sampler with MPS / MRS on it (rows alone == the batch)."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from keepsight.data import Sample, render_prompt
from keepsight.diffusion import MaskPriorSuppression, MonotonicRoPEScaling, generate
from keepsight.models import checkpoint_kind, load_checkpoint
from keepsight.models.lavida import (
    LavidaForConditionalGeneration,
    LavidaProcessor,
    pool_views,
    release_config,
)
from keepsight.world.models import build_lavida
from tiny_checkpoints import save_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = [(56, 56), (120, 50), (30, 90), (200, 200)]  # (width, height): square, wide, tall, large


@pytest.fixture(scope="module")
def tiny():
    return build_lavida(seed=0)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lavida")
    return (save_tiny_checkpoint("tiny-lavida-official", root / "official"),
            save_tiny_checkpoint("tiny-lavida", root / "hf"))


def _enc(processor, images, questions=None):
    questions = questions or ["describe the scene ."] * len(images)
    texts = [render_prompt(processor, Sample.single_turn(q, image=im)) for q, im in zip(questions, images)]
    processor.tokenizer.padding_side = "left"
    return processor(text=texts, images=[[im] for im in images], return_tensors="pt", padding=True)


def _bilinear_by_hand(grid: torch.Tensor, out: int) -> torch.Tensor:
    """[side, side, C] -> [out, out, C] by the align_corners=False bilinear formula, written out."""
    side = grid.shape[0]

    def taps(i):
        src = max((i + 0.5) * side / out - 0.5, 0.0)
        lo = int(src)
        return lo, min(lo + 1, side - 1), src - lo

    res = torch.zeros(out, out, grid.shape[-1], dtype=torch.float64)
    for y in range(out):
        y0, y1, wy = taps(y)
        for x in range(out):
            x0, x1, wx = taps(x)
            g = grid.double()
            res[y, x] = ((1 - wy) * ((1 - wx) * g[y0, x0] + wx * g[y0, x1])
                         + wy * ((1 - wx) * g[y1, x0] + wx * g[y1, x1]))
    return res


def test_pooling_is_get_2dpool():
    torch.manual_seed(0)
    views = torch.randn(3, 27 * 27, 5)
    pooled = pool_views(views)  # LaViDa's default: bilinear to ceil(27 / 2) = 14
    assert pooled.shape == (3, 196, 5)
    for v in range(3):
        want = _bilinear_by_hand(views[v].view(27, 27, 5), 14).view(196, 5)
        torch.testing.assert_close(pooled[v].double(), want, atol=1e-5, rtol=1e-5)
    avg = pool_views(views, "average")  # 13 x 13: the mean of each whole 2 x 2 block
    assert avg.shape == (3, 169, 5)
    grid = views[1].view(27, 27, 5)
    torch.testing.assert_close(avg[1].view(13, 13, 5)[4, 7], grid[8:10, 14:16].mean((0, 1)))
    with pytest.raises(ValueError, match="not a square grid"):
        pool_views(torch.randn(1, 10, 2))
    with pytest.raises(ValueError, match="spatial_pool_mode must be one of"):
        pool_views(views, "nearest")


@pytest.mark.parametrize("size", SIZES)
def test_processor_counts_the_model_s_tokens(tiny, size):
    """Each image's run of image tokens is as long as the packed features the model splices in."""
    model, processor = tiny
    image = Image.new("RGB", size, (200, 20, 20))
    enc = _enc(processor, [image])
    with torch.no_grad():
        feats = model.model.get_image_features(enc["pixel_values"], enc["image_sizes"]).pooler_output
    assert [f.shape[0] for f in feats] == [int((enc["input_ids"] == model.config.image_token_id).sum())]
    model(**enc)  # the forward itself checks the splice


def test_packing_base_view_then_rows_with_a_newline(tiny):
    """A 112 x 40 image on the tiny pinpoints: a base view and 2 crops side by side (56 x 112), each pooled to 4 x 4;
    the crop grid (4 x 8) loses the rows of its black padding, and each row ends in image_newline."""
    model, processor = tiny
    enc = _enc(processor, [Image.new("RGB", (112, 40), (200, 20, 20))])
    inner = model.model
    with torch.no_grad():
        hidden = inner.vision_tower(enc["pixel_values"][0], output_hidden_states=True).hidden_states[-1]
        views = inner.multi_modal_projector(hidden)  # projected, then pooled
        packed = inner.get_image_features(enc["pixel_values"], enc["image_sizes"]).pooler_output[0]
    assert views.shape[:2] == (3, 16)
    assert torch.equal(packed[:16], views[0])  # the base view first
    rest = packed[16:]
    is_newline = (rest == inner.image_newline).all(-1)
    rows = int(is_newline.sum())
    assert rows == 2 and rest.shape[0] == rows * 9 and is_newline.view(rows, 9)[:, -1].all()  # 8 columns + newline
    grid = torch.cat([views[1].view(4, 4, -1), views[2].view(4, 4, -1)], dim=1)  # [4, 8, C]: the crops side by side
    assert torch.equal(rest.view(rows, 9, -1)[:, :8], grid[1:3])  # the middle rows: the padding's went


def test_several_images_in_a_row_get_one_view_each(tiny):
    model, processor = tiny
    images = [Image.new("RGB", (120, 50), (200, 20, 20)), Image.new("RGB", (56, 56), (20, 20, 200))]
    from keepsight.data.sample import user_message

    text = render_prompt(processor, Sample(user_message("which is red ?", 2), images))
    enc = processor(text=[text], images=[images], return_tensors="pt")
    assert int((enc["input_ids"] == model.config.image_token_id).sum()) == 2 * (16 + 1)
    model(**enc)


def test_released_layout_loads_to_the_same_logits(dirs):
    official, hf = dirs
    raw = json.loads((official / "config.json").read_text())
    assert raw["model_type"] == "llava_llada" and "d_model" in raw and raw["image_aspect_ratio"] == "anyres"
    tower = json.loads((official / raw["mm_vision_tower"] / "config.json").read_text())
    assert checkpoint_kind(official) == "lavida" and checkpoint_kind(hf) == "lavida"
    a, pa = load_checkpoint(official, dtype="float32", device="cpu")
    b, pb = load_checkpoint(hf, dtype="float32", device="cpu")
    assert type(a) is type(b) is LavidaForConditionalGeneration and type(pa) is type(pb) is LavidaProcessor
    assert a.config.vision_config.num_hidden_layers == tower["num_hidden_layers"] - 1  # read from the weights
    images = [Image.new("RGB", s, (200, 20, 20)) for s in SIZES[:2]]
    ea, eb = _enc(pa, images), _enc(pb, images)
    assert all(torch.equal(ea[k], eb[k]) for k in eb)
    with torch.no_grad():
        assert torch.equal(a(**ea).logits, b(**eb).logits)


@pytest.mark.parametrize(("change", "message"), [
    ({"mm_projector_type": "linear"}, "mm_projector_type 'linear'; LaViDa's is 'mlp2x_gelu'"),
    ({"image_aspect_ratio": "pad"}, "image_aspect_ratio 'pad'"),
    ({"mm_patch_merge_type": "flat"}, "mm_patch_merge_type 'flat'"),
    ({"mm_spatial_pool_mode": "nearest"}, "spatial_pool_mode must be one of"),
    ({"mm_hidden_size": 7}, "mm_hidden_size 7 but the tower is"),
    ({"image_grid_pinpoints": "[(56, 112)]"}, "image_grid_pinpoints is a string"),
])
def test_release_config_errors_name_the_field(dirs, change, message):
    official, _ = dirs
    raw = {**json.loads((official / "config.json").read_text()), **change}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        release_config(raw, official)


def test_llada_sampler_mps_and_mrs_on_lavida(tiny):
    """The LLaDA sampler decodes a batch of two image sizes (two image-token counts) as each row alone, and MPS /
    MRS act on LaViDa's language model."""
    model, processor = tiny
    images = [Image.new("RGB", (120, 50), (200, 20, 20)), Image.new("RGB", (56, 56), (20, 20, 200))]
    mask_id = model.config.text_config.mask_token_id

    def run(enc):
        extra = {k: enc[k] for k in ("image_sizes", "batch_num_images")}
        return generate(model, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], gen_length=8, steps=8,
                        block_length=8, mask_token_id=mask_id, model_kwargs=extra).generated

    batch = run(_enc(processor, images, ["describe the scene .", "what is red ?"]))
    for r, (im, q) in enumerate(zip(images, ["describe the scene .", "what is red ?"])):
        assert torch.equal(batch[r], run(_enc(processor, [im], [q]))[0]), r
    enc = _enc(processor, images)
    x = torch.cat([enc["input_ids"], torch.full((2, 8), mask_id)], 1)
    inputs = {**enc, "input_ids": x, "attention_mask": torch.ones_like(x)}
    with torch.no_grad():
        plain = model(**inputs).logits[:, -8:]
        mps = MaskPriorSuppression(k=4, lam=0.8).fit(model, processor.tokenizer)
        with mps.apply(model):
            suppressed = model(**inputs).logits[:, -8:]
            run(enc)
        with MonotonicRoPEScaling(beta=0.9).apply(model):
            scaled = model(**inputs).logits[:, -8:]
            run(enc)
        assert torch.equal(model(**inputs).logits[:, -8:], plain)  # both removed on exit
    assert not torch.allclose(suppressed, plain) and not torch.allclose(scaled, plain)


def test_prefix_dlm_cache_is_a_full_forward_where_the_prompt_cannot_see_the_answer(tiny):
    """cache="prompt" (LaViDa's Prefix-DLM): the prompt's keys come from a forward over the prompt alone, and every
    step runs the generation slots on them. Its logits equal one full forward whose prompt rows are masked from the
    answer columns (a 4-D mask), and differ from the plain full forward; a padded batch decodes as each row alone."""
    from keepsight.models.llada import BlockKV

    model, processor = tiny
    mask_id = model.config.text_config.mask_token_id
    enc = _enc(processor, [Image.new("RGB", (112, 40), (200, 20, 20))])
    images = {k: enc[k] for k in ("pixel_values", "image_sizes")}
    P, G = enc["input_ids"].shape[1], 8
    x = torch.cat([enc["input_ids"], torch.full((1, G), mask_id)], 1)
    blocked = torch.zeros(1, 1, P + G, P + G)
    blocked[..., :P, P:] = float("-inf")
    with torch.no_grad():
        twin = model(input_ids=x, attention_mask=blocked, **images).logits[:, P:]
        full = model(input_ids=x, **images).logits[:, P:]
        kv = BlockKV().record(torch.ones(P, dtype=torch.bool), torch.ones(1, P, dtype=torch.long))
        model(input_ids=x[:, :P], cache=kv, **images)
        got = model(input_ids=x[:, P:], attention_mask=torch.ones(1, G, dtype=torch.long),
                    position_ids=torch.arange(P, P + G)[None], cache=kv.read()).logits
    torch.testing.assert_close(got, twin, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, full, atol=1e-3)

    def run(images, questions):
        e = _enc(processor, images, questions)
        return generate(model, e["input_ids"], e["attention_mask"], e["pixel_values"], gen_length=8, steps=8,
                        block_length=4, mask_token_id=mask_id, cache="prompt",
                        model_kwargs={k: e[k] for k in ("image_sizes", "batch_num_images")})

    images = [Image.new("RGB", (120, 50), (200, 20, 20)), Image.new("RGB", (56, 56), (20, 20, 200))]
    questions = ["describe the scene .", "what is red ?"]
    out = run(images, questions)
    assert out.forwards == 1 + 8  # the prompt once, then one forward of the 8 slots a step
    for r in range(2):
        assert torch.equal(out.generated[r], run(images[r: r + 1], questions[r: r + 1]).generated[0]), r
    with pytest.raises(ValueError, match="cache='prompt' records the prompt once"):
        generate(model, x[:, :P], gen_length=8, steps=8, mask_token_id=mask_id, cache="prompt", refresh_every=2)


def test_eval_generate_on_lavida_bans_no_token(dirs, monkeypatch):
    """keepsight's Pipeline decodes a LaViDa directory with LaViDa's sampler settings: no token banned at the mask
    slots (LLaDA-V's four bans are LLaDA-V's); the answer ends at the first end-of-text or <|eot_id|>."""
    import keepsight.inference.pipeline as pipeline_module
    from keepsight.inference import Pipeline

    official, _ = dirs
    seen = {}
    real = pipeline_module.diffusion_generate

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline_module, "diffusion_generate", spy)
    pipe = Pipeline(str(official), method="diffusion", dtype="float32", device="cpu")
    answers = pipe.generate_samples([Sample.single_turn("describe the scene .", image=Image.new("RGB", (56, 56)))],
                                    {"max_new_tokens": 4})
    assert seen["suppress_token_ids"] == [] and len(answers) == 1
