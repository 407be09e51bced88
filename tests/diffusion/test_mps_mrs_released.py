"""MPS and MRS as their authors released them (github.com/hong-sujung/MPD-PAC), the defaults, pinned to references
written here from the released formulas (never from keepsight's methods). Parity with the released code itself, run
under its own transformers, is ``test_mps_mrs_reference.py``.

MRS: every RoPE angle ``position * inv_freq_i`` times ``s_i = 1 + beta * y(i / (D/2 - 1))``, both dims of a pair,
every token; the release's ramps y: linear x, power x^2, exponential (e^{4x} - 1) / (e^4 - 1), sigmoid
sig(eta (x - tau0)) (not rescaled), cosine (1 - cos(pi x)) / 2.

MPS: the mean of every input-embedding row, alone at position 0; the stack of the outputs of layers 1 .. L-1 and the
final norm's output; mu, the top-k right singular vectors V (k clamped), u = normalize((h_L - mu) V); at each forward,
on the final norm's output at mask slots: h - lam * clamp(cos(z, u), 0, 1) * (z.u) V u, z = (h - mu) V.
"""

from __future__ import annotations

import math

import pytest
import torch

from keepsight.diffusion import MaskPriorSuppression, MonotonicRoPEScaling, MPSConfig, MRSConfig, generate
from keepsight.models.arch import decoder_stack


def released_scale(D: int, beta: float, kind: str, eta: float = 8.0, tau0: float = 0.6) -> torch.Tensor:
    half = D // 2
    out = []
    for i in range(half):
        x = i / (half - 1)
        y = {"linear": x, "power": x**2, "exponential": (math.exp(4 * x) - 1) / (math.exp(4) - 1),
             "sigmoid": 1 / (1 + math.exp(-eta * (x - tau0))), "cosine": 0.5 * (1 - math.cos(math.pi * x))}[kind]
        out.append(1 + beta * y)
    return torch.tensor(out + out, dtype=torch.float64)  # both halves of each pair


@pytest.mark.parametrize("kind", ["sigmoid", "cosine", "exponential", "linear", "power"])
def test_mrs_multiplies_every_angle_by_the_released_scale(lm, kind):
    rotary = decoder_stack(lm).rotary_emb
    x, pos = torch.zeros(1, 9, 128), torch.arange(9)[None] * 7  # positions up to 56
    mrs = MonotonicRoPEScaling(beta=0.4, schedule=kind)
    with mrs.apply(lm):
        cos, sin = rotary(x, pos)  # [1, 9, 32]
    inv = rotary.inv_freq.double()  # [16]
    angles = pos[0, :, None].double() * torch.cat([inv, inv])[None] * released_scale(32, 0.4, kind)[None]  # [9, 32]
    torch.testing.assert_close(cos[0].double(), angles.cos(), atol=1e-5, rtol=0)  # fp32 angles up to 60 rad
    torch.testing.assert_close(sin[0].double(), angles.sin(), atol=1e-5, rtol=0)


def test_mrs_defaults_are_the_released_llada_v_settings_and_a_lavida_preset():
    cfg = MRSConfig()
    assert (cfg.beta, cfg.eta, cfg.tau0, cfg.schedule, cfg.segments) == (0.01, 8.0, 0.6, "sigmoid", "all")
    assert MRSConfig.lavida().eta == 12.0 and MPSConfig.lavida().lam == 0.3
    scales = MonotonicRoPEScaling().gains(128)
    assert scales[0] == pytest.approx(1 + 0.01 / (1 + math.exp(8 * 0.6)))  # y(0) > 0: the ramp is not rescaled
    assert scales[-1] == pytest.approx(1 + 0.01 / (1 + math.exp(-8 * 0.4)))


def released_fit(model, k: int):
    """The released fit, by hand: every embedding row's mean alone at position 0, layer by layer."""
    stack = decoder_stack(model)
    e = stack.embed_tokens.weight.detach().mean(0)
    h = e[None, None]  # [1, 1, d]
    pe = stack.rotary_emb(h, torch.zeros(1, 1, dtype=torch.long))
    rows = []
    for layer in stack.layers:
        h = layer(h, attention_mask=None, position_embeddings=pe)
        rows.append(h[0, 0])
    rows[-1] = stack.norm(h)[0, 0]  # hidden_states[1:]: layers 1 .. L-1, then the final norm's output
    H = torch.stack(rows).detach().double()  # [L, d]
    mu = H.mean(0)
    V = torch.linalg.svd(H - mu, full_matrices=False).Vh[:min(k, H.shape[0])].T  # [d, k]
    u = (H[-1] - mu) @ V
    return mu, V, u / u.norm()


@pytest.mark.parametrize("k", [3, 9])
def test_mps_fit_is_the_released_subspace(lm, processor, k):
    mps = MaskPriorSuppression(k=k).fit(lm, processor.tokenizer)
    mu, V, u = released_fit(lm, k)
    kk = min(k, len(lm.model.layers))  # 4 layers: k = 9 is clamped to 4 as released
    assert mps.U.shape == (128, kk) and mps.u.shape == (kk,)
    torch.testing.assert_close(mps.mu.double(), mu, atol=1e-5, rtol=1e-5)
    r = min(kk, len(lm.model.layers) - 1)  # the centred stack has rank L - 1: a 4th direction is arbitrary
    signs = torch.sign((mps.U.double()[:, :r] * V[:, :r]).sum(0))  # singular vectors are defined up to sign
    torch.testing.assert_close(mps.U.double()[:, :r] * signs, V[:, :r], atol=1e-4, rtol=0)
    torch.testing.assert_close(mps.u.double()[:r] * signs, u[:r], atol=1e-4, rtol=0)
    assert all(abs(float(x)) < 1e-3 for x in mps.u[r:])  # h_L - mu lies in the span of the rank directions


@pytest.fixture(scope="module")
def vlm_inputs(processor):
    from PIL import Image

    from keepsight.data import chat_example

    text = chat_example(processor, "describe the scene .") + " <mask> <mask> <mask> <mask>"
    return processor(images=[Image.new("RGB", (64, 64), (30, 30, 220))], text=[text], return_tensors="pt")


def released_update(h, mask, mu, V, u, lam):
    """The released per-step update of the final normed states h [T, d] at mask slots, in float64."""
    h, mu, V, u = (t.double() for t in (h, mu, V, u))
    out = h.clone()
    for t in range(h.shape[0]):
        if not mask[t]:
            continue
        z = (h[t] - mu) @ V
        s = float(z @ u)
        cos = min(max(s / (float(z.norm()) + 1e-6), 0.0), 1.0)
        out[t] = h[t] - lam * cos * s * (V @ u)
    return out


def test_mps_update_on_the_lm_head_input_at_mask_slots(vlm, vlm_inputs, processor):
    lam = 0.7
    mps = MaskPriorSuppression(lam=lam).fit(vlm, processor.tokenizer)
    stack = decoder_stack(vlm)
    seen = []
    handle = vlm.lm_head.register_forward_pre_hook(lambda m, a: seen.append(a[0][0].detach()))  # the head's input
    mask = vlm_inputs["input_ids"][0] == processor.tokenizer.mask_token_id
    try:
        with torch.no_grad():
            base = vlm(**vlm_inputs).logits
            # the gate acts only where z.u > 0; in this random model the slots may all point away from the prior,
            # then u's sign is flipped (the reference below reads the same u)
            if float(((seen[0][mask] - mps.mu) @ mps.U @ mps.u).max()) <= 0:
                mps.u = -mps.u
            with mps.apply(vlm):
                logits = vlm(**vlm_inputs).logits
            with MaskPriorSuppression(lam=0.0).fit(vlm, processor.tokenizer).apply(vlm):
                assert torch.equal(vlm(**vlm_inputs).logits, base)  # lam = 0: bit-identical
    finally:
        handle.remove()
    before, after = seen[0], seen[1]
    assert int(mask.sum()) == 4 and torch.equal(after[~mask], before[~mask])
    want = released_update(before, mask, mps.mu, mps.U, mps.u, lam)
    torch.testing.assert_close(after.double(), want, atol=1e-5, rtol=1e-5)
    assert (after[mask] - before[mask]).abs().max() > 1e-4  # it did act
    torch.testing.assert_close(logits[0], vlm.lm_head(after), atol=1e-5, rtol=1e-5)
    assert not stack.norm._forward_hooks  # removed on exit


def test_released_fixes_are_batched_and_compose_with_the_cached_sampler(vlm, processor):
    """Padded rows equal single rows with MPS + MRS on, and lam = 0 / beta = 0 is the plain sampler bit for bit, for
    the plain and the block-cached samplers (the released code runs batch size 1 only)."""
    from PIL import Image

    from keepsight.data import chat_example

    tok = processor.tokenizer
    imgs = [Image.new("RGB", (64, 64), c) for c in ((200, 30, 30), (30, 30, 200))]
    texts = [chat_example(processor, "describe the scene ."), chat_example(processor, "what is here ?")]
    old, tok.padding_side = tok.padding_side, "left"
    try:
        enc = processor(images=imgs, text=texts, return_tensors="pt", padding=True)
    finally:
        tok.padding_side = old
    mps = MaskPriorSuppression(lam=0.5).fit(vlm, tok)
    mrs = MonotonicRoPEScaling(beta=0.5)
    kw = dict(gen_length=8, steps=4, block_length=4)
    for cache in ("none", "dual"):
        plain = generate(vlm, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], cache=cache, **kw)
        zero_mps = MaskPriorSuppression(lam=0.0).fit(vlm, tok)
        with zero_mps.apply(vlm), MonotonicRoPEScaling(beta=0.0).apply(vlm):
            same = generate(vlm, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], cache=cache, **kw)
        assert torch.equal(same.sequences, plain.sequences)
        with mps.apply(vlm), mrs.apply(vlm):
            both = generate(vlm, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], cache=cache, **kw)
            for r in range(2):
                keep = enc["attention_mask"][r].bool()
                one = generate(vlm, enc["input_ids"][r:r + 1, keep], None, enc["pixel_values"][r:r + 1], cache=cache,
                               **kw)
                assert torch.equal(one.generated, both.generated[r:r + 1])
