"""OPERA (keepsight.baselines.opera) on tiny models built here: parity with the authors' released beam search,
identity with Hugging Face's beam search when OPERA is off, batches against single rows, Qwen-VL, the config, the
stats and the clean removal of the generate override.

Parity: ``tests/fixtures/reference/opera/`` holds what the release's ``opera_beam_search`` (github.com/shikiw/OPERA,
transformers 4.29.2) computed on a tiny LLaVA-1.5-layout model with a summary token
(``scripts/reference/opera_released.py``, which the test imports to rebuild the same models and prompt), for the
paper's settings (threshold 15, 5 candidates), a low threshold (3) and the README's efficient setting (threshold 25,
1 candidate); the cases roll back 3, 6 and 2 times, the first and last end with eos, and the paper case bans
candidates through the float16 over-trust buffer saturating to inf. Every beam step must match: its length (a
rollback shows as a shorter one), the 5 chosen tokens, their parent beams and their beam scores (to 1e-4), and the
final tokens and score. The release runs 4.29.2's LLaMA on the prompt's ``inputs_embeds``; keepsight runs
transformers 5's LLaVA on the ids and pixels with the same fp32 eager arithmetic, and on this CPU the beam scores of
the paper and efficient cases agree bit for bit. The low-threshold case runs on the model variant that generates
the image placeholder id: there keepsight rebuilds the cache after a rollback in two forwards (the prompt with its
image, then the generated ids as text; one forward would read the generated id as an image placeholder) where the
release runs one, so the rebuilt logits differ by float32 rounding and the later beam scores by up to ~5e-7.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from keepsight.baselines.opera import OPERA, OPERAConfig, opera_beam_search
from keepsight.data import Sample, padding_side, render_prompt
from keepsight.world.models import PRESETS, build_model, preset_processor, qwen3vl_inputs

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "opera"
sys.path.insert(0, str(ROOT / "scripts" / "reference"))
import opera_released as gen  # noqa: E402  (the generator's tiny model and prompt, rebuilt here)

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- parity with the release


@pytest.fixture(scope="module")
def released():
    """The fixture and the tiny models it ran on (one per variant), rebuilt and checked against its digests."""
    meta = json.loads((FIXTURES / "meta.json").read_text())
    saved = load_file(FIXTURES / "inputs.safetensors")
    models = {}
    for variant in gen.VARIANTS:
        model, inputs, _ = gen.keepsight_model(variant)
        assert gen.state_digest(model.state_dict()) == meta["variants"][variant]["base_digest"], "the tiny model " \
            "no longer builds the weights the reference ran on: regenerate the fixtures (opera_released.py)"
        assert all(torch.equal(saved[k], inputs[k]) for k in ("input_ids", "pixel_values")), "the prompt changed"
        models[variant] = model
    return meta, load_file(FIXTURES / "outputs.safetensors"), models, inputs


def _case_config(name: str, **kw) -> OPERAConfig:
    case = gen.CASES[name]
    return OPERAConfig(num_beams=gen.COMMON["num_beams"], scale_factor=gen.COMMON["scale_factor"],
                       penalty_weights=gen.COMMON["penalty_weights"], threshold=case["threshold"],
                       num_attn_candidates=case["num_attn_candidates"], **kw)


@pytest.mark.parametrize("name", list(gen.CASES))
def test_every_beam_step_matches_the_release(released, name):
    meta, ref, models, inputs = released
    model = models[gen.CASES[name]["variant"]]
    trace, stats = [], {}
    new, score = opera_beam_search(model, {k: inputs[k] for k in ("input_ids", "pixel_values")},
                                   gen.CASES[name]["max_new_tokens"],
                                   _case_config(name, scored_prompt="embeds"),  # the release's inputs_embeds path
                                   eos_token_id=model.generation_config.eos_token_id,
                                   pad_token_id=model.generation_config.pad_token_id, stats=stats, trace=trace)
    assert torch.equal(torch.tensor([s["t"] for s in trace]), ref[f"{name}_step_t"])
    assert torch.equal(torch.tensor([s["tokens"] for s in trace]), ref[f"{name}_step_tokens"])
    assert torch.equal(torch.tensor([s["beams"] for s in trace]), ref[f"{name}_step_beams"])
    torch.testing.assert_close(torch.tensor([s["scores"] for s in trace]), ref[f"{name}_step_scores"], rtol=0,
                               atol=1e-4)
    assert torch.equal(new, ref[f"{name}_tokens"])
    assert score == pytest.approx(float(ref[f"{name}_score"][0]), abs=1e-4)
    assert stats["rollbacks"] == meta["results"][name]["rollbacks"] > 0
    assert stats["steps"] == len(trace) == meta["results"][name]["steps"]


def test_generate_api_and_stats_on_the_release_case(released):
    """The same low-threshold case through ``apply`` + ``model.generate``: HF-shaped output, and the counters."""
    meta, ref, models, inputs = released
    model = models[gen.CASES["threshold3"]["variant"]]
    opera = OPERA(_case_config("threshold3", scored_prompt="embeds"))
    with opera.apply(model):
        out = model.generate(**inputs, max_new_tokens=gen.CASES["threshold3"]["max_new_tokens"], num_beams=1)
    P = inputs["input_ids"].shape[1]
    assert torch.equal(out[:, :P], inputs["input_ids"]) and torch.equal(out[0, P:], ref["threshold3_tokens"])
    s = opera.stats()
    steps = meta["results"]["threshold3"]["steps"]
    assert s["rows"] == 1 and s["steps"] == s["acted"] == steps
    # each rollback rebuilds the cache: here the prefix holds the image placeholder id as a generated token, so the
    # prompt (with its image), the generated ids, then the last token (2 forwards where no such id was generated)
    assert s["rollbacks"] == meta["results"]["threshold3"]["rollbacks"] and s["rollback_forwards"] == 3 * s["rollbacks"]
    assert s["candidate_forwards"] == 5 * steps
    # a step: the fed token (the prefill at the first), then its 5 candidates in one forward (the release: 5)
    assert s["forwards"] == steps + steps + s["rollback_forwards"]
    assert s["changed_argmax"] is None and s["mean_logit_shift"] is None  # no plain logits to compare with


def test_a_batch_row_that_ends_early_is_padded(released):
    """The efficient case's prompt (the release's 23 tokens, eos last) left-padded in a batch with a longer prompt
    whose best beam ends with eos sooner: the first row is the release's tokens, the second its own tokens alone,
    then pad."""
    meta, ref, models, _ = released
    model = models[gen.CASES["efficient"]["variant"]]
    proc = gen.processor()
    text, img = gen.prompt(proc)
    with padding_side(proc.tokenizer, "left"):
        batch = dict(proc(text=[text, text + " ."], images=[img, img], return_tensors="pt", padding=True))
    other = dict(proc(text=[text + " ."], images=[img], return_tensors="pt"))
    eos, pad = model.generation_config.eos_token_id, model.generation_config.pad_token_id
    with OPERA(OPERAConfig.efficient(scored_prompt="embeds")).apply(model):
        out = model.generate(**batch, max_new_tokens=gen.CASES["efficient"]["max_new_tokens"])
        alone = model.generate(**other, max_new_tokens=gen.CASES["efficient"]["max_new_tokens"])
    P, n = batch["input_ids"].shape[1], ref["efficient_tokens"].shape[0]
    assert batch["attention_mask"][0, 0] == 0 and ref["efficient_tokens"][-1] == eos and out.shape == (2, P + n)
    assert torch.equal(out[0, P:], ref["efficient_tokens"])
    m = alone.shape[1] - other["input_ids"].shape[1]
    assert m < n and alone[0, -1] == eos and torch.equal(out[1, P: P + m], alone[0, -m:])
    assert (out[1, P + m:] == pad).all()


@pytest.mark.parametrize("name", list(gen.CASES))
def test_the_release_case_decoded_beside_another_prompt(released, name):
    """Each release case's prompt decoded together with a longer prompt (one forward a step for both prompts' fed
    tokens, one for both prompts' candidates): its rollbacks rebuild its own cache and splice it, left-padded, into
    the shared one (the threshold-3 case's rebuild in two forwards, its generated ids holding the image placeholder),
    and it still gives the release's tokens; the other prompt gives its tokens alone."""
    meta, ref, models, _ = released
    model = models[gen.CASES[name]["variant"]]
    proc = gen.processor()
    text, img = gen.prompt(proc)
    with padding_side(proc.tokenizer, "left"):
        batch = dict(proc(text=[text, text + " . ."], images=[img, img], return_tensors="pt", padding=True))
    other = dict(proc(text=[text + " . ."], images=[img], return_tensors="pt"))
    n = gen.CASES[name]["max_new_tokens"]
    together, alone = OPERA(_case_config(name, scored_prompt="embeds")), OPERA(_case_config(name, scored_prompt="embeds"))
    with together.apply(model):
        out = model.generate(**batch, max_new_tokens=n)
    with alone.apply(model):
        single = model.generate(**other, max_new_tokens=n)
    P, m = batch["input_ids"].shape[1], single.shape[1] - other["input_ids"].shape[1]
    assert torch.equal(out[0, P: P + ref[f"{name}_tokens"].shape[0]], ref[f"{name}_tokens"])
    assert torch.equal(out[1, P: P + m], single[0, -m:])
    s, a = together.stats(), alone.stats()
    assert s["rollbacks"] == meta["results"][name]["rollbacks"] + a["rollbacks"]
    assert s["steps"] == meta["results"][name]["steps"] + a["steps"]
    # the prefills and rebuilds run per prompt; every step's forwards are shared
    assert s["forwards"] - s["rollback_forwards"] - 2 < 2 * max(meta["results"][name]["steps"], a["steps"])


# ----------------------------------------------------------------------------- plain beam search


def _llava(text_layers: int = 4, vision_layers: int = 3):
    preset = replace(PRESETS["tiny-llava"], text_layers=text_layers, vision_layers=vision_layers)
    proc = preset_processor(preset)
    return build_model(preset, proc.tokenizer, seed=0), proc


def _images():
    return [Image.new("RGB", (64, 64), (200, 20, 20)), Image.new("RGB", (64, 64), (20, 90, 200))]


def _llava_batch(proc, questions=("describe the scene .", "is there a red circle at b2 in the picture ?")):
    imgs = _images()
    texts = [render_prompt(proc, Sample.single_turn(q, image=im)) for q, im in zip(questions, imgs)]
    with padding_side(proc.tokenizer, "left"):
        batch = dict(proc(text=texts, images=imgs, return_tensors="pt", padding=True))
    rows = [dict(proc(text=[t], images=[im], return_tensors="pt")) for t, im in zip(texts, imgs)]
    return batch, rows


@pytest.fixture(scope="module")
def llava():
    model, proc = _llava()
    batch, rows = _llava_batch(proc)
    assert batch["attention_mask"][0].sum() < batch["attention_mask"].shape[1], "the first row must be left-padded"
    return model, proc, batch, rows


def test_off_is_the_models_own_beam_search(llava):
    model, proc, batch, _ = llava
    with torch.no_grad():
        plain = model.generate(**batch, max_new_tokens=6, num_beams=5, do_sample=False)
    opera = OPERA(OPERAConfig.off())
    with opera.apply(model):
        assert torch.equal(model.generate(**batch, max_new_tokens=6), plain)  # num_beams comes from the config
    assert opera.stats()["delegated_rows"] == 2 and opera.stats()["steps"] == 0


def test_own_loop_with_every_token_a_candidate_is_hf_beam_search():
    """N = V, weight 0, no rollback: the release's step reduces to beam search (its log-softmax over the N candidates
    is the full one). Equal to transformers 5's beam search token for token here; the two beam scorers differ only
    in how a beam that ends early (eos) is length-normalised (4.29.2: by the whole input_ids, eos excluded;
    transformers 5: by the generated length, eos included), and the best beams here do not end early."""
    model, proc = _llava(text_layers=1, vision_layers=1)
    _, rows = _llava_batch(proc)
    cfg = OPERAConfig(penalty_weights=0, threshold=None, num_attn_candidates=None)
    for row in rows:
        with torch.no_grad():
            plain = model.generate(**row, max_new_tokens=4, num_beams=5, do_sample=False)
        P = row["input_ids"].shape[1]
        stats = {}
        new, _ = opera_beam_search(model, {k: row[k] for k in ("input_ids", "pixel_values")}, 4, cfg,
                                   eos_token_id=proc.tokenizer.eos_token_id, pad_token_id=proc.tokenizer.pad_token_id,
                                   stats=stats)
        assert torch.equal(new, plain[0, P:]) and proc.tokenizer.eos_token_id not in new.tolist()
        assert stats["candidate_forwards"] == 4 * model.config.text_config.vocab_size and stats["rollbacks"] == 0


def test_own_loop_is_hf_beam_search_on_qwen_vl_at_its_m_rope_positions():
    """The same reduction on Qwen3-VL, whose M-RoPE positions OPERA passes itself (as Hugging Face's generate computes
    them, each prompt its own): with every token a candidate, weight 0 and no rollback, transformers 5's beam search
    token for token."""
    from transformers import Qwen2VLImageProcessorPil

    from keepsight.world.processor import build_processor

    tok = build_processor().tokenizer
    model = build_model(replace(PRESETS["tiny-qwen3vl"], text_layers=1), tok, seed=0)
    ip = Qwen2VLImageProcessorPil(min_pixels=64 * 64, max_pixels=128 * 64, patch_size=8, merge_size=2)
    row = dict(qwen3vl_inputs(ip, tok, ["<image> describe the scene ."], [Image.new("RGB", (128, 64), (200, 20, 20))]))
    with torch.no_grad():
        plain = model.generate(**row, max_new_tokens=4, num_beams=5, do_sample=False)
    new, _ = opera_beam_search(model, {k: v for k, v in row.items() if k != "attention_mask"}, 4,
                               OPERAConfig(penalty_weights=0, threshold=None, num_attn_candidates=None),
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    P = row["input_ids"].shape[1]
    assert torch.equal(new, plain[0, P:]) and tok.eos_token_id not in new.tolist()


# ----------------------------------------------------------------------------- batches, Qwen-VL


def test_a_left_padded_batch_equals_each_row_alone(llava):
    model, proc, batch, rows = llava
    opera, apart = OPERA(), OPERA()
    with opera.apply(model):
        out = model.generate(**batch, max_new_tokens=5, num_beams=2)
    with apart.apply(model):
        alone = [model.generate(**row, max_new_tokens=5) for row in rows]
    P = batch["input_ids"].shape[1]
    assert out.shape == (2, P + 5) and torch.equal(out[:, :P], batch["input_ids"])
    for b, single in enumerate(alone):
        assert torch.equal(out[b, P:], single[0, single.shape[1] - 5:])
    s = opera.stats()
    assert s["rows"] == 2 and s["candidate_forwards"] == apart.stats()["candidate_forwards"] == 2 * 5 * 5
    # the rows decode together: a prefill each, then per step one forward for both rows' candidates and one for both
    # rows' fed tokens (the last step feeds none), where alone each row runs its own
    assert s["forwards"] == 2 + 5 + 4 < apart.stats()["forwards"] == 2 * (1 + 5 + 4)


@pytest.mark.parametrize("preset", ["tiny-qwen3vl", "tiny-qwen25vl"])
def test_qwen_vl_runs_and_rows_stand_alone(preset):
    from transformers import Qwen2VLImageProcessorPil

    from keepsight.world.processor import build_processor

    tok = build_processor().tokenizer
    model = build_model(preset, tok, seed=0)
    ip = Qwen2VLImageProcessorPil(min_pixels=64 * 64, max_pixels=128 * 64, patch_size=8, merge_size=2)
    imgs = [Image.new("RGB", (64, 64), (200, 20, 20)), Image.new("RGB", (128, 64), (20, 90, 200))]
    prompts = ["<image> describe the scene .", "<image> what is in the picture at b2 ?"]
    with padding_side(tok, "left"):
        batch = dict(qwen3vl_inputs(ip, tok, prompts, imgs))
    single = dict(qwen3vl_inputs(ip, tok, prompts[1:], imgs[1:]))
    opera = OPERA(num_attn_candidates=2)
    with opera.apply(model):
        out = model.generate(**batch, max_new_tokens=3)
        alone = model.generate(**single, max_new_tokens=3)
    P = batch["input_ids"].shape[1]
    assert out.shape == (2, P + 3) and out.dtype == torch.long and torch.equal(out[:, :P], batch["input_ids"])
    assert torch.equal(out[1, P:], alone[0, -3:])
    assert getattr(model.model, "rope_deltas", None) is None  # the M-RoPE offsets OPERA's forwards set are restored


# ----------------------------------------------------------------------------- config, removal


def test_config_defaults_presets_and_errors():
    c = OPERAConfig()
    assert (c.num_beams, c.scale_factor, c.threshold, c.num_attn_candidates, c.penalty_weights) == (5, 50.0, 15, 5, 1.0)
    e = OPERAConfig.efficient()
    assert (e.threshold, e.num_attn_candidates, e.scale_factor) == (25, 1, 50.0) and not e.disabled
    assert OPERAConfig.off().disabled and not OPERAConfig(threshold=None, num_attn_candidates=None).disabled
    for field, value in [("num_beams", 1), ("num_beams", 2.5), ("scale_factor", -1.0), ("threshold", -1),
                         ("threshold", 1.5), ("num_attn_candidates", 0), ("penalty_weights", float("nan")),
                         ("penalty_weights", -0.5), ("scored_prompt", "tokens")]:
        with pytest.raises(ValueError, match=field):
            OPERAConfig(**{field: value})
    with pytest.raises(TypeError):
        OPERA(window=3)


def test_apply_restores_generate_also_on_an_exception(llava):
    model, proc, batch, _ = llava
    original = model.generate
    assert "generate" not in model.__dict__
    opera = OPERA()
    with pytest.raises(RuntimeError, match="boom"):
        with opera.apply(model):
            assert "generate" in model.__dict__
            with pytest.raises(RuntimeError, match="already applied"):
                with opera.apply(model):
                    pass
            raise RuntimeError("boom")
    assert "generate" not in model.__dict__ and model.generate == original
    assert model.config.text_config._attn_implementation == "sdpa"
    with opera.apply(model):
        with pytest.raises(ValueError, match="do_sample"):
            model.generate(**batch, max_new_tokens=2, do_sample=True)
        with pytest.raises(ValueError, match="does not take"):
            model.generate(**batch, max_new_tokens=2, video_grid_thw=torch.ones(1, 3))
        text_only = {"input_ids": batch["input_ids"][:, -3:], "attention_mask": batch["attention_mask"][:, -3:]}
        with pytest.raises(ValueError, match="image tokens"):
            model.generate(**text_only, max_new_tokens=2)
    assert "generate" not in model.__dict__
