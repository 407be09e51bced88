"""Mask Prior Suppression and Monotonic RoPE Scaling (plus NTK / YaRN baselines) on tiny models."""

import dataclasses
import math

import pytest
import torch
from PIL import Image

from keepsight.data import chat_example
from keepsight.diffusion import (
    MaskPriorSuppression,
    MonotonicRoPEScaling,
    RoPEBaseline,
    lone_mask_top_tokens,
    prior_cosine,
)
from keepsight.diffusion.readings import (
    MPS_PROJECTION,
    MRS_GAINS,
    READINGS,
    ProjectionMPS,
    RoPEGains,
    real_vocab_ids,
)
from keepsight.models import decoder_stack
from keepsight.ops.rope import (
    SCHEDULES,
    apply_rotary,
    default_inv_freq,
    frequency_positions,
    pair_contributions,
    rope_gains,
    rotary_cos_sin,
    scale_rotary,
    schedule,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vlm_inputs(processor):
    img = Image.new("RGB", (64, 64), (30, 30, 220))
    text = chat_example(processor, "describe the scene .") + " <mask> <mask> <mask> <mask>"
    return processor(images=[img], text=[text], return_tensors="pt")


# ----------------------------------------------------------------------------- RoPE schedules and gains


@pytest.mark.parametrize("kind", SCHEDULES)
def test_schedules_are_monotone_from_zero_to_one(kind):
    tau = frequency_positions(64)
    s = schedule(tau, kind, eta=2.0 if kind == "power" else 8.0, tau0=0.6)
    assert float(s[0]) == pytest.approx(0.0, abs=1e-12) and float(s[-1]) == pytest.approx(1.0, abs=1e-12)
    assert (s.diff() > 0).all()  # strictly increasing in the frequency index


def test_rope_gains():
    g = rope_gains(32, beta=0.5)
    assert g.shape == (16,) and float(g[0]) == pytest.approx(1.0) and float(g[-1]) == pytest.approx(1.5)
    assert torch.equal(rope_gains(32, beta=0.0), torch.ones(16, dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule(frequency_positions(4), "step")


def test_amplitude_scaling_multiplies_each_pair_contribution_by_its_gain():
    D, T = 16, 5
    gains = rope_gains(D, beta=0.7, eta=4.0)
    cos, sin = rotary_cos_sin(torch.arange(T)[None], default_inv_freq(D))  # [1, T, D]
    q, k = torch.randn(1, 2, T, D, dtype=torch.float64), torch.randn(1, 2, T, D, dtype=torch.float64)
    plain = pair_contributions(apply_rotary(q, cos.double(), sin.double()), apply_rotary(k, cos.double(), sin.double()))
    cos2, sin2 = scale_rotary(cos.double(), sin.double(), gains)
    scaled = pair_contributions(apply_rotary(q, cos2, sin2), apply_rotary(k, cos2, sin2))  # [1, 2, T, T, D/2]
    torch.testing.assert_close(scaled, plain * gains)
    # per-token segments: a pair between a scaled and an unscaled token gets sqrt(g)
    where = torch.tensor([[True, False, True, False, False]])
    cos3, sin3 = scale_rotary(cos.double(), sin.double(), gains, where)
    seg = pair_contributions(apply_rotary(q, cos3, sin3), apply_rotary(k, cos3, sin3))
    torch.testing.assert_close(seg[..., 0, 2, :], plain[..., 0, 2, :] * gains)
    torch.testing.assert_close(seg[..., 0, 1, :], plain[..., 0, 1, :] * gains.sqrt())
    torch.testing.assert_close(seg[..., 1, 3, :], plain[..., 1, 3, :])


def test_mrs_hook_scales_the_models_rotary_output_and_is_removed(lm):
    rotary = decoder_stack(lm).rotary_emb
    x, pos = torch.zeros(1, 6, 128), torch.arange(6)[None]
    cos, sin = rotary(x, pos)  # [1, 6, 32]
    mrs = RoPEGains(beta=0.3, mode="amplitude")
    factor = torch.cat([mrs.gains(32).sqrt()] * 2).float()  # [32]
    with mrs.apply(lm):
        cos2, sin2 = rotary(x, pos)
    torch.testing.assert_close(cos2, cos * factor)
    torch.testing.assert_close(sin2, sin * factor)
    assert not rotary._forward_hooks and torch.equal(rotary(x, pos)[0], cos)


@pytest.mark.parametrize("mode", ["angle", "amplitude", "frequency"])
@pytest.mark.parametrize("segments", ["all", ["visual", "generation"]])
def test_beta_zero_is_bit_identical_on_the_vlm(vlm, vlm_inputs, mode, segments):
    base = vlm(**vlm_inputs).logits
    gen_start = vlm_inputs["input_ids"].shape[1] - 4
    def mrs(beta):  # the released angle scales, or one of our readings' gains
        return (MonotonicRoPEScaling(beta=beta, segments=segments) if mode == "angle" else
                RoPEGains(beta=beta, mode=mode, segments=segments))

    with mrs(0.0).apply(vlm, gen_start=gen_start):
        same = vlm(**vlm_inputs).logits
    assert torch.equal(same, base)
    with mrs(2.0).apply(vlm, gen_start=gen_start):
        assert not torch.allclose(vlm(**vlm_inputs).logits, base)
    assert torch.equal(vlm(**vlm_inputs).logits, base)  # restored


def test_frequency_mode_divides_inv_freq_by_the_gains(lm, vlm, vlm_inputs):
    rotary = decoder_stack(lm).rotary_emb
    original = rotary.inv_freq.clone()
    mrs = RoPEGains(beta=0.5, mode="frequency")
    with mrs.apply(lm):
        torch.testing.assert_close(rotary.inv_freq, (original.double() / mrs.gains(32)).float())
    assert torch.equal(rotary.inv_freq, original)
    # segment subset: chosen tokens get cos/sin of the slowed frequencies, the others the original ones
    rot = decoder_stack(vlm).rotary_emb
    ids = vlm_inputs["input_ids"]
    T, gen_start = ids.shape[1], ids.shape[1] - 4
    seen = []
    with RoPEGains(beta=0.5, mode="frequency", segments="generation").apply(vlm, gen_start=gen_start):
        handle = rot.register_forward_hook(lambda m, a, o: seen.append(o[0]))  # runs after the MRS hook
        try:
            vlm(**vlm_inputs)
        finally:
            handle.remove()
    slow_cos, _ = rotary_cos_sin(torch.arange(T)[None], (rot.inv_freq.double() / mrs.gains(32)).float())
    plain_cos, _ = rotary_cos_sin(torch.arange(T)[None], rot.inv_freq)
    torch.testing.assert_close(seen[0][0, gen_start:], slow_cos[0, gen_start:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(seen[0][0, :gen_start], plain_cos[0, :gen_start], atol=1e-5, rtol=1e-5)


def test_mrs_and_baselines_on_an_autoregressive_qwen3(processor):
    from transformers import Qwen3ForCausalLM

    from keepsight.world.models import get_preset, text_config

    torch.manual_seed(0)
    qwen = Qwen3ForCausalLM(text_config(get_preset("tiny-llava"), processor.tokenizer)).eval()
    ids = torch.randint(9, 150, (1, 7))
    base = qwen(ids).logits
    with MonotonicRoPEScaling(beta=0.0).apply(qwen):
        assert torch.equal(qwen(ids).logits, base)
    with MonotonicRoPEScaling(beta=0.5).apply(qwen):
        out = qwen.generate(ids, max_new_tokens=3, do_sample=False)
        assert out.shape == (1, 10) and not torch.allclose(qwen(ids).logits, base)
    rotary, D = decoder_stack(qwen).rotary_emb, 32
    original = rotary.inv_freq.clone()
    with RoPEBaseline("ntk", factor=4.0).apply(qwen):
        theta = 10000.0 * 4.0 ** (D / (D - 2))
        torch.testing.assert_close(rotary.inv_freq, default_inv_freq(D, theta))
        qwen(ids)
    with RoPEBaseline("yarn", factor=4.0).apply(qwen):
        assert rotary.attention_scaling == pytest.approx(0.1 * math.log(4.0) + 1.0)
        assert torch.equal(rotary.inv_freq[:1], original[:1]) and rotary.inv_freq[-1] < original[-1]
        qwen(ids)
    assert torch.equal(rotary.inv_freq, original) and rotary.attention_scaling == 1.0
    assert torch.equal(qwen(ids).logits, base)


def test_mrs_bad_arguments(vlm):
    with pytest.raises(ValueError, match="segments"):
        MonotonicRoPEScaling(0.1, segments=["text"])
    with pytest.raises(ValueError, match="gen_start"):
        with MonotonicRoPEScaling(0.1, segments=["generation"]).apply(vlm):
            pass


# ----------------------------------------------------------------------------- Mask Prior Suppression


def _layer_outputs_by_hand(model, e):
    """Decoder-layer outputs for embedding ``e [d]`` alone at position 0, without hooks: ``[L, d]``."""
    stack = decoder_stack(model)
    h = e[None, None]  # [1, 1, d]
    pe = stack.rotary_emb(h, torch.zeros(1, 1, dtype=torch.long))
    outs = []
    for layer in stack.layers:
        h = layer(h, attention_mask=None, position_embeddings=pe)
        outs.append(h[0, 0])
    return torch.stack(outs).detach()


def test_prior_subspace_is_the_top_pca_directions_of_the_layer_states(lm, processor):
    mps = ProjectionMPS(k=3).fit(lm, processor.tokenizer)
    U = mps.U  # [d, k]
    torch.testing.assert_close(U.T @ U, torch.eye(3), atol=1e-5, rtol=0)
    emb = lm.model.embed_tokens.weight.detach()
    ids = real_vocab_ids(processor.tokenizer, emb.shape[0])
    assert processor.tokenizer.mask_token_id not in ids.tolist() and len(ids) == len(processor.tokenizer) - 9
    states = _layer_outputs_by_hand(lm, emb[ids].mean(0))  # [L, d]
    mu = states.mean(0)
    V = torch.linalg.svd(states - mu).Vh[:3].T  # [d, 3]
    torch.testing.assert_close(mps.mu, mu, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(U @ U.T, V @ V.T, atol=1e-4, rtol=0)


@pytest.mark.parametrize("center", [False, True])
def test_suppression_removes_lam_of_the_prior_component_at_mask_slots_only(vlm, vlm_inputs, processor, center):
    lam = 0.3
    mps = ProjectionMPS(k=3, lam=lam, center=center).fit(vlm, processor.tokenizer)
    stack = decoder_stack(vlm)
    grabbed = []
    handle = stack.norm.register_forward_pre_hook(lambda m, a: grabbed.append(a[0][0].detach()))  # [T, d]
    try:
        base = vlm(**vlm_inputs).logits
        with mps.apply(vlm):
            vlm(**vlm_inputs)
        with ProjectionMPS(k=3, lam=0.0, center=center).fit(vlm,
                                                                                        processor.tokenizer).apply(vlm):
            assert torch.equal(vlm(**vlm_inputs).logits, base)  # lam = 0: bit-identical
    finally:
        handle.remove()
    before, after = grabbed[0], grabbed[1]
    masked = vlm_inputs["input_ids"][0] == processor.tokenizer.mask_token_id  # [T]
    assert int(masked.sum()) == 4
    assert torch.equal(after[~masked], before[~masked])
    U, shift = mps.U, (mps.mu if center else 0.0)
    coef_b, coef_a = (before[masked] - shift) @ U, (after[masked] - shift) @ U  # [4, k]
    torch.testing.assert_close(coef_a, (1 - lam) * coef_b, atol=1e-5, rtol=1e-5)
    rest = torch.eye(U.shape[0]) - U @ U.T
    torch.testing.assert_close(after[masked] @ rest, before[masked] @ rest, atol=1e-5, rtol=1e-5)
    assert not stack.layers[-1]._forward_hooks and not vlm._forward_pre_hooks  # removed on exit


def test_diagnostics(lm, processor):
    mps = ProjectionMPS(k=2).fit(lm, processor.tokenizer)
    inside = torch.randn(2) @ mps.U.T  # in the subspace
    outside = torch.randn(128)
    outside -= mps.U @ (mps.U.T @ outside)
    assert float(prior_cosine(inside, mps.U)) == pytest.approx(1.0, abs=1e-5)
    assert float(prior_cosine(outside, mps.U)) == pytest.approx(0.0, abs=1e-5)
    top = lone_mask_top_tokens(lm, processor.tokenizer, k=3)
    assert len(top) == 3 and top[0][1] >= top[1][1] >= top[2][1]


def test_priors_layers_and_cache(lm, processor, tmp_path, monkeypatch):
    tok = processor.tokenizer
    rnd = ProjectionMPS(k=4, prior="random", seed=1).fit(lm, tok)
    torch.testing.assert_close(rnd.U.T @ rnd.U, torch.eye(4), atol=1e-5, rtol=0)
    assert torch.equal(rnd.U, ProjectionMPS(k=4, prior="random", seed=1).fit(lm, tok).U)
    freqs = torch.zeros(len(tok))
    freqs[[20, 30, 40]] = torch.tensor([5.0, 9.0, 7.0])
    top = ProjectionMPS(prior="topk", n_prior_tokens=2).fit(lm, tok, token_frequencies=freqs)
    assert top.prior_tokens.tolist() == [30, 40]
    assert len(ProjectionMPS(prior="topk", n_prior_tokens=5).fit(lm, tok).prior_tokens) == 5
    ids = torch.tensor([[1, 20, 4, 4, 30]])
    with ProjectionMPS(layers=[0, -1], lam=0.5).fit(lm, tok).apply(lm):
        assert sum(bool(layer._forward_hooks) for layer in lm.model.layers) == 2
        lm(ids)
    assert not any(layer._forward_hooks for layer in lm.model.layers)
    first = MaskPriorSuppression(cache_dir=tmp_path).fit(lm, tok)
    assert len(list(tmp_path.glob("mps-*.safetensors"))) == 1
    import keepsight.diffusion.mps as mps_mod

    monkeypatch.setattr(mps_mod, "released_states", lambda *a: (_ for _ in ()).throw(AssertionError("recomputed")))
    again = MaskPriorSuppression(cache_dir=tmp_path).fit(lm, tok)
    assert torch.equal(again.U, first.U) and torch.equal(again.mu, first.mu) and torch.equal(again.u, first.u)


def _tokenizer_without_mask():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")


def test_mps_bad_arguments(lm, processor):
    from keepsight.models import LladaConfig, LladaForMaskedDiffusion

    with pytest.raises(ValueError, match="k = 129 exceeds the model width d = 128"):
        MaskPriorSuppression(k=129).fit(lm, processor.tokenizer)
    cfg = LladaConfig(vocab_size=3, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    with pytest.raises(ValueError, match="no mask token"):
        MaskPriorSuppression(k=1).fit(LladaForMaskedDiffusion(cfg), _tokenizer_without_mask())
    with pytest.raises(ValueError, match="out of range"):
        ProjectionMPS(layers=[7]).fit(lm, processor.tokenizer)
    with pytest.raises(ValueError, match="unexpected keyword argument 'layers'"):  # a reading's setting
        MaskPriorSuppression(layers=[1])
    with pytest.raises(ValueError, match="fit"):
        with MaskPriorSuppression().apply(lm):
            pass


def test_segment_mask_callable_matches_named_segment_and_fixes_run_inside_the_sampler(vlm, processor):
    from keepsight.diffusion import generate

    tok = processor.tokenizer
    img = Image.new("RGB", (64, 64), (200, 200, 30))
    enc = processor(images=[img], text=[chat_example(processor, "describe the scene .")], return_tensors="pt")
    mrs = MonotonicRoPEScaling(beta=1.0, segments=["visual"])
    with mrs.apply(vlm):
        named = vlm(**enc).logits
    with mrs.apply(vlm, segment_mask=lambda ids: ids == tok.image_token_id):
        assert torch.equal(vlm(**enc).logits, named)
    P = enc["input_ids"].shape[1]
    mps = MaskPriorSuppression(lam=0.5).fit(vlm, tok)
    with mps.apply(vlm), MonotonicRoPEScaling(0.2, segments=["visual", "generation"]).apply(vlm, gen_start=P):
        out = generate(vlm, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], gen_length=4, steps=2)
    assert out.generated.shape == (1, 4) and not (out.generated == tok.mask_token_id).any()
    assert not vlm._forward_pre_hooks and not decoder_stack(vlm).rotary_emb._forward_hooks


def test_with_k_below_the_rank_only_the_top_k_principal_directions_are_removed(processor):
    """An 8-layer LLaDA: the centred layer states have rank 7, so k = 2 is a real choice; checked against numpy."""
    import numpy as np

    from keepsight.world.models import build_llada_lm, get_preset

    deep = build_llada_lm(processor.tokenizer, dataclasses.replace(get_preset("tiny-llava"), text_layers=8))
    tok = processor.tokenizer
    mps = ProjectionMPS(k=2, lam=1.0).fit(deep, tok)
    emb = deep.model.embed_tokens.weight.detach()
    ids = real_vocab_ids(tok, emb.shape[0])
    assert torch.equal(mps.prior_tokens, ids)  # vocab_mean: every ordinary token, nothing else
    states = _layer_outputs_by_hand(deep, emb[ids].mean(0)).double().numpy()  # [8, d]
    centred = states - states.mean(0)
    assert np.linalg.matrix_rank(centred) == 7
    _, sv, vt = np.linalg.svd(centred, full_matrices=False)
    assert sv[1] > sv[2] * 1.0001  # the top-2 subspace is well defined
    top2, third = vt[:2].T, vt[2]
    np.testing.assert_allclose(mps.U.double().numpy() @ mps.U.double().numpy().T, top2 @ top2.T, atol=1e-4)
    h = torch.tensor(states[-1], dtype=torch.float32)[None, None]  # a hidden state with parts on every direction
    out = mps.suppress(h, torch.ones(1, 1, dtype=torch.bool))[0, 0].double().numpy()
    np.testing.assert_allclose(out @ top2, 0.0, atol=1e-3)  # lam = 1: the top-2 components are gone
    np.testing.assert_allclose(out @ third, states[-1] @ third, rtol=1e-4, atol=1e-4)  # the third is untouched


def test_mrs_refuses_a_gen_start_it_cannot_use_and_the_cached_sampler_with_column_segments(lm, processor):
    from keepsight.diffusion import generate

    prompt = processor.tokenizer(["<bos> user : describe the scene . assistant :"], return_tensors="pt")["input_ids"]
    mrs = MonotonicRoPEScaling(beta=0.5, segments=["generation"])
    for bad in (-5, 1.5, True):
        with pytest.raises(ValueError, match="gen_start must be (an integer )?>= 0"), mrs.apply(lm, gen_start=bad):
            pass
    with mrs.apply(lm, gen_start=10**6), pytest.raises(ValueError, match=r"gen_start 1000000 lies past the sequence"):
        generate(lm, prompt, gen_length=4, steps=4)
    with mrs.apply(lm, gen_start=prompt.shape[1]):
        with pytest.raises(ValueError, match="reads column indices.*use cache='none'"):
            generate(lm, prompt, gen_length=4, steps=4, cache="dual")
        generate(lm, prompt, gen_length=4, steps=4)  # uncached: fine
    assert not hasattr(lm, "_keepsight_reads_columns")  # removed on exit
    with MonotonicRoPEScaling(beta=0.5).apply(lm):  # segments "all" reads no column: the cache is fine
        generate(lm, prompt, gen_length=4, steps=4, cache="dual")


def test_flash_path_spans_scale_q_and_k_per_column(vlm, vlm_inputs):
    """MPD-PAC's flash-attention path multiplies cos and sin by 0.3 over the image tokens and by 2.0 over the last
    min(128, T - img_end) columns. RoPE is linear in q and k, so that equals scaling every layer's q_proj and k_proj
    outputs by the same per-column factors (the twin below); the sampler runs under it uncached, and a cache is
    refused."""
    from keepsight.diffusion import FlashPathSpans, generate

    spans = FlashPathSpans(span=3)  # fewer than the columns after the image: the last 3 get 2.0
    ids = vlm_inputs["input_ids"]
    image_id = vlm.config.image_token_id
    scales = spans.scales(ids, image_id)[0]
    image = (ids[0] == image_id).nonzero().flatten()
    assert torch.all(scales[image] == 0.3) and torch.all(scales[-3:] == 2.0)
    assert torch.all(scales[: int(image[0])] == 1) and torch.all(scales[int(image[-1]) + 1: -3] == 1)
    with torch.no_grad():
        plain = vlm(**vlm_inputs).logits
        with spans.apply(vlm):
            got = vlm(**vlm_inputs).logits
        assert torch.equal(vlm(**vlm_inputs).logits, plain)  # removed on exit
        factor = scales[None, :, None]

        def times(module, args, out):
            return out * factor

        handles = [m.register_forward_hook(times) for layer in decoder_stack(vlm).layers
                   for m in (layer.self_attn.q_proj, layer.self_attn.k_proj)]
        try:
            twin = vlm(**vlm_inputs).logits
        finally:
            for h in handles:
                h.remove()
    torch.testing.assert_close(got, twin, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-3)
    n = vlm_inputs["input_ids"].shape[1] - 4
    prompt, mask = vlm_inputs["input_ids"][:, :n], vlm_inputs["attention_mask"][:, :n]
    with FlashPathSpans().apply(vlm):
        generate(vlm, prompt, mask, vlm_inputs["pixel_values"], gen_length=4, steps=4)
        with pytest.raises(ValueError, match="FlashPathSpans reads column indices"):
            generate(vlm, prompt, mask, vlm_inputs["pixel_values"], gen_length=4, steps=4, cache="prefix")
    assert not ids.equal(torch.zeros_like(ids)) and spans.scales(ids[:, :3], image_id).eq(1).all()


def test_the_readings_apply_through_decoders_and_stay_outside_the_registry(lm, processor):
    from keepsight.inference import Decoders
    from keepsight.methods import METHODS

    assert not set(READINGS) & set(METHODS) and set(READINGS) == {"mps_projection", "mrs_gains"}
    tok = processor.tokenizer
    ids = torch.tensor([[tok.bos_token_id, *[tok.mask_token_id] * 6]])
    direct = ProjectionMPS(k=2, lam=0.5).fit(lm, tok)
    with direct.apply(lm):
        expected = lm(ids).logits
    decoders = Decoders([(MPS_PROJECTION, {"k": 2, "lam": 0.5}), (MRS_GAINS, {"beta": 0.0, "mode": "frequency"})],
                        family="diffusion").prepare(lm, tok)
    with decoders.applied(lm, prompt_len=1):
        assert torch.equal(lm(ids).logits, expected)  # MRS's gains at beta 0: nothing; the projection as applied alone
    assert not torch.equal(lm(ids).logits, expected)  # removed on exit
    with pytest.raises(ValueError, match="unknown method 'mps_projection'"):
        Decoders([("mps_projection", {})])
    with pytest.raises(TypeError, match="RoPEGains takes a RoPEGainsConfig, got MRSConfig"):
        RoPEGains(MonotonicRoPEScaling().config)
