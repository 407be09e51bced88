"""Every autoregressive row of the architecture table, on a tiny random model of its family (``tests/families.py``):
the loader's round trip with its processor, the attention probe against eager ``output_attentions``, LogitLens,
PVM (identity at gate 0, cached == full forward, adapter round trip and refusal on another family), every
baseline's identity at zero strength, OPERA's rows alone, the LoRA control, ``eval generate`` and the lmms-eval
model. A row without a tiny builder fails here, so the support matrix (``keepsight models``) lists nothing that
is not run."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from PIL import Image

from families import FAMILY_BUILDERS, family_batch, registered_settings, save_family, tiny_family
from keepsight.baselines.opera import OPERA
from keepsight.baselines.opera.beams import _together
from keepsight.cli import main
from keepsight.inference import Pipeline, build_method
from keepsight.inference.support import kinds, support
from keepsight.models import AUTOREGRESSIVE, arch_info, arch_spec, load_checkpoint
from keepsight.probes import LogitLens, VisualAttentionProbe
from keepsight.pvm import PVMConfig, attach_pvm, load_pvm, pvm_parameters, save_pvm
from keepsight.pvm.readings import BranchConfig
from keepsight.train.lora_control import lora_targets

PVM_CONFIGS = {"released": PVMConfig, "branch": BranchConfig}  # each block's settings

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTIONS = ["describe the scene .", "is there a red circle at b2 in the picture ?"]
NEW = 4
ZERO, STRONG = registered_settings()  # every registered decoding method's test settings


def test_every_row_has_a_tiny_builder_and_is_in_the_matrix():
    missing = sorted(set(AUTOREGRESSIVE) - set(FAMILY_BUILDERS))
    assert not missing, f"architecture rows without a tiny builder in tests/families.py: {missing}"
    assert set(AUTOREGRESSIVE) <= set(kinds())


@pytest.fixture(scope="module", params=AUTOREGRESSIVE)
def family(request, tmp_path_factory):
    """(kind, saved dir, model loaded back, processor, left-padded batch of 2, the rows alone)."""
    kind = request.param
    path = save_family(kind, tmp_path_factory.mktemp(kind) / "model")
    model, processor = load_checkpoint(path, dtype="float32", device="cpu")
    images = [Image.new("RGB", (64, 64), (200, 20, 20)), Image.new("RGB", (64, 64), (20, 90, 200))]
    batch = family_batch(processor, QUESTIONS, images)
    rows = [family_batch(processor, [q], [im]) for q, im in zip(QUESTIONS, images)]
    return kind, path, model, processor, batch, rows


def test_a_directory_without_a_processor_is_refused_by_name(family, tmp_path):
    """Weights, config and tokenizer only (as many fine-tuned checkpoints are shipped): one clear error naming the
    missing files and how to supply them, for every family (not transformers' raw OSError or an empty ImportError)."""
    import shutil

    from keepsight.models.checkpoint import PROCESSOR_FILES

    kind, path, *_ = family
    bare = tmp_path / "bare"
    shutil.copytree(path, bare)
    for name in PROCESSOR_FILES:
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(ValueError, match=r"has no processor: none of processor_config\.json, "
                                         r"preprocessor_config\.json.*save_pretrained"):
        load_checkpoint(bare, dtype="float32", device="cpu")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(ValueError, match=r"has no processor \(nor a tokenizer\)"):
        load_checkpoint(bare, dtype="float32", device="cpu")

def _gen(model, processor, enc, **kw):
    return model.generate(**enc, max_new_tokens=NEW, pad_token_id=processor.tokenizer.pad_token_id,
                          **{"do_sample": False, **kw})


def test_load_checkpoint_round_trip_is_bit_identical(family):
    kind, path, model, processor, batch, _ = family
    assert arch_info(model).model_type == kind
    assert (batch["attention_mask"] == 0).any()  # really padded
    built, _ = FAMILY_BUILDERS[kind](0)
    with torch.no_grad():
        assert torch.equal(built.float()(**batch).logits, model(**batch).logits)
    again, _ = load_checkpoint(path, dtype="float32", device="cpu")
    assert torch.equal(_gen(again, processor, batch), _gen(model, processor, batch))


def test_attention_probe_equals_eager_attentions(family):
    kind, path, _, processor, batch, _ = family
    model, _ = load_checkpoint(path, dtype="float32", device="cpu")
    info = arch_info(model)
    with VisualAttentionProbe(model) as probe, torch.no_grad():
        model(**batch)
    omega, tvr = probe.omega_v()[0], probe.tvr()[0]  # [L, B, H]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        ref = model(**batch, output_attentions=True).attentions
    visual = torch.isin(batch["input_ids"], torch.tensor(info.visual_token_ids))  # [B, T]
    assert len(ref) == omega.shape[0] == len(info.attention_layers())  # hybrid stacks: the softmax layers only
    for layer, attn in enumerate(ref):
        w = attn[:, :, -1, :].double()  # [B, H, T]
        zv = (w * visual[:, None]).sum(-1)
        zt = (w * (~visual & batch["attention_mask"].bool())[:, None]).sum(-1)
        torch.testing.assert_close(omega[layer].double(), zv, atol=1e-5, rtol=0)
        torch.testing.assert_close(tvr[layer].double(), zt / zv, atol=1e-5, rtol=1e-4)
    ends = sorted({info.attention_layers()[0], info.attention_layers()[-1]})
    with VisualAttentionProbe(model, layers=ends) as probe:
        probed = _gen(model, processor, batch)
    assert torch.equal(probed, _gen(model, processor, batch))  # the probe changes nothing
    assert probe.omega_v().shape[:3] == (NEW, len(ends), 2)
    if len(info.attention_layers()) < len(info.layers):  # a hybrid stack: a layer without softmax attention is refused by name
        other = next(i for i in range(len(info.layers)) if i not in info.attention_layers())
        with pytest.raises(ValueError, match="no softmax attention"):
            VisualAttentionProbe(model, layers=[other])


def test_logit_lens_last_layer_is_the_model(family):
    _, _, model, processor, batch, _ = family
    lens = LogitLens(model)
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    r = lens.from_hidden_states(out.hidden_states)
    assert r["kl"].shape == (len(out.hidden_states) - 1, 2)
    assert torch.all(r["kl"][-1].abs() < 1e-5) and torch.all(r["rank"][-1] == 0)
    gen = Pipeline.from_model(model, processor).generate_ids(batch, {"max_new_tokens": 3}, output_hidden_states=True,
                                                             return_dict_in_generate=True)
    steps = lens.steps(gen.hidden_states)
    assert len(steps) == 3 and gen.sequences.shape[1] == batch["input_ids"].shape[1] + 3


@pytest.mark.parametrize("variant", ["released", "branch"])
def test_pvm_identity_cache_and_adapter_round_trip(family, tmp_path, variant):
    kind, path, _, processor, batch, rows = family
    model, _ = load_checkpoint(path, dtype="float32", device="cpu")
    with torch.no_grad():
        base = model(**batch).logits
    base_gen = _gen(model, processor, batch)
    attach_pvm(model, PVM_CONFIGS[variant](layers=[0, 1]))
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, base)  # gate 0: the model as it was
    assert torch.equal(_gen(model, processor, batch), base_gen)
    with torch.no_grad():
        for p in pvm_parameters(model):
            p.add_(torch.randn_like(p) * 0.5)
        changed = model(**batch).logits
    assert not torch.equal(changed, base)  # wired in
    # cached generation equals a full forward over the generated sequence, row by row (no padding)
    visual = [[t] for t in arch_info(model).visual_token_ids]  # a random model may write an image token: not here
    for row in rows:
        out = model.generate(**row, max_new_tokens=NEW, do_sample=False, output_scores=True, bad_words_ids=visual,
                             return_dict_in_generate=True, pad_token_id=processor.tokenizer.pad_token_id)
        full = _extended(kind, row, out.sequences[:, :-1])
        with torch.no_grad():
            logits = model(**full).logits
        n = row["input_ids"].shape[1]
        for step, scores in enumerate(out.scores):
            fin = torch.isfinite(scores)  # the banned image tokens are -inf
            torch.testing.assert_close(scores[fin], logits[:, n - 1 + step][fin], atol=1e-4, rtol=1e-4)
    save_pvm(model, tmp_path / "adapter")
    fresh, _ = load_checkpoint(path, dtype="float32", device="cpu")
    load_pvm(fresh, tmp_path / "adapter")
    with torch.no_grad():
        assert torch.equal(fresh(**batch).logits, changed)
    other = "llava" if kind != "llava" else "qwen3_vl"
    stranger, _ = FAMILY_BUILDERS[other](0)
    with pytest.raises(ValueError, match="adapter"):
        load_pvm(stranger, tmp_path / "adapter")


def _extended(kind: str, row: dict, ids: torch.Tensor) -> dict:
    """``row``'s inputs with its ids replaced by ``ids`` (the prompt, then generated tokens): the attention mask and
    the per-token inputs the architecture table names extended over the new tokens."""
    out = dict(row)
    extra = ids.shape[1] - row["input_ids"].shape[1]
    out["input_ids"] = ids
    out["attention_mask"] = torch.cat([row["attention_mask"], torch.ones(ids.shape[0], extra, dtype=torch.long)], 1)
    for key in arch_spec(kind).token_inputs:
        if key in row:
            out[key] = torch.cat([row[key], torch.zeros(ids.shape[0], extra, dtype=row[key].dtype)], 1)
    return out


@pytest.mark.parametrize("name", list(ZERO))
def test_baselines_at_zero_strength_are_the_plain_model(family, name):
    kind, _, model, processor, batch, _ = family
    if support(kind)[name] is not None:
        with pytest.raises(ValueError, match=f"{name} does not apply to {kind}"):
            build_method(name, **ZERO[name]).apply(model).__enter__()
        return
    plain = _gen(model, processor, batch)
    method = build_method(name, **ZERO[name])
    with method.apply(model):
        assert torch.equal(_gen(model, processor, batch), plain)


@pytest.mark.parametrize("name", list(STRONG))
def test_baselines_at_strength_act_and_keep_rows_apart(family, name):
    """Each baseline's second stream, cached positions and image handling on the family: it acts (MemVR triggers,
    the others move the logits), a left-padded batch gives each row's tokens alone, and nothing is left behind."""
    kind, _, model, processor, batch, rows = family
    if support(kind)[name] is not None:
        return
    plain = _gen(model, processor, batch)
    method = build_method(name, **STRONG[name])
    with method.apply(model):
        together = _gen(model, processor, batch)[:, batch["input_ids"].shape[1]:]
        for r, row in enumerate(rows):
            alone = _gen(model, processor, row)[:, row["input_ids"].shape[1]:]
            assert torch.equal(together[r, : alone.shape[1]], alone[0]), (name, r)
    stats = method.stats()
    if name == "memvr":
        assert stats["triggered"] > 0
    else:
        assert stats["mean_logit_shift"] > 0
    assert torch.equal(_gen(model, processor, batch), plain)  # removed on exit


def test_opera_rows_alone_equal_the_batch(family):
    """OPERA decodes a batch's rows together (each alone where the cache cannot be stacked: sliding windows, recurrent
    layers): a left-padded batch gives each row's tokens alone. The two images differ in
    aspect, so on the families whose images give each its own token count (tiles, sizes, runs) the rows hold
    different numbers of image tokens and pixel entries, and the split must give each row its own."""
    kind, _, model, processor, _, _ = family
    if support(kind)["opera"] is not None:
        with pytest.raises(ValueError, match=f"opera does not apply to {kind}"):
            OPERA().apply(model).__enter__()
        return
    images = [Image.new("RGB", (64, 64), (200, 20, 20)), Image.new("RGB", (64, 32), (20, 90, 200))]
    batch = family_batch(processor, QUESTIONS, images)
    rows = [family_batch(processor, [q], [im]) for q, im in zip(QUESTIONS, images)]
    opera, apart = OPERA(num_beams=2, num_attn_candidates=2), OPERA(num_beams=2, num_attn_candidates=2)
    with opera.apply(model):
        together = _gen(model, processor, batch)[:, batch["input_ids"].shape[1]:]
    with apart.apply(model):
        for r, row in enumerate(rows):
            alone = _gen(model, processor, row)[:, row["input_ids"].shape[1]:]
            assert torch.equal(together[r, : alone.shape[1]], alone[0]), r
    s, a = opera.stats(), apart.stats()
    assert s["rows"] == a["rows"] == 2 and s["steps"] == a["steps"] > 2
    # together: the steps' forwards are shared; alone (a sliding window or a recurrent layer) each row runs its own
    assert (s["forwards"] < a["forwards"]) == _together(model) and s["forwards"] <= a["forwards"]


def test_opera_candidates_in_one_forward_equal_one_forward_each(family, monkeypatch):
    """OPERA scores its candidates in one forward (the beams' cache repeated for each) where the release runs one
    forward per candidate: every beam step (tokens, parents, the over-trust location) is the same both ways and the
    beam scores agree to float32 rounding (a batch of 6 rows is not summed in the same order as one of 2), on every
    family (M-RoPE offsets, sliding windows, and a recurrent stack, which keeps one forward each)."""
    from keepsight.baselines import opera as opera_module
    from keepsight.baselines.opera import beams, search

    kind, _, model, processor, _, rows = family
    if support(kind)["opera"] is not None:
        return  # refused: test_opera_rows_alone_equal_the_batch
    config = opera_module.OPERAConfig(num_beams=2, num_attn_candidates=3, threshold=None)

    def steps():
        trace, stats = [], {}
        new, _ = opera_module.opera_beam_search(model, dict(rows[0]), 4, config, stats=stats, trace=trace)
        return new, trace, stats["forwards"]

    together, trace, forwards = steps()
    monkeypatch.setattr(search, "CANDIDATES_PER_FORWARD", 1)
    alone, trace_alone, forwards_alone = steps()
    assert torch.equal(together, alone)
    assert [{k: v for k, v in s.items() if k != "scores"} for s in trace] == [
        {k: v for k, v in s.items() if k != "scores"} for s in trace_alone]
    torch.testing.assert_close(torch.tensor([s["scores"] for s in trace]),
                               torch.tensor([s["scores"] for s in trace_alone]), rtol=1e-5, atol=1e-6)
    assert forwards < forwards_alone or not beams._repeatable(_cache_of(model, rows[0]))


def _cache_of(model, inputs):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(**inputs, cache=cache, use_cache=True)
    return cache


def test_opera_candidate_forwards_leave_no_trace(family):
    """OPERA runs each candidate on the step's cache and must then put the cache back exactly: attention layers (past
    a sliding window too: the cache is first extended beyond it) and recurrent layers (Qwen3.5's Gated DeltaNet,
    whose states change in place and cannot be cropped). After two candidates and a restore, the next token's logits
    equal those of a cache that never saw them."""
    from transformers import DynamicCache

    from keepsight.baselines.opera.beams import _CacheMark

    kind, _, model, processor, _, rows = family
    text = model.config.get_text_config()
    extend = torch.tensor([processor.tokenizer.convert_tokens_to_ids("scene")] * ((getattr(text, "sliding_window", None) or 0) + 8))

    def cache_and_next(candidates):
        cache = DynamicCache(config=model.config)
        model(**rows[0], cache=cache, use_cache=True)
        model(input_ids=extend[None], cache=cache, use_cache=True)
        mark = _CacheMark(cache)
        for token in candidates:
            model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
            mark.restore()
        return model(input_ids=torch.tensor([[int(extend[0])]]), cache=cache, use_cache=True).logits

    with torch.no_grad():
        assert torch.equal(cache_and_next([5, 9]), cache_and_next([]))


def test_opera_refuses_a_batch_it_cannot_split():
    """LLaVA-NeXT writes each image as one run of image tokens: more images than runs (two images written next to
    each other, or a stray one) cannot be assigned to rows, and OPERA says so; OneVision's images per row must agree
    with the tokens."""
    from keepsight.baselines.opera.rows import _split_rows

    model, processor = tiny_family("llava_next")
    batch = dict(family_batch(processor, QUESTIONS, [Image.new("RGB", (64, 64)), Image.new("RGB", (64, 32))]))
    batch["pixel_values"] = torch.cat([batch["pixel_values"], batch["pixel_values"][:1]])
    batch["image_sizes"] = torch.cat([batch["image_sizes"], batch["image_sizes"][:1]])
    with pytest.raises(ValueError, match="3 images given but the prompts hold 2 runs of image tokens"):
        _split_rows(model, batch, arch_info(model))
    model, processor = tiny_family("llava_onevision")
    batch = dict(family_batch(processor, QUESTIONS, [Image.new("RGB", (64, 64)), Image.new("RGB", (64, 32))]))
    assert [r["batch_num_images"].tolist() for r in _split_rows(model, batch, arch_info(model))] == [[1], [1]]
    batch["batch_num_images"] = torch.tensor([2, 0])
    with pytest.raises(ValueError, match="row 0: batch_num_images says 2 images, its image tokens hold 1"):
        _split_rows(model, batch, arch_info(model))


def test_lora_control_matches_pvm_parameters(family):
    from peft import LoraConfig, get_peft_model

    from keepsight.train.lora_control import lora_targets, matched_rank, pvm_parameter_count

    _, path, _, _, batch, _ = family
    model, _ = load_checkpoint(path, dtype="float32", device="cpu")
    targets = lora_targets(model, [0, 1])
    assert targets and all(".layers." in t for t in targets)
    rank, n = matched_rank(model, targets, pvm_parameter_count(model, PVMConfig(layers=[0, 1])))
    peft = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets))
    assert sum(p.numel() for p in peft.parameters() if p.requires_grad) == n
    with torch.no_grad():
        assert torch.isfinite(peft(**batch).logits).all()


def test_eval_generate_on_a_llava_json_and_the_lmms_eval_model(family, tmp_path):
    from keepsight.integrations.lmms_eval import KeepsightLMM

    kind, path, _, _, _, _ = family
    Image.new("RGB", (64, 64), (200, 20, 20)).save(tmp_path / "a.png")
    rows = [{"id": str(i), "image": "a.png", "conversations": [{"from": "human", "value": f"<image>\n{q}"},
                                                               {"from": "gpt", "value": "yes"}]}
            for i, q in enumerate(QUESTIONS)]
    (tmp_path / "data.json").write_text(json.dumps(rows))
    out = tmp_path / "pred.jsonl"
    assert main(["eval", "generate", "--model", str(path), "--data", str(tmp_path / "data.json"), "--image-folder",
                 str(tmp_path), "--max-new-tokens", "3", "--out", str(out), "--device", "cpu"]) == 0
    assert len(out.read_text().splitlines()) == 2

    class Request:
        args = (QUESTIONS[1], {"max_new_tokens": 3}, lambda doc: [doc["image"]], 0, "t", "test")

    lm = KeepsightLMM(pretrained=str(path), device="cpu")
    lm.task_dict = {"t": {"test": [{"image": Image.open(tmp_path / "a.png")}]}}
    assert len(lm.generate_until([Request()])) == 1


@pytest.mark.parametrize("kind, lacking", [("qwen3_vl_moe", "layer 0 lacks down_proj, gate_proj, up_proj"),
                                           ("qwen3_5", "layer 0 lacks k_proj, o_proj, q_proj, v_proj")])
def test_the_lora_control_names_layers_it_adapts_only_in_part(kind, lacking):
    """Fused MoE experts and linear-attention layers hold no nn.Linear of the table's names: the control says so."""
    model, _ = tiny_family(kind)
    with pytest.warns(UserWarning, match=lacking):
        assert lora_targets(model, [0, 1])
    dense, _ = tiny_family("llava_next")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lora_targets(dense, [0, 1])
