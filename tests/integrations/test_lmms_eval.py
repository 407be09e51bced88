"""The lmms-eval model's core (``KeepsightLMM``) without lmms-eval: tiny saved checkpoints, fake requests in
lmms-eval's simple-model ``.args`` layout, and a ``task_dict`` of docs with PIL images. The run through
lmms-eval's own evaluator is ``tests/lmms/test_lmms_eval_real.py`` (``make test-lmms``)."""

import json
import re
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import save_file

from keepsight.data import chat_example
from keepsight.integrations.lmms_eval import KeepsightLMM
from keepsight.world import generate_scenes, render, world_config
from keepsight.world.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTIONS = ["is there a red circle at b3 ?", "what scene is this ?", "describe the image in detail .",
             "is there a blue square ?"]
TASK, SPLIT = "yesno", "test"


@dataclass
class FakeInstance:
    """What the model reads of lmms-eval's ``Instance``: ``.args``."""

    request_type: str
    arguments: tuple

    @property
    def args(self):
        return self.arguments


def visual(doc):
    return [doc["image"]]


@pytest.fixture(scope="module")
def images():
    cfg = world_config()
    return [render(s, cfg.noise_std) for s in generate_scenes(cfg, len(QUESTIONS), seed=0)]


@pytest.fixture(scope="module")
def task_dict(images):
    return {TASK: {SPLIT: [{"image": im, "question": q} for im, q in zip(images, QUESTIONS)]}}


def gen_requests(gen_kwargs, ids=None):
    ids = range(len(QUESTIONS)) if ids is None else ids
    return [FakeInstance("generate_until", (QUESTIONS[i], dict(gen_kwargs), visual, i, TASK, SPLIT)) for i in ids]


def make(task_dict, **kwargs):
    lm = KeepsightLMM(**{"device": "cpu", **kwargs})
    lm.task_dict = task_dict
    return lm


@pytest.fixture(scope="module")
def base(processor, tmp_path_factory):
    model = build_model("tiny-llava", processor.tokenizer)
    path = tmp_path_factory.mktemp("base")
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def pvm_dirs(processor, base, tmp_path_factory):
    """Adapters for the base: as attach_pvm leaves it (gate 0) and with gates set to 0.5."""
    from keepsight.pvm import PVMConfig, attach_pvm, save_pvm

    model = build_model("tiny-llava", processor.tokenizer)
    attach_pvm(model, PVMConfig(layers=[1, 3], pvm_hidden_size=32))
    zero = save_pvm(model, tmp_path_factory.mktemp("pvm-zero"))
    for branch in model.pvm.values():
        branch.gate.data.fill_(0.5)
    return zero, save_pvm(model, tmp_path_factory.mktemp("pvm-half"))


def direct_generate(model, processor, images, ids, max_new_tokens):
    """Left-padded greedy ``model.generate`` on the chat prompts, decoded like the evaluator reads it."""
    tok = processor.tokenizer
    old, tok.padding_side = tok.padding_side, "left"
    try:
        enc = processor(text=[chat_example(processor, QUESTIONS[i]) for i in ids], images=[images[i] for i in ids],
                        return_tensors="pt", padding=True)
    finally:
        tok.padding_side = old
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    return [t.strip() for t in tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)]


def direct_logprob(model, processor, image, question, continuation):
    """Sum of log-probabilities of ``continuation``'s tokens after the chat prompt, from one forward."""
    prompt = chat_example(processor, question)
    n_prompt = processor(text=[prompt], images=[image], return_tensors="pt")["input_ids"].shape[1]
    enc = processor(text=[prompt + continuation], images=[image], return_tensors="pt")
    with torch.no_grad():
        logp = model(**enc).logits[0].float().log_softmax(-1)  # [T, V]
    target = enc["input_ids"][0, n_prompt:]
    rows = logp[n_prompt - 1 : -1]
    return float(rows.gather(-1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all())


# ----------------------------------------------------------------------------- method none


def test_generate_until_matches_model_generate(base, processor, images, task_dict):
    model, path = base
    lm = make(task_dict, pretrained=str(path), max_new_tokens="5")  # string model_args, as lmms-eval may pass
    assert (lm.method, lm.batch_size, lm.decode.max_new_tokens, lm.dtype) == ("none", 1, 5, torch.float32)
    out = lm.generate_until(gen_requests({"temperature": 0, "do_sample": False}))
    assert out == [direct_generate(model, processor, images, [i], 5)[0] for i in range(len(QUESTIONS))]
    assert all(isinstance(t, str) and t for t in out)
    # the task's max_new_tokens wins over the model argument
    assert lm.generate_until(gen_requests({"max_new_tokens": 2}, [0])) == direct_generate(model, processor, images,
                                                                                         [0], 2)


def test_batched_generation_and_stop_strings(base, processor, images, task_dict):
    model, path = base
    lm = make(task_dict, pretrained=path, batch_size=2)
    expected = direct_generate(model, processor, images, [0, 1], 6) + direct_generate(model, processor, images,
                                                                                      [2, 3], 6)
    assert lm.generate_until(gen_requests({"max_new_tokens": 6})) == expected
    words = expected[0].split()
    stop = words[1] if len(words) > 1 else words[0]
    cut = expected[0][: expected[0].find(stop)].strip()
    assert lm.generate_until(gen_requests({"max_new_tokens": 6, "until": [stop]}, [0])) == [cut]
    assert lm.generate_until(gen_requests({"max_new_tokens": 6, "until": stop}, [0])) == [cut]
    # different gen_kwargs never share a batch: each request keeps its own settings
    mixed = gen_requests({"max_new_tokens": 6}, [0]) + gen_requests({"max_new_tokens": 2}, [1])
    assert lm.generate_until(mixed) == [expected[0], direct_generate(model, processor, images, [1], 2)[0]]


def test_loglikelihood_matches_the_logits(base, processor, images, task_dict):
    model, path = base
    lm = make(task_dict, pretrained=path)
    reqs = [FakeInstance("loglikelihood", (QUESTIONS[0], " yes", visual, 0, TASK, SPLIT)),
            FakeInstance("loglikelihood", (QUESTIONS[0], " no", visual, 0, TASK, SPLIT)),
            FakeInstance("loglikelihood", (QUESTIONS[1], lambda doc: " a red circle", visual, 1, TASK, SPLIT))]
    got = lm.loglikelihood(reqs)
    want = [direct_logprob(model, processor, images[0], QUESTIONS[0], " yes"),
            direct_logprob(model, processor, images[0], QUESTIONS[0], " no"),
            direct_logprob(model, processor, images[1], QUESTIONS[1], " a red circle")]
    for (ll, greedy), (ll2, greedy2) in zip(got, want):
        assert ll == pytest.approx(ll2, abs=1e-4) and ll < 0 and greedy == greedy2
    # the greedy continuation is reported as greedy
    first = direct_generate(model, processor, images, [0], 1)[0]
    ll, greedy = lm.loglikelihood([FakeInstance("loglikelihood", (QUESTIONS[0], " " + first, visual, 0, TASK,
                                                                  SPLIT))])[0]
    assert greedy and ll == pytest.approx(direct_logprob(model, processor, images[0], QUESTIONS[0], " " + first)[0],
                                          abs=1e-4)
    # ll_output=nll (what lmms-eval's multiple_choice argmin needs) is the same number negated
    nll = make(task_dict, pretrained=path, ll_output="nll").loglikelihood(reqs)
    assert [(-a, b) for a, b in nll] == got
    assert lm.loglikelihood([FakeInstance("loglikelihood", (QUESTIONS[0], "", visual, 0, TASK, SPLIT))]) == [(0.0, True)]
    assert lm.loglikelihood([FakeInstance("loglikelihood", (QUESTIONS[0], " yes"))])[0][0] < 0  # no image


def test_multi_round_and_non_image_visuals_are_clear_errors(base, task_dict):
    lm = make(task_dict, pretrained=base[1])
    with pytest.raises(NotImplementedError, match="generate_until_multi_round"):
        lm.generate_until_multi_round([])
    with pytest.raises(ValueError, match="images only"):
        lm.generate_until([FakeInstance("generate_until", ("q", {}, lambda doc: ["clip.mp4"], 0, TASK, SPLIT))])
    with pytest.raises(ValueError, match="simple-model layout"):
        lm.generate_until([FakeInstance("generate_until", ("q", {}, visual, 0, TASK))])
    with pytest.raises(KeyError, match="no document 9"):
        lm.generate_until(gen_requests({}, [0])[:0] + [FakeInstance("generate_until",
                                                                    ("q", {}, visual, 9, TASK, SPLIT))])


# ----------------------------------------------------------------------------- PVM and bridge


def test_pvm_adapter_is_applied(base, processor, images, task_dict, pvm_dirs):
    from keepsight.pvm import load_pvm

    model, path = base
    zero, half = pvm_dirs
    base_lm = make(task_dict, pretrained=path)
    ll_req = [FakeInstance("loglikelihood", (QUESTIONS[2], " this is a", visual, 2, TASK, SPLIT))]
    base_out, base_ll = base_lm.generate_until(gen_requests({"max_new_tokens": 6})), base_lm.loglikelihood(ll_req)

    lm0 = make(task_dict, pretrained=path, method="pvm", pvm=str(zero))
    assert sorted(lm0.model.pvm) == ["1", "3"]
    assert lm0.generate_until(gen_requests({"max_new_tokens": 6})) == base_out
    assert lm0.loglikelihood(ll_req)[0][0] == pytest.approx(base_ll[0][0], abs=1e-5)

    lm_half = make(task_dict, pretrained=path, method="pvm", pvm=half)
    assert lm_half.model.pvm["1"].gate.item() == 0.5
    assert lm_half.loglikelihood(ll_req)[0][0] != pytest.approx(base_ll[0][0], abs=1e-4)
    with_pvm = load_pvm(build_model("tiny-llava", processor.tokenizer), half)
    expected = [direct_generate(with_pvm, processor, images, [i], 6)[0] for i in range(len(QUESTIONS))]
    assert lm_half.generate_until(gen_requests({"max_new_tokens": 6})) == expected


def test_bridged_checkpoint(processor, images, task_dict, tmp_path):
    from keepsight.bridge.swap import LlavaBridgeForConditionalGeneration, replace_projector

    model = replace_projector(build_model("tiny-llava", processor.tokenizer), "lia_mtr").eval()
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    lm = make(task_dict, pretrained=tmp_path, method="bridge")
    assert type(lm.model) is LlavaBridgeForConditionalGeneration
    out = lm.generate_until(gen_requests({"max_new_tokens": 4}, [0, 1]))
    assert out == [direct_generate(model, processor, images, [i], 4)[0] for i in (0, 1)]
    assert make(task_dict, pretrained=tmp_path).generate_until(gen_requests({"max_new_tokens": 4}, [0, 1])) == out


# ----------------------------------------------------------------------------- diffusion


@pytest.fixture(scope="module")
def llada_dir(processor, vlm, tmp_path_factory):
    path = tmp_path_factory.mktemp("llada")
    vlm.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def test_diffusion_generates_and_matches_the_sampler(llada_dir, vlm, processor, images, task_dict):
    from keepsight.diffusion import generate as diffuse

    lm = make(task_dict, pretrained=llada_dir, method="diffusion", steps="4", gen_length="8", block_length="4")
    out = lm.generate_until(gen_requests({"max_new_tokens": 64}, [0, 1]))
    assert len(out) == 2 and all(isinstance(t, str) for t in out)
    tok = processor.tokenizer
    enc = processor(text=[chat_example(processor, QUESTIONS[0])], images=[images[0]], return_tensors="pt")
    gen = diffuse(vlm, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], gen_length=8, steps=4,
                  block_length=4, suppress_token_ids=[tok.pad_token_id, tok.bos_token_id],
                  generator=torch.Generator().manual_seed(0)).generated[0].tolist()
    if tok.eos_token_id in gen:
        gen = gen[: gen.index(tok.eos_token_id)]
    assert out[0] == tok.decode(gen, skip_special_tokens=True).strip()
    with pytest.raises(ValueError, match="min_new_tokens applies to autoregressive decoding"):
        lm.generate_until(gen_requests({"max_new_tokens": 8, "min_new_tokens": 8}, [0]))
    with pytest.raises(NotImplementedError, match="method=diffusion"):
        lm.loglikelihood([FakeInstance("loglikelihood", (QUESTIONS[0], " yes", visual, 0, TASK, SPLIT))])


def test_mps_lam_zero_and_mrs_beta_zero_change_nothing(llada_dir, task_dict):
    common = {"pretrained": llada_dir, "method": "diffusion", "steps": 4, "gen_length": 8}
    plain = make(task_dict, **common).generate_until(gen_requests({}))
    lm = make(task_dict, **common, mps="true", mps_lam="0.0", mrs='{"beta": 0}')
    assert lm.mps == {"k": 3, "lam": 0.0} and lm.mrs == {"beta": 0.0, "eta": 8.0, "tau0": 0.6}
    assert lm.generate_until(gen_requests({})) == plain
    strong = make(task_dict, **common, mps_lam=1.0, mps_k=2, mrs_beta=0.5)  # flat settings switch the fixes on
    assert strong.mps == {"k": 2, "lam": 1.0} and strong.mrs["beta"] == 0.5
    changed = strong.generate_until(gen_requests({}))
    assert all(isinstance(t, str) for t in changed) and changed != plain


def test_the_sampler_s_fast_decoding_is_a_model_argument(llada_dir, vlm, processor, images, task_dict,
                                                         monkeypatch):
    """sampler_cache / sampler_threshold / ... reach keepsight.diffusion.generate: the cached sampler's answer is
    the sampler's own at those settings; a bad value or an unknown field is refused before the model loads."""
    import keepsight.inference.pipeline as pipeline_module
    from keepsight.diffusion import generate as diffuse

    seen = []
    monkeypatch.setattr(pipeline_module, "diffusion_generate", lambda *a, **k: seen.append(k) or diffuse(*a, **k))
    lm = make(task_dict, pretrained=llada_dir, method="diffusion", steps=8, gen_length=8, block_length=4,
              sampler_cache="dual", sampler_threshold="0.5")
    assert lm.sampler == {"cache": "dual", "threshold": 0.5}
    out = lm.generate_until(gen_requests({"max_new_tokens": 8}, [0]))
    tok = processor.tokenizer
    enc = processor(text=[chat_example(processor, QUESTIONS[0])], images=[images[0]], return_tensors="pt")
    gen = diffuse(vlm, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], gen_length=8, steps=8,
                  block_length=4, suppress_token_ids=[tok.pad_token_id, tok.bos_token_id], cache="dual",
                  threshold=0.5, generator=torch.Generator().manual_seed(0)).generated[0].tolist()
    if tok.eos_token_id in gen:
        gen = gen[: gen.index(tok.eos_token_id)]
    assert out[0] == tok.decode(gen, skip_special_tokens=True).strip()
    assert seen[0]["cache"] == "dual" and seen[0]["threshold"] == 0.5
    with pytest.raises(ValueError, match=r"unknown sampler setting\(s\) \['sampler_steps'\]"):
        make(task_dict, pretrained=llada_dir, method="diffusion", sampler_steps=4)
    with pytest.raises(ValueError, match="cache must be one of"):
        make(task_dict, pretrained=llada_dir, method="diffusion", sampler_cache="all")
    with pytest.raises(ValueError, match=r"sampler.cache only apply to method=diffusion"):
        make(task_dict, pretrained=llada_dir, sampler_cache="prefix")


def test_every_mps_and_mrs_config_field_is_a_model_argument(llada_dir, task_dict):
    """The model arguments come from MPSConfig / MRSConfig's fields: the strength, the subspace, the RoPE schedule
    and segments reach the fixes, and a name that is no field (a reading's setting among them) is refused by name."""
    lm = make(task_dict, pretrained=llada_dir, method="diffusion", steps=4, gen_length=8, mps_k="2", mps_lam="0.2",
              mrs_schedule="cosine", mrs_segments="visual;generation")
    assert lm.mps == {"k": 2, "lam": 0.2}
    assert lm.mrs["schedule"] == "cosine" and lm.mrs["segments"] == ["visual", "generation"]
    with pytest.raises(ValueError, match=r"mps: unknown setting\(s\) \['cache_dir'\]"):
        make(task_dict, pretrained=llada_dir, method="diffusion", mps_cache_dir="/tmp")
    with pytest.raises(ValueError, match=r"mrs: unknown setting\(s\) \['mode'\]"):
        make(task_dict, pretrained=llada_dir, method="diffusion", mrs_mode="frequency")


def test_diffusion_lengths_and_the_llada_v_layout(llada_dir, vlm, tmp_path, task_dict):
    lm = make(task_dict, pretrained=llada_dir, method="diffusion", block_length=4)
    assert lm.diffusion_settings(10) == (12, 12, 4)  # rounded up to whole blocks, one token a step
    assert make(task_dict, pretrained=llada_dir, method="diffusion").diffusion_settings(10) == (10, 10, 10)
    # a checkpoint with LLaDA-V's own (LLaVA repository) names loads through load_llada_v to the same outputs
    state = {}
    for k, v in vlm.state_dict().items():
        k = re.sub(r"^model\.language_model\.", "model.", k)
        k = k.replace("model.multi_modal_projector.linear_1.", "model.mm_projector.0.")
        k = k.replace("model.multi_modal_projector.linear_2.", "model.mm_projector.2.")
        state[re.sub(r"^model\.vision_tower\.", "model.vision_tower.vision_tower.", k)] = v.clone().contiguous()
    save_file(state, str(tmp_path / "model.safetensors"))
    vlm.config.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "processor_config.json", "chat_template.jinja"):
        if (llada_dir / name).exists():
            (tmp_path / name).write_bytes((llada_dir / name).read_bytes())
    args = {"method": "diffusion", "steps": 4, "gen_length": 8}
    assert (make(task_dict, pretrained=tmp_path, **args).generate_until(gen_requests({}))
            == make(task_dict, pretrained=llada_dir, **args).generate_until(gen_requests({})))


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("kwargs, error, match", [
    ({"method": "beam"}, ValueError, "method must be one of"),
    ({"pvm": "adapters/pvm"}, ValueError, "pass method=pvm"),
    ({"method": "pvm"}, ValueError, "needs pvm=<a PVM adapter directory"),
    ({"mps": True}, ValueError, "only apply to method=diffusion"),
    ({"mrs_beta": 0.1}, ValueError, "only apply to method=diffusion"),
    ({"steps": 8}, ValueError, "only apply to method=diffusion"),
    ({"method": "diffusion"}, ValueError, "runs on diffusion checkpoints \\(a masked-diffusion VLM"),
    ({"method": "bridge"}, ValueError, "bridge-converted checkpoint"),
    ({"batch_size": "two"}, ValueError, "batch_size must be an integer"),
    ({"batch_size": "auto"}, ValueError, "automatic batch sizing"),
    ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be >= 1"),
    ({"dtype": "float8"}, ValueError, "dtype must be one of"),
    ({"device": "tpu"}, ValueError, "device must be"),
    ({"ll_output": "prob"}, ValueError, "ll_output must be one of"),
    ({"temperature": 0.5}, ValueError, r"unknown model argument\(s\) \['temperature'\]"),
    ({"method": "diffusion", "mps": "false", "mps_lam": 0.1}, ValueError, "contradicts"),
    ({"method": "diffusion", "mps": '{"lambda": 1}'}, ValueError, r"unknown setting\(s\) \['lambda'\]"),
    ({"method": "diffusion", "mrs": "{beta: 1}"}, ValueError, "not a JSON object"),
    ({"method": "diffusion", "mps_k": "three"}, ValueError, "mps.k must be an integer"),
])
def test_bad_arguments(base, kwargs, error, match):
    with pytest.raises(error, match=match):
        KeepsightLMM(pretrained=base[1], **{"device": "cpu", **kwargs})


def test_cuda_without_cuda(base):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="CUDA is not available"):
        KeepsightLMM(pretrained=base[1], device="cuda")


def test_checkpoint_errors(base, llada_dir, pvm_dirs, processor, tmp_path):
    with pytest.raises(ValueError, match="pretrained=<checkpoint directory> is required"):
        KeepsightLMM()
    with pytest.raises(FileNotFoundError, match="no such directory"):
        KeepsightLMM(pretrained=tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        KeepsightLMM(pretrained=tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported architecture model_type='gpt2'"):
        KeepsightLMM(pretrained=tmp_path)
    with pytest.raises(ValueError, match="evaluate it with method=diffusion"):
        KeepsightLMM(pretrained=llada_dir)
    with pytest.raises(FileNotFoundError, match="is not a PVM adapter"):
        KeepsightLMM(pretrained=base[1], method="pvm", pvm=tmp_path)
    # an adapter made for another model is refused with what differs
    from keepsight.pvm import attach_pvm, save_pvm

    other = build_model("tiny-llava-6l", processor.tokenizer)
    attach_pvm(other)
    save_pvm(other, tmp_path / "other")
    with pytest.raises(ValueError, match="num_layers: adapter 6 vs model 4"):
        KeepsightLMM(pretrained=base[1], method="pvm", pvm=tmp_path / "other")
    # a model saved without its processor
    model_only = tmp_path / "model-only"
    base[0].save_pretrained(model_only)
    with pytest.raises((RuntimeError, ValueError), match="processor"):
        KeepsightLMM(pretrained=model_only)


def test_the_lmms_class_needs_lmms_eval():
    import importlib.util

    import keepsight.integrations.lmms_eval as mod

    if importlib.util.find_spec("lmms_eval") is not None:
        pytest.skip("lmms-eval is installed here; tests/lmms covers the real class")
    with pytest.raises(ImportError, match=r"pip install 'keepsight\[lmms\]'"):
        mod.KeepsightLMMEval  # noqa: B018
    with pytest.raises(AttributeError):
        mod.NoSuchThing  # noqa: B018
