"""``keepsight.inference``: the method registry (every method listed once; a new method is a module plus one
registration, the documented example run as written) and ``Pipeline`` (load + method + decode) against a plain
``model.generate`` on the same chat prompts."""

import re
import textwrap
from pathlib import Path

import pytest
import torch

from families import registered_settings
from keepsight import methods as registry_module
from keepsight.data import chat_example
from keepsight.inference import (
    METHODS,
    Decoders,
    Generation,
    Pipeline,
    method_names,
)
from keepsight.world import generate_scenes, render, world_config
from keepsight.world.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTIONS = ["is there a red circle at b3 ?", "describe the image in detail ."]


@pytest.fixture(scope="module")
def images():
    cfg = world_config()
    return [render(s, cfg.noise_std) for s in generate_scenes(cfg, len(QUESTIONS), seed=0)]


@pytest.fixture(scope="module")
def base(processor, tmp_path_factory):
    torch.manual_seed(0)
    model = build_model("tiny-llava", processor.tokenizer)
    path = tmp_path_factory.mktemp("base")
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return model, path


@pytest.fixture
def example_method():
    """The registry docstring's ten-line example, run as written; unregistered afterwards."""
    doc = registry_module.__doc__
    code = textwrap.dedent(doc[doc.index("    from dataclasses import dataclass"): doc.index("A package outside keepsight")])
    namespace: dict = {}
    exec(compile(code, "registry-example", "exec"), namespace)
    yield namespace
    METHODS.pop("damp", None)


def direct_greedy(model, processor, images, max_new_tokens):
    tok = processor.tokenizer
    old, tok.padding_side = tok.padding_side, "left"
    try:
        enc = processor(text=[chat_example(processor, q) for q in QUESTIONS], images=images, return_tensors="pt",
                        padding=True)
    finally:
        tok.padding_side = old
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    return [t.strip() for t in tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)]


def test_every_decoding_method_declares_how_it_is_tested(example_method):
    """Each decoding method's config names its zero-strength and at-strength settings (which the family and baseline
    tests read from the registry) or the test file of a method those tests do not fit; a new method with its settings
    joins them with no list edited (the documented example)."""
    root = Path(__file__).resolve().parents[2]
    for name in method_names("decode"):
        entry = METHODS[name]
        if entry.tested_by is not None:
            assert (root / entry.tested_by).is_file(), f"{name}: {entry.tested_by} does not exist"
            continue
        assert entry.zero is not None and entry.strong is not None, (
            f"{name}: its config declares neither ZERO and STRONG nor TESTED_BY")
        entry.make(entry.zero), entry.make(entry.strong)  # both are valid settings
    zero, strong = registered_settings()
    assert zero["damp"] == {"factor": 1.0} and strong["damp"] == {"factor": 4.0}
    assert {"vcd", "pai", "memvr", "deco"} <= set(zero) and "opera" not in zero


def test_pipeline_decodes_as_plain_generate(base, processor, images):
    model, path = base
    pipe = Pipeline(path, device="cpu")
    out = pipe.generate(QUESTIONS, images, max_new_tokens=6)
    assert isinstance(out, Generation) and out.stats == {}
    assert out.texts == direct_greedy(model, processor, images, 6)
    with pytest.raises(ValueError, match="give images_per_prompt"):
        pipe.generate(QUESTIONS, images[:1])
    with pytest.raises(ValueError, match=r"images_per_prompt \[2, 1\] does not fit"):
        pipe.generate(QUESTIONS, images, images_per_prompt=[2, 1])


def test_a_model_in_memory_decodes_as_its_saved_checkpoint(base, processor, images):
    """``Pipeline.from_model`` (the world's scoring): the loaded checkpoint's answers, token for token, and a decoding
    method applied around it acts as in the loaded pipeline (a diffusion model's: tests/inference/
    test_diffusion_pipeline.py)."""
    model, path = base
    loaded = Pipeline(path, device="cpu").generate(QUESTIONS, images, max_new_tokens=6).texts
    pipe = Pipeline.from_model(model, processor)
    assert pipe.generate(QUESTIONS, images, max_new_tokens=6).texts == loaded
    prompts = [pipe.chat_prompt(q, 1) for q in QUESTIONS]
    assert pipe.answer(pipe.encode(prompts, [[im] for im in images]), {"max_new_tokens": 6}) == loaded
    vcd = Pipeline(path, device="cpu", baseline="vcd").generate(QUESTIONS, images, max_new_tokens=6).texts
    method = Decoders([("vcd", {})], family="autoregressive")
    enc = pipe.encode(prompts, [[im] for im in images])
    with method.applied(model, enc["input_ids"].shape[1]):
        assert pipe.answer(enc, {"max_new_tokens": 6}) == vcd
    assert method.stats()["vcd"]
    assert Pipeline.from_model(model, processor, baseline="vcd").answer(enc, {"max_new_tokens": 6}) == vcd


def test_min_new_tokens_holds_the_end_of_sequence_back(base, processor, images):
    """What a benchmark asks to time a fixed length: with each row's first greedy token made an end of sequence,
    a plain answer stops there and one with ``min_new_tokens`` runs on, as ``model.generate`` does."""
    model, _ = base
    pipe = Pipeline.from_model(model, processor)
    enc = pipe.encode([pipe.chat_prompt(q, 1) for q in QUESTIONS], [[im] for im in images])
    with torch.no_grad():
        first = model.generate(**enc, max_new_tokens=1, do_sample=False)[:, -1]
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = sorted(set(first.tolist()))
    try:
        stopped = pipe.answer(enc, {"max_new_tokens": 6})
        held = pipe.answer(enc, {"max_new_tokens": 6, "min_new_tokens": 6})
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    finally:
        model.generation_config.eos_token_id = saved
    n = enc["input_ids"].shape[1]
    assert held == [t.strip() for t in pipe.tokenizer.batch_decode(gen[:, n:], skip_special_tokens=True)]
    assert gen.shape[1] == n + 6 and bool((gen[:, n] != first).all())
    assert all(len(h) > len(s) for h, s in zip(held, stopped))
    with pytest.raises(ValueError, match="min_new_tokens 7 is more than max_new_tokens 6"):
        pipe.answer(enc, {"max_new_tokens": 6, "min_new_tokens": 7})


def test_each_model_side_method_refuses_what_is_not_its_own(base, processor, vlm, tmp_path):
    """The refusals come from the registry's model-side entries (their family, ``takes``, ``requires``, ``check``),
    each before the load."""
    _, path = base
    llada = tmp_path / "llada"
    vlm.save_pretrained(llada)
    processor.save_pretrained(llada)
    for kwargs, match in [({"pvm": "adapters/pvm"}, "pvm only apply to method=pvm .*pass method=pvm"),
                          ({"method": "pvm"}, r"method=pvm needs pvm=<a PVM adapter directory"),
                          ({"steps": 8, "mps": {}}, "steps, mps only apply to method=diffusion"),
                          ({"sampler": {"cache": "prefix"}}, "sampler.cache only apply to method=diffusion"),
                          ({"method": "diffusion"}, r"method=diffusion runs on diffusion checkpoints \(a "
                                                    "masked-diffusion VLM .*'llava' "
                                                    r"\(autoregressive\): evaluate it with "
                                                    r"method=bridge\|none\|pvm"),
                          ({"method": "bridge"}, "expects a bridge-converted checkpoint")]:
        with pytest.raises(ValueError, match=match):
            Pipeline(path, device="cpu", **kwargs)
    with pytest.raises(ValueError, match="evaluate it with method=diffusion"):
        Pipeline(llada, device="cpu")
    with pytest.raises(ValueError, match="baseline=vcd decodes autoregressive models; method is diffusion"):
        Pipeline(llada, device="cpu", method="diffusion", baseline="vcd")
    with pytest.raises(ValueError, match="pvm only apply to method=pvm"):
        Pipeline(llada, device="cpu", method="diffusion", pvm="adapters/pvm")


def test_pipeline_reports_each_decoding_methods_stats(base, images):
    _, path = base
    out = Pipeline(path, device="cpu", baseline="vcd").generate(QUESTIONS, images, max_new_tokens=4)
    assert set(out.stats) == {"vcd"} and out.stats["vcd"]["forwards"] == 4
    with pytest.raises(ValueError, match="unknown method 'mps'"):
        Pipeline(path, device="cpu", baseline="mps")
    with pytest.raises(ValueError, match="baseline settings given without a baseline"):
        Pipeline(path, device="cpu", baseline_args={"alpha": 1.0})


def test_a_new_method_is_a_module_and_one_registration(base, processor, images, example_method):
    """The documented example: identity at factor 1, and at factor -1 greedy picks the least likely token."""
    model, path = base
    assert METHODS["damp"].family == "autoregressive" and METHODS["damp"].config is example_method["DampConfig"]
    plain = direct_greedy(model, processor, images, 5)
    same = Pipeline(path, device="cpu", baseline="damp", baseline_args={"factor": 1.0})
    out = same.generate(QUESTIONS, images, max_new_tokens=5)
    assert out.texts == plain
    assert out.stats["damp"]["forwards"] == 5 and out.stats["damp"]["acted"] == 0
    flipped = Pipeline(path, device="cpu", baseline="damp", baseline_args={"factor": -1.0})
    out = flipped.generate(QUESTIONS, images, max_new_tokens=5)
    assert out.texts != plain and out.stats["damp"]["acted"] == 5 and out.stats["damp"]["changed_argmax"] > 0
    assert re.search(r"\bdamp\b", " ".join(method_names("decode")))


def test_generation_past_the_models_positions_is_refused(base, images):
    _, path = base
    pipe = Pipeline(path, device="cpu")
    limit = pipe.model.config.text_config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"max_new_tokens {limit} \+ prompt \d+ exceeds the model's "
                                         rf"max_position_embeddings {limit}"):
        pipe.generate(QUESTIONS, images, max_new_tokens=limit)


def test_non_finite_pixels_are_refused_by_every_baseline(base, processor, images):
    from keepsight.baselines import build_baseline

    model, _ = base
    enc = processor(text=[chat_example(processor, QUESTIONS[0])], images=images[:1], return_tensors="pt")
    enc["pixel_values"][0, 0, 0, 0] = float("nan")
    for name in ("vcd", "pai", "memvr", "deco", "opera"):
        with build_baseline(name).apply(model), pytest.raises(ValueError, match="pixel_values holds NaN or inf"):
            model.generate(**enc, max_new_tokens=2, do_sample=False)


def test_decoders_apply_a_method_around_any_loop_as_the_pipeline_does(base, processor, images):
    """``Decoders`` (what the experiments and benchmarks apply) around a plain ``generate`` gives the Pipeline's
    answers and stats, and leaves the model plain on exit."""
    model, path = base
    pipe = Pipeline(path, device="cpu", baseline="vcd", baseline_args={"alpha": 2.0})
    expected = pipe.generate(QUESTIONS, images, max_new_tokens=4)
    decoders = Decoders([("vcd", {"alpha": 2.0})], family="autoregressive").prepare(model, processor.tokenizer)
    assert decoders.names() == ["vcd"] and len(decoders) == 1
    with decoders.applied(model):
        texts = direct_greedy(model, processor, images, 4)
    assert texts == expected.texts and decoders.stats() == expected.stats
    assert direct_greedy(model, processor, images, 4) == direct_greedy(pipe.model, processor, images, 4)
    with pytest.raises(ValueError, match="unknown method 'mps'"):
        Decoders([("mps", {})], family="autoregressive")
    with pytest.raises(ValueError, match="alpha must be >= 0.0"):  # built at once: bad settings before any loop
        Decoders([("vcd", {"alpha": -1.0})])


def test_a_registered_method_gets_its_command_line_options(example_method):
    from keepsight.cli import build_parser
    from keepsight.commands.method_options import baseline_choice

    args = build_parser().parse_args(["eval", "generate", "--model", "m", "--data", "d", "--out", "o",
                                      "--damp.factor", "0.25"])
    assert baseline_choice(args) == ("damp", {"factor": 0.25})
