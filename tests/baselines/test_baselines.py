"""The training-free baselines (VCD, PAI, MemVR, DeCo) on tiny LLaVA and Qwen3-VL checkpoints: identity at zero
strength, each method's logits against a reference computed here from its formula (with a KV cache and without),
greedy and sampling, padded batches against single rows, clean removal, and bad input."""

import math

import pytest
import torch
from PIL import Image

from families import registered_settings
from keepsight.baselines import DeCo, MemVR, build_baseline, distort
from keepsight.baselines.deco import default_layers
from keepsight.baselines.readings import (
    MEMVR_SOFTMAX,
    READINGS,
    VCD_LINEAR,
    MemVRSoftmax,
    linear_alpha_bar,
    pai_paper_alpha,
)
from keepsight.baselines.vcd import alpha_bar
from keepsight.data import Sample, padding_side, render_prompt
from keepsight.inference import Decoders, build_method
from keepsight.methods import METHODS
from keepsight.models import load_checkpoint
from keepsight.models.arch import arch_info
from tiny_checkpoints import save_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

PRESETS = ["tiny-llava", "tiny-qwen3vl"]
NEW = 4
ZERO, STRONG = registered_settings()  # every registered decoding method's test settings


@pytest.fixture(scope="module", params=PRESETS)
def setup(request, tmp_path_factory):
    model, processor = load_checkpoint(save_tiny_checkpoint(request.param, tmp_path_factory.mktemp("b") / "m"),
                                       dtype="float32", device="cpu")
    imgs = [Image.new("RGB", (64, 64), (200, 20, 20)), Image.new("RGB", (64, 64), (20, 90, 200))]
    texts = [render_prompt(processor, Sample.single_turn(q, image=im))
             for q, im in zip(["describe the scene .", "is there a red circle at b2 ?"], imgs)]
    with padding_side(processor.tokenizer, "left"):
        batch = processor(text=texts, images=imgs, return_tensors="pt", padding=True)
    rows = [processor(text=[t], images=[im], return_tensors="pt") for t, im in zip(texts, imgs)]
    return model, processor, batch, rows


def _gen(model, processor, enc, **kw):
    return model.generate(**enc, max_new_tokens=NEW, pad_token_id=processor.tokenizer.pad_token_id,
                          return_dict_in_generate=True, output_logits=True, **{"do_sample": False, **kw})


@pytest.mark.parametrize("name", list(ZERO))
def test_zero_strength_is_the_plain_model_greedy_and_sampling(setup, name):
    model, processor, batch, _ = setup
    plain = _gen(model, processor, batch).sequences
    torch.manual_seed(3)
    sampled = _gen(model, processor, batch, do_sample=True, temperature=1.0).sequences
    method = build_method(name, **ZERO[name])
    with method.apply(model):
        assert torch.equal(_gen(model, processor, batch).sequences, plain)
        torch.manual_seed(3)
        assert torch.equal(_gen(model, processor, batch, do_sample=True, temperature=1.0).sequences, sampled)
    stats = method.stats()
    if name == "memvr":  # acts inside the forward: no plain logits to compare with, so only the trigger count
        assert stats["triggered"] == 0 and stats["changed_argmax"] is None and stats["mean_logit_shift"] is None
    else:
        assert stats["changed_argmax"] == 0


def _prefix_inputs(batch, seq, t):
    """The batch's inputs with the first ``t`` generated tokens appended (a full forward, no cache)."""
    P = batch["input_ids"].shape[1]
    enc = dict(batch)
    enc["input_ids"] = seq[:, : P + t]
    enc["attention_mask"] = torch.cat([batch["attention_mask"], torch.ones(seq.shape[0], t, dtype=torch.long)], 1)
    if "mm_token_type_ids" in batch:
        enc["mm_token_type_ids"] = torch.cat([batch["mm_token_type_ids"], torch.zeros(seq.shape[0], t,
                                                                                      dtype=torch.long)], 1)
    return enc


def _plain_last(model, enc):
    with torch.no_grad():
        return model(**enc, use_cache=False).logits[:, -1]


def _check_steps(model, processor, batch, method, reference):
    """Cached generation under ``method`` vs ``reference(prefix inputs) -> [B, V]`` at every step (1e-4)."""
    with method.apply(model):
        out = _gen(model, processor, batch)
        with torch.no_grad():
            full = model(**_prefix_inputs(batch, out.sequences, 0), use_cache=False).logits[:, -1]
    for t, step in enumerate(out.logits):
        ref = reference(_prefix_inputs(batch, out.sequences, t))
        fin = torch.isfinite(ref)
        assert torch.equal(fin, torch.isfinite(step))
        torch.testing.assert_close(step[fin], ref[fin], rtol=1e-4, atol=1e-4)
        if t == 0:  # a full forward under the method equals the cached prefill
            torch.testing.assert_close(full[fin], ref[fin], rtol=1e-4, atol=1e-4)
    assert method.stats()["forwards"] >= NEW


def test_vcd_equals_two_plain_forwards_combined(setup):
    model, processor, batch, _ = setup
    alpha, beta = 1.0, 0.1
    grid = batch.get("image_grid_thw")
    noisy = distort(batch["pixel_values"], alpha_bar(500), 0, grid)

    def reference(enc):
        a = _plain_last(model, enc)
        b = _plain_last(model, {**enc, "pixel_values": noisy})
        out = (1 + alpha) * a - alpha * b
        p = a.softmax(-1)
        return out.masked_fill(p < beta * p.max(-1, keepdim=True).values, float("-inf"))

    _check_steps(model, processor, batch, build_baseline("vcd", alpha=alpha, beta=beta), reference)
    # VCD's sigmoid schedule (vcd_add_noise.py) at step 500, and the linear DDPM one (our earlier reading)
    sig = [1 / (1 + math.exp(-(-6 + 12 * s / 999))) * (5e-3 - 1e-5) + 1e-5 for s in range(1000)]
    assert alpha_bar(500) == pytest.approx(math.prod(1 - b for b in sig[:501]), rel=1e-5)
    assert alpha_bar(500) == pytest.approx(0.7448, abs=1e-4)
    ab = math.prod(1 - (1e-4 + (0.02 - 1e-4) * s / 999) for s in range(501))
    assert linear_alpha_bar(500) == pytest.approx(ab, rel=1e-9)
    assert not torch.equal(noisy, batch["pixel_values"])
    assert build_baseline("vcd").alpha_bar() == alpha_bar(500)


def test_the_linear_schedule_reading_distorts_with_its_own_noise_level(setup):
    model, processor, batch, _ = setup
    alpha, beta = 1.0, 0.1
    noisy = distort(batch["pixel_values"], linear_alpha_bar(500), 0, batch.get("image_grid_thw"))

    def reference(enc):
        a = _plain_last(model, enc)
        out = (1 + alpha) * a - alpha * _plain_last(model, {**enc, "pixel_values": noisy})
        p = a.softmax(-1)
        return out.masked_fill(p < beta * p.max(-1, keepdim=True).values, float("-inf"))

    decoders = Decoders([(VCD_LINEAR, {"alpha": alpha, "beta": beta})], family="autoregressive")
    _check_steps(model, processor, batch, decoders.get("vcd_linear"), reference)


def test_the_readings_stay_outside_the_registry():
    # the command line, lmms-eval and the support matrix list the registry: a reading must not reach them
    assert not set(READINGS) & set(METHODS) and {"vcd_linear", "memvr_softmax"} == set(READINGS)
    assert (pai_paper_alpha().alpha, pai_paper_alpha(gamma=0.0).gamma) == (0.5, 0.0)  # a setting of the released PAI
    with pytest.raises(ValueError, match="unknown method 'vcd_linear'"):
        Decoders([("vcd_linear", {})])
    with pytest.raises(ValueError, match="memvr_softmax: .*unexpected keyword argument 'ratio'"):
        Decoders([(MEMVR_SOFTMAX, {"ratio": 0.5})])  # the reading's own fields, not the released method's
    with pytest.raises(ValueError, match="vcd_linear is a autoregressive method .* of family 'diffusion'"):
        Decoders([(VCD_LINEAR, {})], family="diffusion")


def _text_only(processor, model, enc):
    """The same rows without their image (and Qwen's vision markers), left-padded again."""
    info = arch_info(model)
    drop = {info.image_token_id} | {getattr(model.config, k) for k in ("vision_start_token_id", "vision_end_token_id")
                                    if isinstance(getattr(model.config, k, None), int)}
    rows = [ids[(m.bool()) & ~torch.isin(ids, torch.tensor(sorted(drop)))]
            for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), processor.tokenizer.pad_token_id)
    am = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], am[i, width - len(r):] = r, 1
    return {"input_ids": ids, "attention_mask": am, "position_ids": (am.cumsum(-1) - 1).clamp(min=0)}


def test_pai_text_only_subtraction_equals_two_plain_forwards(setup):
    model, processor, batch, _ = setup
    gamma = 0.5

    def reference(enc):  # CFG.py: on log-probabilities, then the hard-coded 0.1 cut on the conditional ones
        a = _plain_last(model, enc).log_softmax(-1)
        b = _plain_last(model, _text_only(processor, model, enc)).log_softmax(-1)
        out = (1 + gamma) * a - gamma * b
        return out.masked_fill(a < math.log(0.1) + a.max(-1, keepdim=True).values, float("-inf"))

    _check_steps(model, processor, batch, build_baseline("pai", alpha=0.0, gamma=gamma), reference)


def test_pai_leaves_the_prefill_alone_when_it_subtracts_as_released(setup):
    """With the text-only subtraction on, the release's first token reads the unamplified model (its layers carry
    use_cfg until the logits processor's first call); from the second token on the attention is amplified."""
    model, processor, batch, rows = setup
    enc = rows[0]
    gamma = 0.1

    def refine(cond, uncond):
        a, b = cond.log_softmax(-1), uncond.log_softmax(-1)
        return ((1 + gamma) * a - gamma * b).masked_fill(a < math.log(0.1) + a.max(-1, keepdim=True).values,
                                                          float("-inf"))

    pai = build_baseline("pai", alpha=0.5, gamma=gamma)
    with pai.apply(model):
        out = _gen(model, processor, enc)
    first = refine(_plain_last(model, dict(enc)), _plain_last(model, _text_only(processor, model, enc)))
    fin = torch.isfinite(first)
    assert torch.equal(fin, torch.isfinite(out.logits[0]))
    torch.testing.assert_close(out.logits[0][fin], first[fin], rtol=1e-4, atol=1e-4)
    forced = build_baseline("pai", alpha=0.5, gamma=gamma, amplify_prefill=True)
    with forced.apply(model):
        amplified = _gen(model, processor, enc).logits[0]
    assert not torch.allclose(amplified[fin], first[fin])  # amplifying the prefill would have changed it
    assert build_baseline("pai").config.alpha == 0.2 and build_baseline("pai").config.beta == 0.1


def test_pai_amplification_cached_equals_full_and_moves_attention_to_the_image(setup):
    model, processor, batch, _ = setup
    pai = build_baseline("pai", alpha=0.5, gamma=0.0, rows="after_image")

    def reference(enc):
        with pai.apply(model):
            return _plain_last(model, enc)

    _check_steps(model, processor, batch, build_baseline("pai", alpha=0.5, gamma=0.0, rows="after_image"), reference)
    # the paper's rows: the prefill's last query only, so the first step equals a full forward over the prompt
    paper = build_baseline("pai", alpha=0.5, gamma=0.0)
    with paper.apply(model):
        first = _gen(model, processor, batch).logits[0]
        torch.testing.assert_close(first, _plain_last(model, dict(batch)), rtol=1e-4, atol=1e-4)
    from keepsight.probes import VisualAttentionProbe

    with VisualAttentionProbe(model) as probe, torch.no_grad():
        model(**batch)
    base = probe.omega_v()[0, 2:].mean()
    with torch.no_grad():
        plain = _plain_last(model, dict(batch))
        with pai.apply(model):
            amplified = _plain_last(model, dict(batch))
    assert not torch.allclose(plain, amplified) and float(base) > 0  # the image attention was changed


def test_deco_equals_the_formula_on_hidden_states(setup):
    model, processor, batch, _ = setup
    info = arch_info(model)
    deco = DeCo(alpha=0.6, top_k=5, top_p=0.9)
    n = len(info.layers)

    def reference(enc):
        with torch.no_grad():
            out = model(**enc, use_cache=False, output_hidden_states=True)
        final = out.logits[:, -1]
        probs = final.softmax(-1)
        top, idx = probs.topk(5, -1)
        keep = (top.cumsum(-1) - top) < 0.9
        keep[:, 0] = True
        cand = torch.zeros_like(final, dtype=torch.bool).scatter(-1, idx, keep)
        rows = []
        for r in range(final.shape[0]):
            best, best_c = None, -1.0
            for i in deco.layers:
                early = info.lm_head(info.final_norm(out.hidden_states[i + 1][r, -1]))
                c = float(early.detach().softmax(-1)[cand[r]].max())
                if c > best_c:
                    best, best_c = early, c
            rows.append((final[r] + 0.6 * best_c * best).masked_fill(~cand[r], float("-inf")))
        return torch.stack(rows)

    with deco.apply(model):  # sets deco.layers
        pass
    assert deco.layers == default_layers(n) == list(range(int(0.625 * n) - 1, min(n - 1, int(0.875 * n))))
    # the paper's hidden_states[20 .. 28] of LLaVA-1.5: the outputs of decoder layers 19 .. 27
    assert default_layers(32) == list(range(19, 28)) and DeCo().config.top_k == 20
    _check_steps(model, processor, batch, DeCo(alpha=0.6, top_k=5, top_p=0.9), reference)


def test_memvr_equals_the_ffn_memory_by_hand(setup):
    model, processor, batch, _ = setup
    info = arch_info(model)
    inject, alpha = len(info.layers) // 2, 1.0
    captured = {}

    def grab(module, args, kwargs):
        captured["embeds"] = kwargs["inputs_embeds"].detach()

    h = info.language_model.register_forward_pre_hook(grab, with_kwargs=True)
    with torch.no_grad():
        model(**batch, use_cache=False)
    h.remove()
    visual = batch["input_ids"] == info.image_token_id
    Z = captured["embeds"][visual].view(visual.shape[0], -1, captured["embeds"].shape[-1])  # [B, Nv, d]

    def reference(enc):
        ids = enc["input_ids"]
        is_img = (ids == info.image_token_id).long()
        after = (is_img.flip(-1).cumsum(-1).flip(-1) == 0)  # every position after the last image token

        def add(module, args, output):
            x = args[0]  # [B, T, d]
            w = torch.softmax((x @ Z.transpose(1, 2)) / math.sqrt(x.shape[-1]), -1)
            return torch.where(after[..., None], output + alpha * (w @ Z), output)

        handle = info.ffn(inject).register_forward_hook(add)
        try:
            return _plain_last(model, enc)
        finally:
            handle.remove()

    method = MemVRSoftmax(alpha=alpha, threshold=0.0, rows="after_image")
    _check_steps(model, processor, batch, method, reference)
    assert method.stats()["triggered"] > 0  # threshold 0: every position after the image retraced
    paper = MemVRSoftmax(alpha=alpha, threshold=0.0)  # the default rows: the prefill's last position, then each new token
    with paper.apply(model):
        first = _gen(model, processor, batch).logits[0]
    ids = batch["input_ids"]
    last_only = torch.zeros_like(ids, dtype=torch.bool)
    last_only[:, -1] = True

    def add_last(module, args, output):
        x = args[0]
        w = torch.softmax((x @ Z.transpose(1, 2)) / math.sqrt(x.shape[-1]), -1)
        return torch.where(last_only[..., None], output + alpha * (w @ Z), output)

    handle = info.ffn(inject).register_forward_hook(add_last)
    try:
        torch.testing.assert_close(first, _plain_last(model, dict(batch)), rtol=1e-4, atol=1e-4)
    finally:
        handle.remove()


def _memvr_twin(model, processor, enc, threshold: float, ratio: float, start: int, end: int):
    """MemVR as memvr.py computes it, written here as plain hooks for one unpadded row: after each layer l the
    top-10 entropy / ln 10 of its LogitLens at the last position; the first l in (start, end) above the threshold
    makes layer l + 1's FFN (1 - r) FFN + r A * mean|FFN| / mean|A| with A = (x Z^T) Z, over the whole forward."""
    info = arch_info(model)
    n = len(info.layers)
    state: dict = {"inject": None, "Z": None, "hits": []}

    def reset(module, args, kwargs):
        state["inject"] = None

    def memory(module, args, kwargs):
        e = kwargs["inputs_embeds"]
        if e.shape[1] == enc["input_ids"].shape[1]:  # the prefill
            state["Z"] = e[0][enc["input_ids"][0] == info.image_token_id].detach()

    def probe(i):
        def hook(module, args, out):
            hs = out[0] if isinstance(out, tuple) else out
            if state["inject"] is None and start < i < end:
                p = info.lm_head(info.final_norm(hs[0, -1])).float().topk(10).values.softmax(-1)
                if float(-(p * p.log()).sum() / math.log(10)) > threshold:
                    state["inject"] = i + 1
                    state["hits"].append(i + 1)
        return hook

    def ffn(i):
        def hook(module, args, out):
            if state["inject"] != i:
                return out
            a = (args[0] @ state["Z"].T) @ state["Z"]
            return (1 - ratio) * out + ratio * (out.abs().mean() / a.abs().mean()) * a
        return hook

    handles = [model.register_forward_pre_hook(reset, with_kwargs=True),
               info.language_model.register_forward_pre_hook(memory, with_kwargs=True)]
    handles += [info.layers[i].register_forward_hook(probe(i)) for i in range(n)]
    handles += [info.ffn(i).register_forward_hook(ffn(i)) for i in range(n)]
    try:
        return _gen(model, processor, enc), state["hits"]
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("threshold", [0.75, 0.0])
def test_memvr_as_released_equals_its_twin(setup, threshold):
    model, processor, _, rows = setup
    n = len(arch_info(model).layers)
    from keepsight.baselines.memvr import default_window

    start, end = default_window(n)
    assert default_window(32) == (5, 16)  # the release's window of LLaVA-1.5
    for enc in rows:
        method = MemVR(threshold=threshold, ratio=0.5)
        with method.apply(model):
            ours = _gen(model, processor, enc)
        twin, hits = _memvr_twin(model, processor, enc, threshold, 0.5, start, end)
        assert torch.equal(ours.sequences, twin.sequences)
        for a, b in zip(ours.logits, twin.logits):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        stats = method.stats()
        assert stats["triggered"] == len(hits) and sum(stats["layers"].values()) == len(hits)
    assert hits  # the tiny model's top-10 entropy is high: it triggered


@pytest.mark.parametrize("name", list(STRONG))
def test_padded_rows_equal_single_rows(setup, name):
    model, processor, batch, rows = setup
    method = build_method(name, **STRONG[name])
    with method.apply(model):
        together = _gen(model, processor, batch).sequences[:, batch["input_ids"].shape[1]:]
        for r, single in enumerate(rows):
            alone = _gen(model, processor, single).sequences[:, single["input_ids"].shape[1]:]
            assert torch.equal(together[r], alone[0]), (name, r)


@pytest.mark.parametrize("name", list(STRONG))
def test_everything_is_removed_on_exit_and_on_exception(setup, name):
    model, processor, batch, _ = setup
    state = {k: v.clone() for k, v in model.state_dict().items()}
    plain = _gen(model, processor, batch).sequences

    def hooks():
        return {(n, len(m._forward_hooks), len(m._forward_pre_hooks)) for n, m in model.named_modules()}

    before = hooks()
    impl = arch_info(model).language_model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"):
        with build_method(name, **STRONG[name]).apply(model):
            _gen(model, processor, batch)
            raise RuntimeError("boom")
    assert hooks() == before  # every hook the method added is gone (transformers' own stay)
    assert arch_info(model).language_model.config._attn_implementation == impl
    assert "get_image_features" not in model.base_model.__dict__
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(_gen(model, processor, batch).sequences, plain)


def test_bad_input_is_named(setup):
    model, _, _, _ = setup
    with pytest.raises(ValueError, match="unknown method 'dola'"):
        build_baseline("dola")
    with pytest.raises(ValueError, match="alpha must be >= 0.0"):
        build_baseline("vcd", alpha=-1.0)
    with pytest.raises(ValueError, match=r"noise_step must lie in the schedule \[0, 1000\)"):
        build_baseline("vcd", noise_step=1000)
    with pytest.raises(ValueError, match="layer 99 is out of range"):
        with build_baseline("pai", layers=[99]).apply(model):
            pass
    for field in ("inject_layer", "probe_layer", "variant"):  # the softmax reading's fields are not the released one's
        with pytest.raises(ValueError, match=f"memvr: .*unexpected keyword argument '{field}'"):
            build_baseline("memvr", **{field: 1})
    with pytest.raises(ValueError, match="probe_layer 3 must come before inject_layer 1"):
        with MemVRSoftmax(inject_layer=1, probe_layer=3).apply(model):
            pass
    with pytest.raises(ValueError, match="end_layer 40 is out of range"):
        with build_baseline("memvr", end_layer=40).apply(model):
            pass
    with pytest.raises(ValueError, match="deco: .*unexpected keyword"):
        build_baseline("deco", strength=1)


@pytest.mark.parametrize("name", list(STRONG))
def test_sampling_runs_through_each_method_and_it_acts(setup, name):
    model, processor, batch, _ = setup
    method = build_method(name, **STRONG[name])
    torch.manual_seed(0)
    with method.apply(model):
        out = _gen(model, processor, batch, do_sample=True, temperature=1.0, top_k=0)
    assert out.sequences.shape[1] == batch["input_ids"].shape[1] + NEW
    assert method.stats()["acted"] > 0 and method.stats()["forwards"] >= NEW


def test_the_commands_take_a_baseline(tmp_path, capsys):
    import json

    from keepsight.cli import main

    model = save_tiny_checkpoint("tiny-llava", tmp_path / "m")
    assert main(["world", "build", "--out", str(tmp_path / "w"), "--n", "2", "--seed", "1"]) == 0
    out = tmp_path / "scores.json"
    assert main(["world", "eval", "--model", str(model), "--data", str(tmp_path / "w"), "--baseline", "deco",
                 "--baseline-args", '{"alpha": 0.6}', "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["baseline"]["name"] == "deco" and res["baseline"]["stats"]["forwards"] > 0
    pred = tmp_path / "pred.jsonl"
    assert main(["eval", "generate", "--model", str(model), "--data", str(tmp_path / "w"), "--out", str(pred),
                 "--baseline", "vcd", "--max-new-tokens", "2", "--limit", "4"]) == 0
    assert len(pred.read_text().splitlines()) == 4
    assert main(["world", "eval", "--model", str(model), "--data", str(tmp_path / "w"), "--baseline-args",
                 '{"alpha": 1}']) == 2
    assert "--baseline-args needs --baseline" in capsys.readouterr().err


def test_eval_generate_names_bad_baseline_settings_before_loading(tmp_path, capsys, monkeypatch):
    from keepsight.cli import main
    from keepsight.inference import pipeline

    def no_load(*a, **k):  # a bad setting must be named before the (possibly minutes long) model load
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(pipeline.Pipeline, "_load", no_load)
    assert main(["world", "build", "--out", str(tmp_path / "w"), "--n", "2", "--seed", "1"]) == 0
    capsys.readouterr()
    assert main(["eval", "generate", "--model", str(tmp_path / "nowhere"), "--data", str(tmp_path / "w"), "--out",
                 str(tmp_path / "p.jsonl"), "--baseline", "vcd", "--baseline-args", '{"alpha": -1}']) == 2
    assert "alpha must be >= 0.0, got -1" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["eval", "score", "--pred", str(empty)]) == 2
    assert f"--pred {empty}: no predictions to score" in capsys.readouterr().err


QUESTIONS = ["describe the scene .", "is there a red circle at b2 ?", "what colour is the square ?",
             "how many objects are there ?", "is there a blue triangle ?", "describe the scene .",
             "where is the green circle ?", "is there a yellow square at a1 ?"]
COLOURS = [(200, 20, 20), (20, 90, 200), (30, 160, 40), (220, 200, 30), (120, 40, 160), (10, 10, 10),
           (240, 240, 240), (90, 60, 20)]


@pytest.fixture(scope="module")
def eight(setup):
    """Eight rows of different lengths and images: one left-padded batch and each row alone."""
    _, processor, _, _ = setup
    imgs = [Image.new("RGB", (64, 64), c) for c in COLOURS]
    texts = [render_prompt(processor, Sample.single_turn(q, image=im)) for q, im in zip(QUESTIONS, imgs)]
    with padding_side(processor.tokenizer, "left"):
        batch = processor(text=texts, images=imgs, return_tensors="pt", padding=True)
    assert len(set(batch["attention_mask"].sum(1).tolist())) >= 3  # really different lengths
    return batch, [processor(text=[t], images=[im], return_tensors="pt") for t, im in zip(texts, imgs)]


def _pvm_model(model):
    """A copy of the model with the released PVM block on two layers and a live gate."""
    import copy

    from keepsight.pvm import PVMConfig, attach_pvm

    m = copy.deepcopy(model)
    attach_pvm(m, PVMConfig(layers=[1, 2]))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.pvm.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
        for block in m.pvm.values():
            block.gate_alpha.fill_(0.5)
    return m


@pytest.mark.parametrize("name", [*ZERO, "pvm"])
def test_scores_do_not_depend_on_the_batch_size(setup, eight, name):
    """Greedy answers of 8 left-padded rows in one batch equal each row decoded alone (batch 1), for every baseline
    at its released defaults and for PVM: a reported score cannot depend on the batch size."""
    model, processor, _, _ = setup
    batch, rows = eight
    if name == "pvm":
        model, ctx = _pvm_model(model), None
    else:
        ctx = build_method(name)
    import contextlib

    with ctx.apply(model) if ctx is not None else contextlib.nullcontext():
        together = _gen(model, processor, batch).sequences[:, batch["input_ids"].shape[1]:]
        for r, single in enumerate(rows):
            alone = _gen(model, processor, single).sequences[0, single["input_ids"].shape[1]:]
            n = alone.shape[0]  # alone stops at eos; in the batch the row is padded after it
            assert torch.equal(together[r, :n], alone), (name, r)
            assert bool((together[r, n:] == processor.tokenizer.pad_token_id).all()), (name, r)
