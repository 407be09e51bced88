"""RoPEAttentionProbe: attention of generation slots by key kind, distance and RoPE frequency band, against
a naive reference (eager attention weights; per-pair q.k products) with and without MRS."""

import pytest
import torch
from PIL import Image

from keepsight.diffusion import MonotonicRoPEScaling, RoPEAttentionProbe, decoder_stack, generate
from keepsight.ops.rope import apply_rotary, pair_contributions
from keepsight.world.data import chat_example

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batch(processor):
    """Two rows, the first with two committed generation slots, the rest still masked."""
    tok = processor.tokenizer
    imgs = [Image.new("RGB", (64, 64), c) for c in ((30, 30, 220), (200, 40, 40))]
    enc = processor(images=imgs, text=[chat_example(processor, "describe the scene .")] * 2, return_tensors="pt")
    P, G = enc["input_ids"].shape[1], 12
    gen = torch.full((2, G), tok.mask_token_id)
    gen[0, 3], gen[0, 7] = tok.convert_tokens_to_ids("red"), tok.convert_tokens_to_ids("circle")
    ids = torch.cat([enc["input_ids"], gen], dim=1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": enc["pixel_values"]}, P


def _naive(model, inputs, P, mask_id, image_id, n_bands, bin_width):
    """Reference: eager attention weights and explicit per-pair logit parts, looped per layer / kind."""
    stack = decoder_stack(model)
    seen = {}

    def keep(i):
        def hook(module, args, kwargs):
            seen[i] = (kwargs["hidden_states"], kwargs["position_embeddings"])
        return hook

    handles = [layer.self_attn.register_forward_pre_hook(keep(i), with_kwargs=True)
               for i, layer in enumerate(stack.layers)]
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            att = model(**inputs, output_attentions=True).attentions  # L x [B, H, T, T]
    finally:
        model.set_attn_implementation("sdpa")
        for h in handles:
            h.remove()
    ids = inputs["input_ids"]
    B, T = ids.shape
    out = {"mass": {}, "attention": {}, "share": {}}
    for kind in ("visual", "mask"):
        prob_sum, count, band_sum = {}, {}, {}
        for layer_i, a in enumerate(att):
            attn = stack.layers[layer_i].self_attn
            hidden, (cos, sin) = seen[layer_i]
            D = attn.head_dim
            q = apply_rotary(attn.q_proj(hidden).view(B, T, -1, D).transpose(1, 2), cos, sin)
            k = apply_rotary(attn.k_proj(hidden).view(B, T, -1, D).transpose(1, 2), cos, sin)
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            parts = pair_contributions(q, k) * attn.scaling  # [B, H, T, T, D/2]
            for b in range(B):
                for i in range(P, T):
                    for j in range(T):
                        ok = ids[b, j] == image_id if kind == "visual" else (ids[b, j] == mask_id and j >= P and j != i)
                        if not ok:
                            continue
                        d = (abs(i - j) - 1) // bin_width
                        prob_sum[layer_i, d] = prob_sum.get((layer_i, d), 0.0) + float(a[b, :, i, j].sum())
                        count[layer_i, d] = count.get((layer_i, d), 0) + a.shape[1]
                        per_band = torch.zeros(parts.shape[1], n_bands)  # [H, bands]: signed sum of the band's pairs
                        for p in range(D // 2):
                            per_band[:, p * n_bands // (D // 2)] += parts[b, :, i, j, p].detach()
                        for nb in range(n_bands):
                            band_sum[nb, d] = band_sum.get((nb, d), 0.0) + float(per_band[:, nb].abs().sum())
        bins = sorted({d for _, d in count})
        L = len(att)
        out["attention"][kind] = [sum(prob_sum[li, d] / count[li, d] for li in range(L)) / L for d in bins]
        out["share"][kind] = [[band_sum.get((nb, d), 0.0) / sum(band_sum.get((x, d), 0.0) for x in range(n_bands))
                               for d in bins] for nb in range(n_bands)]
    vis = (ids == image_id)[:, None, :]
    out["mass"]["visual"] = float(sum((a[:, :, P:] * vis[:, :, None]).sum() for a in att)
                                  / (len(att) * B * a.shape[1] * (T - P)))
    return out


@pytest.mark.parametrize("beta", [0.0, 2.0])
def test_probe_matches_a_naive_reference_with_and_without_mrs(vlm, processor, batch, beta):
    inputs, P = batch
    tok = processor.tokenizer
    with MonotonicRoPEScaling(beta=beta).apply(vlm):
        with RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id, bin_width=4) as probe:
            with torch.no_grad():
                logits = vlm(**inputs).logits
        ref = _naive(vlm, inputs, P, tok.mask_token_id, tok.image_token_id, n_bands=3, bin_width=4)
    with torch.no_grad(), MonotonicRoPEScaling(beta=beta).apply(vlm):
        assert torch.equal(vlm(**inputs).logits, logits)  # the probe does not change the output
    res = probe.result()
    assert res["n_forwards"] == 1
    assert res["mass"]["visual"] == pytest.approx(ref["mass"]["visual"], rel=1e-4)
    assert sum(res["mass"].values()) == pytest.approx(1.0, abs=1e-5)  # every key is of exactly one kind or self
    for kind in ("visual", "mask"):
        assert res["profile"][kind]["attention"] == pytest.approx(ref["attention"][kind], rel=1e-4)
        for mine, theirs in zip(res["profile"][kind]["band_share"], ref["share"][kind]):
            assert mine == pytest.approx(theirs, rel=1e-4)


def test_mrs_shifts_logit_share_toward_low_frequencies(vlm, processor, batch):
    inputs, P = batch
    tok = processor.tokenizer

    def share(beta):
        with MonotonicRoPEScaling(beta=beta).apply(vlm):
            with RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id) as probe, torch.no_grad():
                vlm(**inputs)
        return probe.result()["profile"]["visual"]["band_share_all"]

    plain, scaled = share(0.0), share(3.0)
    assert scaled[-1] > plain[-1] and scaled[0] < plain[0]  # lowest band up, highest band down


def test_probe_counts_sampler_steps_and_cleans_up(vlm, processor, batch):
    inputs, P = batch
    tok = processor.tokenizer
    prompt = {k: v[:1, :P] if k != "pixel_values" else v[:1] for k, v in inputs.items()}
    with RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id, layers=[-1]) as probe:
        generate(vlm, prompt["input_ids"], prompt["attention_mask"], prompt["pixel_values"], gen_length=8, steps=4)
    res = probe.result()
    assert res["n_forwards"] == 4 and res["layers"] == [len(decoder_stack(vlm).layers) - 1]
    masks = res["mass_per_step"]["mask"]
    assert masks[0] > masks[-1]  # fewer masked keys each step
    assert res["mass_per_step"]["generated"][0] == 0.0  # nothing committed before the first step
    assert not vlm._forward_pre_hooks and not vlm._forward_hooks
    assert not decoder_stack(vlm).layers[-1].self_attn._forward_pre_hooks


def test_probe_bad_arguments(vlm, processor, batch):
    inputs, P = batch
    tok = processor.tokenizer
    with pytest.raises(ValueError, match="out of range"):
        RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id, layers=[9])
    with pytest.raises(ValueError, match="n_bands"):
        RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id, n_bands=999)
    with pytest.raises(ValueError, match="gen_start"):
        with RoPEAttentionProbe(vlm, gen_start=10_000, mask_token_id=tok.mask_token_id), torch.no_grad():
            vlm(**inputs)
    with pytest.raises(RuntimeError, match="no forward"):
        RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id).result()
