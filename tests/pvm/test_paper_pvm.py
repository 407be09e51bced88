"""Persistent Visual Memory's branch variant (our earlier reading) pinned to the paper (Sec. 4.1 "PVM Computation").

The reference is written here from the paper's three stages, never from ``PVMBranch.retrieve``:

    Projection   x_lat = W_down x            V_lat = W_down V   (shared W_down; option: a separate W_down_v)
    Retrieval    r = softmax(x_lat V_lat^T / sqrt(d'_h)) V_lat   per head, over the M visual tokens only
    Restoration  h_pvm = W_up r;   FFN(x) + lambda * mask * h_pvm   (mask = 0 at visual positions)

V is "the features of the fixed visual set" (Sec. 4.1): the visual embeddings as the projector / merger
produced them and as they were inserted into the LLM input - not a layer's own hidden states at visual
positions (which on Qwen3-VL also carry the "deepstack" features added in early decoder layers).

Tests:
- test_branch_equals_paper_formula: PVMBranch output == ``pvm_reference`` (heads, shared / separate W_down,
  scalar / channel gate, padded visual mask, a row with no visual token, silenced positions).
- test_v_is_the_projector_output / test_v_is_reused_unchanged_on_every_decode_step /
  test_ffn_output_gets_gate_mask_h: on tiny LLaVA, Qwen3-VL and Qwen2.5-VL with PVM attached and non-zero
  gates, through ``model.generate`` (a prefill and cached decode steps).
"""

from __future__ import annotations

import math

import pytest
import torch
from test_probes import PRESETS, PROMPTS, tiny_inputs

from keepsight.pvm import attach_pvm, pvm_memory
from keepsight.pvm.readings import BranchConfig, PVMBranch
from keepsight.world.models import build_model


def pvm_reference(x, V, visual_mask, text_mask, W_down, W_down_v, W_up, gate, heads, v_norm_weight=None, W_key=None,
                  temperature=1.0):
    """The paper's PVM output lambda * mask * h_pvm, in float64, one row and one head at a time.

    x [B, T, d] hidden states entering the FFN; V [B, M, d] visual embeddings (padded);
    visual_mask [B, M] bool (True = a real visual token); text_mask [B, T] (0 = no PVM output here);
    W_down [d', d]; W_down_v [d', d] or None (None = the shared W_down, the paper's choice);
    W_up [d, d']; gate: lambda, [1] or [d]; heads: d' is split into ``heads`` blocks of d'_h = d' / heads.
    A row with no visual token gets 0. Returns [B, T, d].
    Our readings: ``v_norm_weight`` [d]: V is RMS-normalised (eps 1e-6) and scaled by it before any
    projection; ``W_key`` [d', d]: the keys are W_key V instead of V_lat; ``temperature``: the logits are
    divided by sqrt(d'_h) * temperature.
    """
    x, V, W_down, W_up, gate = (t.detach().double() for t in (x, V, W_down, W_up, gate))
    W_down_v = W_down if W_down_v is None else W_down_v.detach().double()
    if v_norm_weight is not None:
        rms = torch.sqrt((V * V).mean(-1, keepdim=True) + 1e-6)  # [B, M, 1]
        V = V / rms * v_norm_weight.detach().double()
    B, T, d = x.shape
    d_lat = W_down.shape[0]
    dh = d_lat // heads
    out = torch.zeros(B, T, d, dtype=torch.float64)
    for b in range(B):
        vis = V[b][visual_mask[b].bool()]  # [M_b, d]: only the real visual tokens of this row
        if vis.shape[0] == 0:
            continue  # nothing to retrieve from: the branch adds nothing
        x_lat = torch.einsum("ld,td->tl", W_down, x[b])  # [T, d']    x_lat = W_down x
        v_lat = torch.einsum("ld,md->ml", W_down_v, vis)  # [M_b, d']  V_lat = W_down V (keys and values)
        k_lat = v_lat if W_key is None else torch.einsum("ld,md->ml", W_key.detach().double(), vis)  # [M_b, d']
        r = torch.zeros(T, d_lat, dtype=torch.float64)  # [T, d']
        for h in range(heads):
            cols = slice(h * dh, (h + 1) * dh)
            scores = torch.einsum("tc,mc->tm", x_lat[:, cols], k_lat[:, cols]) / (math.sqrt(dh) * temperature)
            w = torch.exp(scores - scores.max(dim=1, keepdim=True).values)
            w = w / w.sum(dim=1, keepdim=True)  # softmax over the visual tokens of this row only
            r[:, cols] = torch.einsum("tm,mc->tc", w, v_lat[:, cols])  # [T, d'_h]
        h_pvm = torch.einsum("dl,tl->td", W_up, r)  # [T, d]     h_pvm = W_up r
        out[b] = gate * text_mask[b].double()[:, None] * h_pvm  # lambda * mask * h_pvm
    return out


def _weights(branch: PVMBranch):
    """The branch's weight tensors (read directly, no module method is called)."""
    return dict(W_down=branch.down.weight, W_down_v=None if branch.down_v is None else branch.down_v.weight,
                W_up=branch.up.weight, gate=branch.gate, heads=branch.heads,
                v_norm_weight=None if branch.v_norm is None else branch.v_norm.weight,
                W_key=None if branch.key is None else branch.key.weight, temperature=branch.temperature)


# ----------------------------------------------------------------------------- the branch alone


OPTIONS = [dict(), dict(normalize_v="rms"), dict(key_proj=True), dict(temperature=0.5),
           dict(normalize_v="rms", key_proj=True, temperature=2.0)]


@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("shared_down", [True, False])
@pytest.mark.parametrize("gate", ["scalar", "channel"])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_branch_equals_paper_formula(heads, shared_down, gate, options):
    torch.manual_seed(heads)
    d, d_lat, T, M = 24, 16, 7, 6
    cfg = BranchConfig(pvm_hidden_size=d_lat, heads=heads, shared_down=shared_down, gate=gate, **options)
    branch = PVMBranch(d, cfg).double()
    with torch.no_grad():
        branch.gate.copy_(torch.randn_like(branch.gate) + 0.5)  # random, non-zero lambda
        for lin in (branch.down, branch.up, branch.down_v, branch.key):
            if lin is not None:
                lin.weight.mul_(3.0)  # peaked retrieval weights: a wrong scale or softmax axis shows
        if branch.v_norm is not None:
            branch.v_norm.weight.copy_(torch.rand(d) + 0.5)  # a learned scale that is not 1
    x = torch.randn(3, T, d, dtype=torch.float64)  # [B, T, d]
    V = torch.randn(3, M, d, dtype=torch.float64)  # [B, M, d]
    visual_mask = torch.zeros(3, M, dtype=torch.bool)  # [B, M]: 6, 2 and 0 visual tokens
    visual_mask[0, :] = True
    visual_mask[1, :2] = True
    V[1, 2:] = 1e3  # padding slots hold garbage: a retrieval that reads them is far off
    text_mask = torch.ones(3, T, dtype=torch.bool)  # [B, T]
    text_mask[0, :3] = False  # e.g. the image-token positions of row 0
    text_mask[1, 5] = False

    with torch.no_grad():
        out = branch(x, V, visual_mask, text_mask)  # [B, T, d]
    ref = pvm_reference(x, V, visual_mask, text_mask, **_weights(branch))
    # Fails if: the softmax ran over text or padding slots, the scale were sqrt(d') instead of sqrt(d'_h)
    # (heads > 1), V were the keys but not the values, W_down were not shared (or W_down_v ignored),
    # the gate or the silencing mask were missing, or heads were split in another order.
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    assert torch.all(out[2] == 0)  # the row with no visual token: exactly zero output
    assert torch.all(out[0, :3] == 0) and torch.all(out[1, 5] == 0)  # silenced positions: exactly zero
    assert out[0, 3:].abs().min() > 0 and out[1, :5].abs().max() > 1e-3  # and elsewhere a real signal


# ----------------------------------------------------------------------------- inside real VLMs


def _projector(model):
    """The module whose output rows are inserted at the image-token positions."""
    if model.config.model_type == "llava":
        return model.model.multi_modal_projector  # [n_images, tokens, d]
    return model.model.visual.merger  # Qwen-VL: [sum of tokens over images, d]; not deepstack_merger_list


PVM_LAYERS = [1, 3]


@pytest.fixture(scope="module", params=PRESETS)
def run(request, processor):
    """One ``model.generate`` with PVM on layers 1 and 3 (2 heads, channel gates ~ N(0, 1)), recording:
    the projector/merger outputs, every PVM branch call's inputs, and every FFN's input and output."""
    preset = request.param
    model = build_model(preset, processor.tokenizer)
    attach_pvm(model, BranchConfig(layers=PVM_LAYERS, heads=2, gate="channel"))
    with torch.no_grad():
        for branch in model.pvm.values():
            branch.gate.copy_(torch.randn_like(branch.gate))
    inputs = tiny_inputs(preset, processor, PROMPTS)  # a left-padded batch of 3 prompts, one image each
    keys = [str(i) for i in PVM_LAYERS]
    rec = {"projector": [], "branch": {k: [] for k in keys}, "ffn": {k: [] for k in keys}}
    hooks = [_projector(model).register_forward_hook(
        lambda mod, args, out: rec["projector"].append(out.detach().clone()))]
    for key in rec["branch"]:
        hooks.append(model.pvm[key].register_forward_pre_hook(  # args = (x, visual, visual_mask, text_mask, ...)
            lambda mod, args, key=key: rec["branch"][key].append([a.detach().clone() for a in args[:4]])))
        # registered after attach_pvm, so it sees the FFN output with the PVM term already added
        hooks.append(model.model.language_model.layers[int(key)].mlp.register_forward_hook(
            lambda mod, args, out, key=key: rec["ffn"][key].append((mod, args[0].detach().clone(),
                                                                   out.detach().clone()))))
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    for h in hooks:
        h.remove()
    return dict(preset=preset, model=model, inputs=inputs, rec=rec, out=out,
                image_token_id=processor.tokenizer.image_token_id)


def _per_row_projector_rows(run) -> list[torch.Tensor]:
    """The projector / merger output of the prefill, split into the rows of each image (one per sample)."""
    proj = run["rec"]["projector"][0]
    if proj.dim() == 3:  # LLaVA: [n_images, tokens, d]
        return list(proj)
    counts = (run["inputs"]["input_ids"] == run["image_token_id"]).sum(1).tolist()  # image tokens per row
    return list(torch.split(proj, counts))  # Qwen-VL: [sum tokens, d] -> per image


def _match_rows(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """perm with got == want[perm] exactly (row for row), or an assertion error."""
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    dist = torch.cdist(got.double(), want.double())  # [M, M]
    perm = dist.argmin(1)
    assert sorted(perm.tolist()) == list(range(want.shape[0])), "V is not the projector's rows"
    assert torch.equal(got, want[perm])
    return perm


def test_v_is_the_projector_output(run):
    rec = run["rec"]
    assert len(rec["projector"]) == 1  # the projector / merger ran once, on the prefill
    rows = _per_row_projector_rows(run)
    for key in rec["branch"]:
        x, V, visual_mask, text_mask = rec["branch"][key][0]  # the prefill call
        ids = run["inputs"]["input_ids"]
        assert x.shape[:2] == ids.shape
        assert torch.equal(text_mask.bool(), ids != run["image_token_id"])  # silencing mask: 0 on images
        assert bool(visual_mask.all()) and V.shape[1] == rows[0].shape[0]  # same image size in every row
        for b, want in enumerate(rows):
            perm = _match_rows(V[b], want)  # fails if V were hidden states (e.g. + deepstack on Qwen3-VL)
            if run["preset"] != "tiny-qwen25vl":
                # LLaVA / Qwen3-VL insert the rows in the order produced; Qwen2.5-VL inserts the merger
                # output un-permuted from its window order (retrieval is order-invariant: any order is fine)
                assert perm.tolist() == list(range(want.shape[0]))


def test_v_is_reused_unchanged_on_every_decode_step(run):
    rec = run["rec"]
    for calls in rec["branch"].values():
        assert len(calls) == 4  # prefill + 3 cached decode steps (the 4th token needs no forward)
        _, V0, vm0, _ = calls[0]
        for x, V, visual_mask, text_mask in calls[1:]:
            assert x.shape[1] == 1  # really a cached decode step: one new token per row
            # Fails if V were dropped, recomputed from the decode step's embeddings, or taken from a cache
            # that changes: the branch must see the prefill's visual embeddings, value for value.
            assert torch.equal(V, V0) and torch.equal(visual_mask, vm0)
            assert bool(text_mask.all())  # a generated token is text: it gets the PVM output


def test_ffn_output_gets_gate_mask_h(run):
    """FFN(x) + lambda * mask * h_pvm at every forward of generate, with V = the prefill's projector rows."""
    rows = _per_row_projector_rows(run)
    V = torch.stack(rows)  # [B, M, d] the projector output, as the paper's V_img
    visual_mask = torch.ones(V.shape[:2], dtype=torch.bool)
    ids = run["inputs"]["input_ids"]
    for key, calls in run["rec"]["ffn"].items():
        branch = run["model"].pvm[key]
        assert len(calls) == 4
        for step, (mlp, x, out) in enumerate(calls):
            assert torch.equal(run["rec"]["branch"][key][step][0], x)  # the query is the FFN's own input
            ffn = mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))  # the base FFN, by its weights
            decode_mask = torch.ones(x.shape[:2], dtype=torch.bool)  # a generated token is text
            text_mask = (ids != run["image_token_id"]) if step == 0 else decode_mask
            ref = pvm_reference(x, V, visual_mask, text_mask, **_weights(branch))  # [B, T, d]
            # Fails if the term were not added, added without the gate or mask, used another V, or used
            # the hidden state before the post-attention norm as the query.
            torch.testing.assert_close((out - ffn).double(), ref, atol=2e-5, rtol=1e-4)
            assert ref.abs().max() > 1e-3  # the PVM term is really there (gates are non-zero)


# ----------------------------------------------------------------------------- retrieval that looks things up


def test_retrieval_stats_on_a_hand_made_case():
    from keepsight.pvm.attach import retrieval_stats

    w = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]]])  # [B=1, h=1, T=3, M=2]
    s = retrieval_stats(w, torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 3))
    # entropies 0, 0, ln 2 over 3 positions; max ln 2 each; TV: (1, 0.5, 0.5) over the 3 pairs, both orders
    assert s["positions"] == 3 and s["entropy"] == pytest.approx(math.log(2))
    assert s["max_entropy"] == pytest.approx(3 * math.log(2)) and s["rows"] == 1
    assert s["query_tv"] == pytest.approx((1 + 0.5 + 0.5) / 3)
    silent = retrieval_stats(w, torch.ones(1, 2, dtype=torch.bool), torch.tensor([[1.0, 0.0, 0.0]]))
    assert silent["positions"] == 1 and silent["rows"] == 0  # one text position: no pair


def test_normalised_v_makes_retrieval_depend_on_the_query(processor):
    """With V at the projector's scale (|V| << |x|) the raw reading retrieves a near-uniform mean; RMS-normalised V
    gives each position its own retrieval (random non-zero weights, gates open)."""
    from keepsight.pvm import gate_report

    model = build_model("tiny-llava", processor.tokenizer)
    inputs = tiny_inputs("tiny-llava", processor, PROMPTS)
    with torch.no_grad():
        model.model.multi_modal_projector.linear_2.weight.mul_(0.05)  # visual embeddings far smaller than x
    reports = {}
    for option in ("none", "rms"):
        attach_pvm(model, BranchConfig(layers=[1, 2], normalize_v=option))
        with torch.no_grad():
            for branch in model.pvm.values():
                branch.gate.fill_(0.5)
        reports[option] = gate_report(model, [inputs])
        from keepsight.pvm import detach_pvm

        detach_pvm(model)
    for layer in ("1", "2"):
        raw, rms = reports["none"][layer], reports["rms"][layer]
        assert raw["entropy"] > 0.99 * raw["max_entropy"] and raw["query_tv"] < 0.02  # a mean-pool
        assert rms["query_tv"] > 5 * raw["query_tv"] and rms["entropy"] < raw["entropy"]


def test_projecting_v_once_equals_projecting_it_every_step(processor):
    """Inference keeps W_down V (and the keys) per sequence and layer; recomputing them at every decode step
    gives the same logits (fails if the cached projection were stale, from another sequence, or wrong)."""
    model = build_model("tiny-llava", processor.tokenizer)
    inputs = tiny_inputs("tiny-llava", processor, PROMPTS)
    attach_pvm(model, BranchConfig(layers=[1, 3], normalize_v="rms", key_proj=True, heads=2))
    with torch.no_grad():
        for p in model.pvm.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True)
    once = model.generate(**inputs, **kw)
    assert set(pvm_memory(once.past_key_values).projected) == {"1", "3"}  # kept with the generation's cache
    st = model._keepsight_pvm

    def clear(m, a, k):  # runs after PVM's own pre-hook: a decode step's memory comes from its cache
        if st.memory is not None:
            st.memory.projected.clear()

    drop = model.register_forward_pre_hook(clear, with_kwargs=True)
    try:
        every = model.generate(**inputs, **kw)
    finally:
        drop.remove()
    assert torch.equal(once.sequences, every.sequences)
    for a, b in zip(once.logits, every.logits):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    other = tiny_inputs("tiny-llava", processor, PROMPTS[::-1])  # a new sequence must not reuse the old projections
    fresh = build_model("tiny-llava", processor.tokenizer)
    attach_pvm(fresh, BranchConfig(layers=[1, 3], normalize_v="rms", key_proj=True, heads=2))
    fresh.load_state_dict(model.state_dict())
    torch.testing.assert_close(model.generate(**other, **kw).logits[0], fresh.generate(**other, **kw).logits[0])
