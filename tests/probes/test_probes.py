import pytest
import torch

from keepsight.data import chat_example
from keepsight.inference import Pipeline
from keepsight.models import check_layers
from keepsight.probes import LogitLens, VisualAttentionProbe
from keepsight.world import generate_scenes, render, world_config
from keepsight.world.models import build_model, get_preset, preset_processor, qwen3vl_inputs
from keepsight.world.texts import DESCRIBE_PROMPT

PRESETS = ["tiny-llava", "tiny-qwen3vl", "tiny-qwen25vl"]


def tiny_inputs(preset, processor, prompts):
    """A left-padded batch (prompts of different lengths) for ``preset``."""
    tok = processor.tokenizer
    cfg = world_config()
    images = [render(s, cfg.noise_std) for s in generate_scenes(cfg, len(prompts), seed=0)]
    texts = [chat_example(processor, p) for p in prompts]
    old, tok.padding_side = tok.padding_side, "left"
    try:
        arch = get_preset(preset).arch
        if arch == "llava":
            return preset_processor(preset)(text=texts, images=images, return_tensors="pt", padding=True)
        from transformers import Qwen2VLImageProcessorPil

        ip = Qwen2VLImageProcessorPil(min_pixels=64 * 64, max_pixels=64 * 64, patch_size=8, merge_size=2)
        inputs = qwen3vl_inputs(ip, tok, texts, images)
        if arch == "qwen2_5_vl":
            inputs.pop("mm_token_type_ids")
        return inputs
    finally:
        tok.padding_side = old


PROMPTS = [DESCRIBE_PROMPT, "is there a red circle at b3 ?", "what scene is this ?"]


def assert_cached_scores_match_full(model, inputs: dict, out) -> None:
    """Each step's scores of a cached ``generate`` (``out``, no padding in ``inputs``) equal one uncached forward
    over the generated sequence."""
    b, new = out.sequences.shape[0], len(out.scores) - 1
    full = dict(inputs)
    full["input_ids"] = out.sequences[:, :-1]
    full["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones(b, new, dtype=torch.long)], 1)
    if "mm_token_type_ids" in full:
        full["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros(b, new, dtype=torch.long)], 1)
    with torch.no_grad():
        logits = model(**full).logits  # [B, T, V]
    n = inputs["input_ids"].shape[1]
    for step, scores in enumerate(out.scores):
        torch.testing.assert_close(scores, logits[:, n - 1 + step], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
def test_probe_matches_eager_attentions_on_a_left_padded_batch(preset, processor):
    model = build_model(preset, processor.tokenizer)
    inputs = tiny_inputs(preset, processor, PROMPTS)
    assert (inputs["attention_mask"] == 0).any()  # really padded
    with VisualAttentionProbe(model) as probe:
        with torch.no_grad():
            model(**inputs)
    omega, tvr = probe.omega_v()[0], probe.tvr()[0]  # [L, B, H]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        ref = model(**inputs, output_attentions=True).attentions
    visual = inputs["input_ids"] == processor.tokenizer.image_token_id  # [B, T]
    assert len(ref) == omega.shape[0]
    for layer, attn in enumerate(ref):
        w = attn[:, :, -1, :].double()  # [B, H, T]
        zv = (w * visual[:, None]).sum(-1)
        zt = (w * (~visual & inputs["attention_mask"].bool())[:, None]).sum(-1)
        torch.testing.assert_close(omega[layer].double(), zv, atol=1e-5, rtol=0)
        torch.testing.assert_close(tvr[layer].double(), zt / zv, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
def test_generation_identical_with_probe_and_memory_is_per_step_scalars(preset, processor):
    model = build_model(preset, processor.tokenizer)
    inputs = tiny_inputs(preset, processor, PROMPTS)
    plain = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    with VisualAttentionProbe(model, layers=[0, -1]) as probe:
        probed = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    assert torch.equal(plain, probed)
    heads = model.config.text_config.num_attention_heads
    # prefill + 5 decode steps, 2 layers, 3 rows, H heads: scalars only, nothing sized by the sequence
    assert probe.omega_v().shape == (6, 2, 3, heads)
    assert all(t.shape == (2, 3, heads) for t in probe.log_ratio)
    assert ((probe.omega_v() > 0) & (probe.omega_v() < 1)).all()
    # the model's own attention implementation is restored on exit
    assert model.model.language_model.config._attn_implementation != "keepsight_probe"


def test_probe_errors(processor):
    model = build_model("tiny-llava", processor.tokenizer)
    with pytest.raises(ValueError, match="layers: layer 4 is out of range for a model with 4 decoder layers"):
        VisualAttentionProbe(model, layers=[4])
    enc = processor.tokenizer(["<bos>user : what scene is this ? assistant :"], return_tensors="pt")
    with pytest.raises(ValueError, match="no image tokens"):
        with VisualAttentionProbe(model):
            model(**enc)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    lm = Qwen3ForCausalLM(Qwen3Config(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=32, head_dim=8))
    with pytest.raises(ValueError, match="unsupported architecture 'qwen3'"):
        VisualAttentionProbe(lm)
    with pytest.raises(ValueError, match="repeat"):
        check_layers([1, 1], 4)


@pytest.mark.parametrize("preset", ["tiny-llava", "tiny-qwen3vl"])
def test_logit_lens_matches_direct_computation(preset, processor):
    model = build_model(preset, processor.tokenizer)
    inputs = tiny_inputs(preset, processor, PROMPTS[:2])
    lens = LogitLens(model)
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    r = lens.from_hidden_states(out.hidden_states)
    n = len(out.hidden_states) - 1
    assert r["kl"].shape == (n, 2)
    assert torch.all(r["kl"][-1].abs() < 1e-6) and torch.all(r["rank"][-1] == 0)
    assert r["top1_agree"][-1].all()
    # direct: layer 1 through the final norm and lm_head
    lm = model.model.language_model
    logp1 = model.lm_head(lm.norm(out.hidden_states[1][:, -1])).float().log_softmax(-1)
    final = out.logits[:, -1].float().log_softmax(-1)
    kl1 = torch.nn.functional.kl_div(logp1, final, log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(r["kl"][0], kl1, atol=1e-5, rtol=1e-4)
    top = final.argmax(-1)
    rank1 = (logp1 > logp1.gather(-1, top[:, None])).sum(-1)
    assert torch.equal(r["rank"][0], rank1)
    for b in range(2):
        agree = [bool(r["top1_agree"][layer, b]) for layer in range(n)]
        first = next(layer for layer in range(n) if all(agree[layer:]))
        assert r["convergence_layer"][b].item() == first
    gen = Pipeline.from_model(model, processor).generate_ids(inputs, {"max_new_tokens": 3}, output_hidden_states=True,
                                                             return_dict_in_generate=True)
    steps = lens.steps(gen.hidden_states)
    assert len(steps) == 3 and gen.sequences.shape[1] == inputs["input_ids"].shape[1] + 3
    assert all(torch.all(s["rank"][-1] == 0) for s in steps)
    assert torch.equal(gen.sequences, model.generate(**inputs, max_new_tokens=3, do_sample=False))  # greedy


def test_diagnose_cli_writes_json_and_plots(processor, tmp_path):
    import json

    from keepsight.cli import main
    from keepsight.world import build_world

    model = build_model("tiny-llava", processor.tokenizer)
    model.save_pretrained(tmp_path / "m")
    processor.save_pretrained(tmp_path / "m")
    build_world(tmp_path / "w", world_config(), 5, seed=1, n_objects=6)
    argv = ["diagnose", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "w"), "--max-new-tokens", "12",
            "--batch-size", "2", "--out", str(tmp_path / "d")]
    assert main(argv) == 0
    d = json.loads((tmp_path / "d" / "diagnosis.json").read_text())
    n_layers = model.config.text_config.num_hidden_layers
    assert d["n_samples"] == 5 and d["steps"] == len(d["t"]) == len(d["omega_v"]) <= 12
    assert len(d["omega_v_by_layer"]) == n_layers and len(d["slope_by_layer"]) == n_layers
    assert all(0 < x < 1 for x in d["omega_v"])
    # t counts the text tokens in context: it grows by one each step
    if min(d["rows_active"]) == 5:  # no row ended early
        assert all(abs(b - a - 1) < 1e-6 for a, b in zip(d["t"], d["t"][1:]))
    assert all(0 <= c < n_layers for c in d["convergence_layer"])
    for name in ("omega_v_loglog.png", "tvr.png", "omega_v_heatmap.png", "logit_lens.png"):
        assert (tmp_path / "d" / name).stat().st_size > 1000
    assert main(["diagnose", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "w"), "--prompt", "poem",
                 "--out", str(tmp_path / "d2")]) == 2
