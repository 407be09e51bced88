"""LLaDA-style masked-diffusion sampler on a tiny Llada LM and a tiny LLaVA-with-Llada VLM."""

import pytest
import torch
from PIL import Image

from keepsight.data import chat_example
from keepsight.diffusion import (
    generate,
    guided_logits,
    resolve_mask_token_id,
    transfer_schedule,
)
from keepsight.models import LladaConfig, LladaForMaskedDiffusion
from keepsight.world.models import build_llada_v

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def prompt(processor):
    return processor.tokenizer(["<bos> user : describe the scene . assistant :"], return_tensors="pt")["input_ids"]


def _calls(model):
    """Record the kwargs of every top-level forward of ``model``."""
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: calls.append(dict(kw)), with_kwargs=True)
    return calls, handle


def test_transfer_schedule_is_even_and_sums_to_the_masked_count():
    sched = transfer_schedule(torch.tensor([7, 4, 0]), 3)
    assert sched.tolist() == [[3, 2, 2], [2, 1, 1], [0, 0, 0]]


def test_one_token_per_step_in_confidence_order(lm, prompt):
    mask_id = lm.config.mask_token_id
    G = 6
    out = generate(lm, prompt, gen_length=G, steps=G, trace=True)
    P = prompt.shape[1]
    assert out.sequences.shape == (1, P + G) and out.generated.shape == (1, G)
    assert not (out.generated == mask_id).any()
    assert [len(s.positions[0]) for s in out.trace] == [1] * G
    assert [s.n_masked[0] for s in out.trace] == list(range(G - 1, -1, -1))
    order = [s.positions[0][0] for s in out.trace]
    assert sorted(order) == list(range(P, P + G))
    # replay: before step s the slots committed at steps >= s are masked; the committed slot is the most
    # confident masked slot, and its token is the argmax (mask token excluded)
    for s, rec in enumerate(out.trace):
        x = out.sequences.clone()
        x[0, order[s:]] = mask_id
        logits = lm(x).logits[0].detach().double()  # [T, V]
        logits[:, mask_id] = float("-inf")
        probs = logits.softmax(-1)
        conf, tok = probs.max(-1)  # [T]
        masked = torch.tensor(order[s:])
        assert order[s] == int(masked[conf[masked].argmax()])
        assert rec.tokens[0][0] == int(tok[order[s]])
        assert rec.confidences[0][0] == pytest.approx(float(conf[order[s]]), rel=1e-9)


def test_blocks_are_decoded_left_to_right(lm, prompt):
    P = prompt.shape[1]
    out = generate(lm, prompt, gen_length=6, steps=3, block_length=2, trace=True)
    assert [rec.block for rec in out.trace] == [0, 1, 2]
    for b, rec in enumerate(out.trace):
        assert sorted(rec.positions[0]) == [P + 2 * b, P + 2 * b + 1]  # 2 tokens per step, inside block b


def test_outputs_depend_only_on_the_generator(lm, prompt):
    kw = dict(gen_length=8, steps=4, temperature=1.0, remasking="random")
    torch.manual_seed(1)
    a = generate(lm, prompt, generator=torch.Generator().manual_seed(3), **kw).sequences
    torch.manual_seed(2)
    b = generate(lm, prompt, generator=torch.Generator().manual_seed(3), **kw).sequences
    c = generate(lm, prompt, generator=torch.Generator().manual_seed(4), **kw).sequences
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_cfg_zero_is_no_guidance_and_cfg_masks_the_prompt(lm, prompt):
    calls, handle = _calls(lm)
    try:
        plain = generate(lm, prompt, gen_length=4, steps=2).sequences
        assert len(calls) == 2
        calls.clear()
        zero = generate(lm, prompt, gen_length=4, steps=2, cfg_scale=0.0).sequences
        assert len(calls) == 2 and torch.equal(plain, zero)
        calls.clear()
        generate(lm, prompt, gen_length=4, steps=2, cfg_scale=1.5)
    finally:
        handle.remove()
    assert len(calls) == 4  # conditional + unconditional per step
    uncond = calls[1]["input_ids"]
    assert (uncond[0, : prompt.shape[1]] == lm.config.mask_token_id).all()
    cond, unc = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    torch.testing.assert_close(guided_logits(cond, unc, 0.0), cond)
    torch.testing.assert_close(guided_logits(cond, unc, 1.0), 2 * cond - unc)


def test_suppressed_tokens_never_appear(lm, prompt):
    free = generate(lm, prompt, gen_length=6, steps=3).generated
    banned = sorted(set(free.flatten().tolist()))
    out = generate(lm, prompt, gen_length=6, steps=3, suppress_token_ids=banned).generated
    assert not set(out.flatten().tolist()) & set(banned)


def test_padded_batch_matches_single_rows(lm, processor):
    tok = processor.tokenizer
    texts = ["<bos> user : describe the scene . assistant :", "<bos> user : is there a red circle ? assistant :"]
    batch = tok(texts, return_tensors="pt", padding=True)
    out = generate(lm, batch["input_ids"], batch["attention_mask"], gen_length=4, steps=4).generated
    for r, text in enumerate(texts):
        single = generate(lm, tok([text], return_tensors="pt")["input_ids"], gen_length=4, steps=4).generated
        assert torch.equal(out[r], single[0])


def test_vlm_gets_pixel_values_on_every_conditional_forward(processor):
    vlm = build_llada_v(processor)
    img = Image.new("RGB", (64, 64), (20, 200, 30))
    enc = processor(images=[img], text=[chat_example(processor, "describe the scene .")], return_tensors="pt")
    calls, handle = _calls(vlm)
    try:
        out = generate(vlm, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], gen_length=4, steps=2,
                       cfg_scale=1.0)
    finally:
        handle.remove()
    assert out.generated.shape == (1, 4)
    assert ["pixel_values" in c for c in calls] == [True, False, True, False]  # uncond: image tokens masked
    assert not (calls[1]["input_ids"] == processor.tokenizer.image_token_id).any()


def _tokenizer_without_mask():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")


def test_bad_inputs_raise_clear_errors(lm, prompt):
    with pytest.raises(ValueError, match="no mask token"):
        resolve_mask_token_id(tokenizer=_tokenizer_without_mask())
    cfg = LladaConfig(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(ValueError, match="no mask token"):
        generate(LladaForMaskedDiffusion(cfg), torch.tensor([[1, 2]]), gen_length=2, steps=2)
    with pytest.raises(ValueError, match="gen_length must be >= 1, got 0"):
        generate(lm, prompt, gen_length=0, steps=1)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        generate(lm, prompt, gen_length=4, steps=0)
    with pytest.raises(ValueError, match="block_length 3 .* gen_length 8"):
        generate(lm, prompt, gen_length=8, steps=4, block_length=3)
    with pytest.raises(ValueError, match="steps 3 must be divisible by the number of blocks 2"):
        generate(lm, prompt, gen_length=8, steps=3, block_length=4)
    with pytest.raises(ValueError, match="remasking"):
        generate(lm, prompt, gen_length=4, steps=2, remasking="entropy")


def test_the_sampler_takes_one_config_or_its_fields_as_keywords(lm, prompt):
    from keepsight.diffusion import SamplerConfig

    cfg = SamplerConfig(gen_length=8, steps=4, block_length=4, temperature=1.0, remasking="random")
    assert (cfg.block_length, cfg.n_blocks, cfg.steps_per_block, cfg.until_done) == (4, 2, 2, False)
    by_config = generate(lm, prompt, config=cfg, generator=torch.Generator().manual_seed(3)).sequences
    by_keywords = generate(lm, prompt, gen_length=8, steps=4, block_length=4, temperature=1.0, remasking="random",
                           generator=torch.Generator().manual_seed(3)).sequences
    assert torch.equal(by_config, by_keywords)
    greedy = generate(lm, prompt, config=cfg, temperature=0.0, remasking="low_confidence").sequences  # overrides
    assert torch.equal(greedy, generate(lm, prompt, gen_length=8, steps=4, block_length=4).sequences)
    assert SamplerConfig(gen_length=8, steps=8).block_length == 8  # one block by default
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['temprature'\]"):
        generate(lm, prompt, config=cfg, temprature=1.0)
    with pytest.raises(ValueError, match="block_length 3 must be >= 1 and divide gen_length 8"):
        SamplerConfig(gen_length=8, steps=4, block_length=3)
    with pytest.raises(ValueError, match="does not combine with the cache"):
        SamplerConfig(gen_length=8, steps=8, cfg_scale=1.0, cache="prefix")
    with pytest.raises(AttributeError):
        cfg.steps = 2  # frozen: a config is a value


def test_a_noise_schedule_commits_its_counts_step_by_step(lm, prompt):
    """``schedule="shift"`` (LaViDa's): the block's slots per step are ``transfer_schedule``'s, every row summing to
    the block; shift 3 commits few slots first, the COCO setting's 0.33 many (the release's counts are pinned by
    tests/models/test_lavida_reference.py)."""
    for shift, first_fewer in ((3.0, True), (0.33, False)):
        counts = transfer_schedule(torch.tensor([16]), 8, "shift", shift)[0].tolist()
        assert sum(counts) == 16 and min(counts) >= 1 and (counts[0] < counts[-1]) == first_fewer
        out = generate(lm, prompt, gen_length=16, steps=8, schedule="shift", shift=shift, trace=True)
        assert [len(rec.positions[0]) for rec in out.trace] == counts
    assert transfer_schedule(torch.tensor([9]), 9, "logit_normal").tolist() == [[1] * 9]  # one a step at steps = n


def test_with_ban_mask_off_the_mask_competes_and_a_slot_that_predicts_it_stays_masked(lm, prompt):
    """``ban_mask=False`` (the released samplers): where the mask token is the argmax, the committed slot stays
    masked; the confidence is the softmax over every token, the mask's included."""
    mask_id = lm.config.mask_token_id
    # the mask's logit made the largest at every position
    hook = lm.register_forward_hook(lambda m, a, out: out.logits.__setitem__((..., mask_id), out.logits.max() + 1.0))
    try:
        kept = generate(lm, prompt, gen_length=4, steps=4, ban_mask=False, trace=True)
        banned = generate(lm, prompt, gen_length=4, steps=4, trace=True)
    finally:
        hook.remove()
    assert (kept.generated == mask_id).all() and [rec.n_masked[0] for rec in kept.trace] == [4, 4, 4, 4]
    assert not (banned.generated == mask_id).any()
    with pytest.raises(ValueError, match="ban_mask=False lets a step commit the mask"):
        generate(lm, prompt, gen_length=4, steps=4, ban_mask=False, threshold=0.9)
    with pytest.raises(ValueError, match="ban_mask must be true or false"):
        generate(lm, prompt, gen_length=4, steps=4, ban_mask="no")
    with pytest.raises(ValueError, match="schedule must be one of"):
        generate(lm, prompt, gen_length=4, steps=4, schedule="sigmoid")
    with pytest.raises(ValueError, match="shift must be > 0"):
        generate(lm, prompt, gen_length=4, steps=4, schedule="shift", shift=0.0)
    with pytest.raises(ValueError, match="threshold_rule 'fast-dllm' sets none"):
        generate(lm, prompt, gen_length=4, steps=4, schedule="shift", threshold=0.9)
