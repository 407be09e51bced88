"""The cached sampler (prefix / dual block caches, confidence-threshold parallel decoding) against the plain one."""

import pytest
import torch
from PIL import Image

from keepsight.data import Sample, render_prompt
from keepsight.diffusion import MaskPriorSuppression, generate
from keepsight.models.llada import BlockKV
from keepsight.world.models import build_llada_v

pytestmark = pytest.mark.usefixtures("one_thread")

KW = dict(gen_length=16, steps=8, block_length=4)


@pytest.fixture(scope="module")
def vlm(processor):
    return build_llada_v(processor).eval()


@pytest.fixture(scope="module")
def batch(processor):
    """Two rows with prompts of different lengths, left-padded, each with its image."""
    imgs = [Image.new("RGB", (64, 64), c) for c in ((200, 10, 10), (10, 200, 10))]
    texts = [render_prompt(processor, Sample.single_turn(q, image=im))
             for q, im in zip(["describe the scene .", "is there a red circle at b2 ?"], imgs)]
    tok = processor.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    try:
        enc = processor(text=texts, images=imgs, return_tensors="pt", padding=True)
        rows = [processor(text=[t], images=[im], return_tensors="pt") for t, im in zip(texts, imgs)]
    finally:
        tok.padding_side = side
    assert len(set(enc["attention_mask"].sum(1).tolist())) == 2  # really different lengths
    return enc, rows


def _run(model, enc, **kw):
    return generate(model, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], **{**KW, **kw})


def test_a_read_after_a_record_equals_the_full_forward(vlm, batch, processor):
    enc, _ = batch
    B, P = enc["input_ids"].shape
    mask = processor.tokenizer.mask_token_id
    x = torch.cat([enc["input_ids"], enc["input_ids"].new_full((B, 16), mask)], 1)
    am = torch.cat([enc["attention_mask"], torch.ones(B, 16, dtype=torch.long)], 1)
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = vlm(input_ids=x, attention_mask=am, position_ids=pos, pixel_values=enc["pixel_values"]).logits
        T = x.shape[1]
        for lo, hi in ((P, T), (P + 4, P + 8)):  # prefix (window to the end) and dual (window = one block)
            cols = torch.arange(T)
            keep = (cols < lo) | (cols >= hi)
            kv = BlockKV()
            recorded = vlm(input_ids=x, attention_mask=am, position_ids=pos, pixel_values=enc["pixel_values"],
                           cache=kv.record(keep, am[:, keep])).logits
            assert torch.equal(recorded, full)  # recording changes nothing
            window = vlm(input_ids=x[:, lo:hi], attention_mask=am[:, lo:hi], position_ids=pos[:, lo:hi],
                         cache=kv.read()).logits
            torch.testing.assert_close(window, full[:, lo:hi], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_refreshed_every_step_the_cached_sampler_is_the_plain_one(vlm, batch, cache):
    enc, _ = batch
    plain = _run(vlm, enc, trace=True)
    same = _run(vlm, enc, cache=cache, refresh_every=1, trace=True)
    assert torch.equal(same.sequences, plain.sequences)
    assert [t.positions for t in same.trace] == [t.positions for t in plain.trace]
    cached = _run(vlm, enc, cache=cache)
    assert cached.forwards == plain.forwards and cached.token_forwards < plain.token_forwards
    assert not (cached.generated == vlm.config.text_config.mask_token_id).any()


def test_threshold_one_commits_in_the_plain_order(vlm, batch):
    enc, _ = batch
    for kw in ({}, {"steps": 16}):
        plain = _run(vlm, enc, trace=True, **kw)
        one = _run(vlm, enc, trace=True, threshold=1.0, threshold_rule="schedule", **kw)
        assert torch.equal(one.sequences, plain.sequences)
        assert [t.positions for t in one.trace] == [t.positions for t in plain.trace]
    # Fast-dLLM's rule at threshold 1: one slot per step until the block is done, whatever ``steps`` says: the plain
    # sampler at one token per step
    plain = _run(vlm, enc, trace=True, steps=16)
    for steps in (4, 16):
        one = _run(vlm, enc, trace=True, threshold=1.0, steps=steps)
        assert torch.equal(one.sequences, plain.sequences) and one.forwards == plain.forwards == 16
        assert [t.positions for t in one.trace] == [t.positions for t in plain.trace]


def _fast_dllm_twin(model, enc, threshold, gen_length=16, block_length=4):
    """Fast-dLLM's threshold loop written from its description, one row, no cache: per block, forward; commit
    the most confident masked slot and every other masked slot with confidence >= threshold; until none is left."""
    ids, pv = enc["input_ids"], enc["pixel_values"]
    mask = model.config.text_config.mask_token_id
    x = torch.cat([ids, ids.new_full((1, gen_length), mask)], 1)
    P, nfe = ids.shape[1], 0
    for b in range(gen_length // block_length):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        while (x[0, lo:hi] == mask).any():
            logits = model(input_ids=x, pixel_values=pv).logits[0, lo:hi].double()
            nfe += 1
            logits[:, mask] = float("-inf")
            pred = logits.argmax(-1)
            conf = logits.softmax(-1).gather(-1, pred[:, None])[:, 0]
            conf = torch.where(x[0, lo:hi] == mask, conf, torch.tensor(float("-inf"), dtype=conf.dtype))
            order = conf.argsort(descending=True)
            take = [int(order[0])] + [int(i) for i in order[1:] if conf[i] >= threshold]
            x[0, lo + torch.tensor(take)] = pred[take]
    return x[0, P:], nfe


def test_fast_dllm_rule_equals_its_twin(processor, batch):
    sharp = build_llada_v(processor).eval()
    with torch.no_grad():
        sharp.lm_head.weight.mul_(30.0)  # confidences spread over (0, 1): some slots pass, some do not
    _, rows = batch
    for threshold in (0.9, 0.5):
        for single in rows:
            out = _run(sharp, single, threshold=threshold, trace=True)
            tokens, nfe = _fast_dllm_twin(sharp, single, threshold)
            assert torch.equal(out.generated[0], tokens) and out.forwards == nfe
    assert any(len(p) > 1 for t in out.trace for p in t.positions)  # it really committed in parallel


def test_a_low_threshold_commits_in_parallel_and_ends_blocks_early(processor, batch):
    sharp = build_llada_v(processor).eval()
    with torch.no_grad():
        sharp.lm_head.weight.mul_(200.0)  # confident predictions: most slots pass the threshold at once
    enc, _ = batch
    plain = _run(sharp, enc, steps=16)
    fast = _run(sharp, enc, steps=16, threshold=0.5, trace=True)
    assert fast.forwards < plain.forwards
    assert max(len(p) for t in fast.trace for p in t.positions) > 1
    assert not (fast.generated == sharp.config.text_config.mask_token_id).any()


@pytest.mark.parametrize("kw", [{"cache": "prefix"}, {"cache": "dual"}, {"cache": "dual", "threshold": 0.2}])
def test_padded_rows_of_different_lengths_match_single_rows(vlm, batch, kw):
    enc, rows = batch
    out = _run(vlm, enc, **kw).generated
    for r, single in enumerate(rows):
        assert torch.equal(out[r], _run(vlm, single, **kw).generated[0])


def test_mps_composes_with_the_cache(vlm, batch, processor):
    enc, _ = batch
    mps = MaskPriorSuppression(k=2, lam=0.3).fit(vlm, processor.tokenizer)
    seen = []
    handle = vlm.model.language_model.layers[-1].register_forward_hook(lambda m, a, out: seen.append(out.shape[1]))
    try:
        with mps.apply(vlm):
            plain = _run(vlm, enc)
            same = _run(vlm, enc, cache="dual", refresh_every=1)
            seen.clear()
            cached = _run(vlm, enc, cache="dual")
    finally:
        handle.remove()
    assert torch.equal(plain.sequences, same.sequences)
    assert 4 in seen and not (cached.generated == processor.tokenizer.mask_token_id).any()  # block-only forwards ran


def test_bad_cache_options(vlm, batch):
    enc, _ = batch
    with pytest.raises(ValueError, match="cache must be one of"):
        _run(vlm, enc, cache="full")
    with pytest.raises(ValueError, match=r"threshold must be in \(0.0, 1.0\], got 1.5"):
        _run(vlm, enc, threshold=1.5)
    with pytest.raises(ValueError, match="needs remasking='low_confidence'"):
        _run(vlm, enc, threshold=0.9, remasking="random")
    with pytest.raises(ValueError, match="threshold_rule must be one of"):
        _run(vlm, enc, threshold=0.9, threshold_rule="fastest")
    with pytest.raises(ValueError, match="does not combine with the cache"):
        _run(vlm, enc, cache="prefix", cfg_scale=1.0)
    with pytest.raises(ValueError, match="refresh_every must be >= 1"):
        _run(vlm, enc, cache="prefix", refresh_every=0)
    with pytest.raises(TypeError, match="LLaDA takes no DynamicCache"):
        from transformers import DynamicCache

        vlm(input_ids=enc["input_ids"], pixel_values=enc["pixel_values"], cache=DynamicCache())
