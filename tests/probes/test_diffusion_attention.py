"""RoPEAttentionProbe: attention of generation slots by key kind, distance and RoPE frequency band, against
a naive reference (eager attention weights; per-pair q.k products, looped) with and without MRS."""

import pytest
import torch
from PIL import Image

from keepsight.data import chat_example
from keepsight.diffusion import MonotonicRoPEScaling, generate
from keepsight.diffusion.readings import RoPEGains
from keepsight.models import decoder_stack
from keepsight.ops.rope import apply_rotary, pair_contributions
from keepsight.probes import RoPEAttentionProbe

pytestmark = pytest.mark.usefixtures("one_thread")

KINDS = ("visual", "mask", "generated", "prompt", "self")


@pytest.fixture(scope="module")
def batch(processor):
    """Two rows: row 0 has two committed generation slots, the rest still masked; row 1 starts with a
    padding column (masked out) and has one committed slot."""
    tok = processor.tokenizer
    imgs = [Image.new("RGB", (64, 64), c) for c in ((30, 30, 220), (200, 40, 40))]
    enc = processor(images=imgs, text=[chat_example(processor, "describe the scene .")] * 2, return_tensors="pt")
    G = 12
    gen = torch.full((2, G), tok.mask_token_id)
    gen[0, 3], gen[0, 7] = tok.convert_tokens_to_ids("red"), tok.convert_tokens_to_ids("circle")
    gen[1, 5] = tok.convert_tokens_to_ids("square")
    pad = torch.full((2, 1), tok.pad_token_id)
    ids = torch.cat([pad, enc["input_ids"], gen], dim=1)
    mask = torch.ones_like(ids)
    mask[1, 0] = 0
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": enc["pixel_values"]}, ids.shape[1] - G


def _kind(ids, valid, b, i, j, P, mask_id, image_id):
    if not valid[b, j]:
        return None
    if i == j:
        return "self"
    if ids[b, j] == image_id:
        return "visual"
    if j >= P:
        return "mask" if ids[b, j] == mask_id else "generated"
    return "prompt"


def _naive(model, inputs, P, mask_id, image_id, n_bands, bin_width, queries):
    """Eager attention weights and explicit per-pair logit parts, looped over rows, queries and keys."""
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
    ids, valid = inputs["input_ids"], inputs["attention_mask"].bool()
    B, T = ids.shape
    mass = dict.fromkeys(KINDS, 0.0)
    n_queries = 0
    prob_sum, count, band_sum = {}, {}, {}
    with torch.no_grad():
        for li, a in enumerate(att):
            attn = stack.layers[li].self_attn
            hidden, (cos, sin) = seen[li]
            D = attn.head_dim
            q = apply_rotary(attn.q_proj(hidden).view(B, T, -1, D).transpose(1, 2), cos, sin)
            k = apply_rotary(attn.k_proj(hidden).view(B, T, -1, D).transpose(1, 2), cos, sin)
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            parts = pair_contributions(q, k) * attn.scaling  # [B, H, T, T, D/2]
            for b in range(B):
                for i in range(P, T):
                    if queries == "masked" and ids[b, i] != mask_id:
                        continue
                    n_queries += a.shape[1]
                    for j in range(T):
                        kind = _kind(ids, valid, b, i, j, P, mask_id, image_id)
                        if kind is None:
                            continue
                        mass[kind] += float(a[b, :, i, j].sum())
                        if kind not in ("visual", "mask"):
                            continue
                        d = (abs(i - j) - 1) // bin_width
                        key = (kind, li, d)
                        prob_sum[key] = prob_sum.get(key, 0.0) + float(a[b, :, i, j].sum())
                        count[key] = count.get(key, 0) + a.shape[1]
                        per_band = torch.zeros(parts.shape[1], n_bands)  # [H, bands]: signed sum over the band's pairs
                        for p in range(D // 2):
                            per_band[:, p * n_bands // (D // 2)] += parts[b, :, i, j, p]
                        for nb in range(n_bands):
                            band_sum[kind, nb, d] = band_sum.get((kind, nb, d), 0.0) + float(per_band[:, nb].abs().sum())
    L = len(att)
    out = {"mass": {k: v / n_queries for k, v in mass.items()}, "bins": {}, "attention": {}, "share": {}}
    for kind in ("visual", "mask"):
        bins = sorted({d for (k, _, d) in count if k == kind})
        out["bins"][kind] = [d * bin_width + 1 for d in bins]
        out["attention"][kind] = [sum(prob_sum[kind, li, d] / count[kind, li, d] for li in range(L)) / L for d in bins]
        total = {d: sum(band_sum[kind, nb, d] for nb in range(n_bands)) for d in bins}
        out["share"][kind] = [[band_sum[kind, nb, d] / total[d] for d in bins] for nb in range(n_bands)]
    return out


@pytest.mark.parametrize("beta,queries", [(0.0, "masked"), (2.0, "masked"), (0.0, "all")])
def test_probe_matches_a_naive_reference_with_and_without_mrs(vlm, processor, batch, beta, queries):
    inputs, P = batch
    tok = processor.tokenizer
    with MonotonicRoPEScaling(beta=beta).apply(vlm):
        with RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id, bin_width=4,
                                queries=queries) as probe:
            with torch.no_grad():
                logits = vlm(**inputs).logits
        ref = _naive(vlm, inputs, P, tok.mask_token_id, tok.image_token_id, 3, 4, queries)
    with torch.no_grad(), MonotonicRoPEScaling(beta=beta).apply(vlm):
        assert torch.equal(vlm(**inputs).logits, logits)  # the probe does not change the output
    res = probe.result()
    assert res["n_forwards"] == 1 and res["queries"] == queries
    for kind in KINDS:
        assert res["mass"][kind] == pytest.approx(ref["mass"][kind], rel=1e-4, abs=1e-7), kind
    assert sum(res["mass"].values()) == pytest.approx(1.0, abs=1e-5)
    for kind in ("visual", "mask"):
        prof = res["profile"][kind]
        assert prof["bins"] == ref["bins"][kind]
        assert prof["attention"] == pytest.approx(ref["attention"][kind], rel=1e-4)
        for mine, theirs in zip(prof["band_share"], ref["share"][kind], strict=True):
            assert mine == pytest.approx(theirs, rel=1e-4)
    assert res["profile"]["mask"]["bins"][0] == 1  # a neighbouring mask slot: distance 1, first bin


def test_mrs_amplitude_reading_shifts_logit_share_toward_low_frequencies(vlm, processor, batch):
    """Our amplitude reading reweights the pairs' logit parts (the released angle scaling only rotates them)."""
    inputs, P = batch
    tok = processor.tokenizer

    def share(beta):
        with RoPEGains(beta=beta, mode="amplitude").apply(vlm):
            with RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id) as probe, torch.no_grad():
                vlm(**inputs)
        return probe.result()["profile"]["visual"]["band_share_all"]

    plain, scaled = share(0.0), share(3.0)
    assert scaled[-1] > plain[-1] and scaled[0] < plain[0]  # lowest band up, highest band down


def test_probe_counts_sampler_steps_and_cleans_up(vlm, processor, batch):
    inputs, P = batch
    tok = processor.tokenizer
    prompt = {k: v[:1, :P] if k != "pixel_values" else v[:1] for k, v in inputs.items()}
    with RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id, layers=[-1], queries="all") as probe:
        generate(vlm, prompt["input_ids"], prompt["attention_mask"], prompt["pixel_values"], gen_length=8, steps=4)
        decoder_stack(vlm)(input_ids=inputs["input_ids"][:1])  # a stack-only forward is not counted
    res = probe.result()
    assert res["n_forwards"] == 4 and res["layers"] == [len(decoder_stack(vlm).layers) - 1]
    masks = res["mass_per_step"]["mask"]
    assert masks[0] > masks[-1]  # fewer masked keys each step
    assert res["mass_per_step"]["generated"][0] == 0.0  # nothing committed before the first step
    assert not vlm._forward_pre_hooks and not vlm._forward_hooks
    assert not decoder_stack(vlm).layers[-1].self_attn._forward_pre_hooks


def test_probe_bad_arguments(vlm, lm, processor, batch):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    inputs, P = batch
    tok = processor.tokenizer
    with pytest.raises(ValueError, match="out of range"):
        RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id, layers=[9])
    with pytest.raises(ValueError, match="n_bands"):
        RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id, n_bands=999)
    with pytest.raises(ValueError, match="queries"):
        RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id, queries="some")
    with pytest.raises(ValueError, match="gen_start"):
        with RoPEAttentionProbe(vlm, gen_start=10_000, mask_token_id=tok.mask_token_id), torch.no_grad():
            vlm(**inputs)
    with pytest.raises(RuntimeError, match="no forward"):
        RoPEAttentionProbe(vlm, gen_start=P, mask_token_id=tok.mask_token_id).result()
    qwen = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    with pytest.raises(TypeError, match="normalises q / k"):  # Qwen3: q/k norms before RoPE
        RoPEAttentionProbe(qwen, gen_start=2, mask_token_id=tok.mask_token_id)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_probe_on_cuda(vlm, processor, batch):  # the accumulators live on the CPU whatever the model's device
    inputs, P = batch
    model = vlm.to("cuda")
    try:
        with RoPEAttentionProbe(model, gen_start=P, mask_token_id=processor.tokenizer.mask_token_id) as probe:
            with torch.no_grad():
                model(**{k: v.to("cuda") for k, v in inputs.items()})
        assert probe.result()["n_forwards"] == 1
    finally:
        vlm.to("cpu")
