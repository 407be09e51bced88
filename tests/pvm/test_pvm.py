import json

import pytest
import torch
from test_probes import PRESETS, PROMPTS, tiny_inputs

from keepsight.pvm import (
    PVMConfig,
    attach_pvm,
    detach_pvm,
    load_pvm,
    pvm_disabled,
    pvm_parameters,
    save_pvm,
    strided_layers,
)
from keepsight.pvm.readings import BranchConfig, PVMBranch
from keepsight.world.models import build_model


def _set_gates(model, value: float) -> None:
    with torch.no_grad():
        for branch in model.pvm.values():
            branch.gate.fill_(value)


def test_strided_layers_and_config_errors():
    assert strided_layers(36) == [8, 16, 24]
    assert strided_layers(4) == [1, 2, 3]
    with pytest.raises(ValueError, match="gate must be"):
        BranchConfig(gate="vector")
    with pytest.raises(ValueError, match="pvm_hidden_size 10 must be divisible by heads 3"):
        BranchConfig(pvm_hidden_size=10, heads=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'heads'"):  # the branch's, not the released's
        PVMConfig(heads=2, gate="channel")
    with pytest.raises(ValueError, match="expander_init applies only to the released block"):
        BranchConfig(expander_init="zero")
    with pytest.raises(ValueError, match="output_norm applies only to the released block"):
        BranchConfig(output_norm=False)
    with pytest.raises(ValueError, match="output_norm must be true or false"):
        PVMConfig(output_norm="no")
    with pytest.raises(ValueError, match="layers: layer 9 is out of range for a model with 4 decoder layers"):
        PVMConfig(layers=[1, 9]).resolve_layers(4)
    with pytest.raises(ValueError, match="layers must be 'strided'"):
        PVMConfig(layers="every")


@pytest.mark.parametrize("preset", PRESETS)
def test_zero_gate_is_bit_identical_and_detach_restores(preset, processor):
    model = build_model(preset, processor.tokenizer)
    inputs = tiny_inputs(preset, processor, PROMPTS)
    with torch.no_grad():
        base_logits = model(**inputs).logits
    base_gen = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    names = [n for n, _ in model.named_parameters()]
    attach_pvm(model, PVMConfig(layers=[1, 3]))
    assert [n for n, _ in model.named_parameters() if not n.startswith("pvm.")] == names  # nothing renamed
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, base_logits)
    assert torch.equal(model.generate(**inputs, max_new_tokens=6, do_sample=False), base_gen)
    _set_gates(model, 0.5)
    with torch.no_grad():
        assert not torch.equal(model(**inputs).logits, base_logits)  # the branch is really wired in
        with pvm_disabled(model):
            assert torch.equal(model(**inputs).logits, base_logits)
    detach_pvm(model)
    assert [n for n, _ in model.named_parameters()] == names
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, base_logits)
    assert torch.equal(model.generate(**inputs, max_new_tokens=6, do_sample=False), base_gen)


@pytest.mark.parametrize("preset", PRESETS)
def test_cached_generation_equals_full_forward(preset, processor):
    model = build_model(preset, processor.tokenizer)
    attach_pvm(model, BranchConfig(layers=[0, 2], heads=2, gate="channel"))
    _set_gates(model, 0.7)
    inputs = tiny_inputs(preset, processor, [PROMPTS[0]] * 3)  # no padding: plain forward positions agree
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False, output_scores=True,
                         return_dict_in_generate=True)
    full = dict(inputs)
    full["input_ids"] = out.sequences[:, :-1]
    full["attention_mask"] = torch.cat(
        [inputs["attention_mask"], torch.ones(len(PROMPTS), 4, dtype=inputs["attention_mask"].dtype)], 1)
    if "mm_token_type_ids" in full:
        full["mm_token_type_ids"] = torch.cat(
            [inputs["mm_token_type_ids"], torch.zeros(len(PROMPTS), 4, dtype=torch.long)], 1)
    with torch.no_grad():
        logits = model(**full).logits  # [B, T, V]
    n = inputs["input_ids"].shape[1]
    for step, scores in enumerate(out.scores):
        torch.testing.assert_close(scores, logits[:, n - 1 + step], atol=1e-5, rtol=1e-5)


def test_local_invariance_and_silencing():

    torch.manual_seed(0)
    branch = PVMBranch(32, BranchConfig(pvm_hidden_size=16, heads=2))
    with torch.no_grad():
        branch.gate.fill_(1.0)
    visual = torch.randn(2, 5, 32)
    vmask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    x = torch.randn(2, 7, 32)
    out = branch(x, visual, vmask, torch.ones(2, 7, dtype=torch.bool))
    # the same position with more text before it: identical output (normalised over visual tokens only)
    longer = torch.cat([torch.randn(2, 30, 32), x], 1)
    out_long = branch(longer, visual, vmask, torch.ones(2, 37, dtype=torch.bool))
    torch.testing.assert_close(out_long[:, 30:], out, atol=1e-6, rtol=1e-6)
    # padding visual slots do not matter
    visual2 = visual.clone()
    visual2[1, 3:] = 100.0
    torch.testing.assert_close(branch(x, visual2, vmask, torch.ones(2, 7, dtype=torch.bool)), out)
    # silenced positions get exactly zero; text-only rows get zero
    text_mask = torch.ones(2, 7, dtype=torch.bool)
    text_mask[:, :3] = False
    silenced = branch(x, visual, vmask, text_mask)
    assert torch.all(silenced[:, :3] == 0) and torch.equal(silenced[:, 3:], out[:, 3:])
    no_visual = branch(x, visual, torch.zeros(2, 5, dtype=torch.bool), torch.ones(2, 7, dtype=torch.bool))
    assert torch.all(no_visual == 0)


def test_visual_positions_receive_no_pvm_output(processor):
    model = build_model("tiny-llava", processor.tokenizer)
    inputs = tiny_inputs("tiny-llava", processor, PROMPTS)
    with torch.no_grad():
        base = model(**inputs, output_hidden_states=True).hidden_states
    attach_pvm(model, PVMConfig(layers=[0]))
    _set_gates(model, 1.0)
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True).hidden_states
    visual = inputs["input_ids"] == processor.tokenizer.image_token_id
    # layer 0's output: image positions untouched, text positions changed
    assert torch.equal(out[1][visual], base[1][visual])
    assert not torch.equal(out[1][~visual], base[1][~visual])


def test_training_step_changes_only_pvm(processor):
    model = build_model("tiny-llava", processor.tokenizer)
    attach_pvm(model)
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("pvm.")
    _set_gates(model, 0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(list(pvm_parameters(model)), lr=1e-2)
    inputs = tiny_inputs("tiny-llava", processor, PROMPTS)
    model.train()
    loss = model(**inputs, labels=inputs["input_ids"]).loss
    loss.backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith("pvm.") for n in changed)
    assert {n for n, _ in model.named_parameters() if n.startswith("pvm.")} >= changed


def test_save_load_bit_identical_and_mismatch_refused(processor, tmp_path):
    model = build_model("tiny-llava", processor.tokenizer)
    attach_pvm(model, BranchConfig(layers=[1, 2], heads=2))
    _set_gates(model, 0.3)
    with torch.no_grad():
        for p in model.pvm.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    inputs = tiny_inputs("tiny-llava", processor, PROMPTS)
    with torch.no_grad():
        logits = model(**inputs).logits
    save_pvm(model, tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [".keepsight", "pvm.safetensors", "pvm_config.json"]
    fresh = build_model("tiny-llava", processor.tokenizer)
    load_pvm(fresh, tmp_path / "a")
    with torch.no_grad():
        assert torch.equal(fresh(**inputs).logits, logits)
    other = build_model("tiny-llava-6l", processor.tokenizer)
    with pytest.raises(ValueError, match="num_layers: adapter 4 vs model 6"):
        load_pvm(other, tmp_path / "a")
    assert getattr(other, "_keepsight_pvm", None) is None  # left untouched
    meta = json.loads((tmp_path / "a" / "pvm_config.json").read_text())
    meta["pvm"]["pvm_hidden_size"] = 64
    (tmp_path / "a" / "pvm_config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="has shape"):
        load_pvm(build_model("tiny-llava", processor.tokenizer), tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="pvm_config.json is missing"):
        load_pvm(fresh, tmp_path)
    with pytest.raises(ValueError, match="already carries PVM blocks"):
        attach_pvm(fresh)


def test_parameter_overhead_on_a_qwen3vl_8b_shaped_config():
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    cfg = Qwen3VLConfig(text_config=dict(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288,
                                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                         vocab_size=151936))
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(cfg)
        base = sum(p.numel() for p in model.parameters())
        attach_pvm(model, BranchConfig(pvm_hidden_size=1024))
        extra = sum(p.numel() for p in pvm_parameters(model))
    assert model._keepsight_pvm.layers == [8, 16, 24]
    # 3 layers x (4096*1024 down + 1024*4096 up + 1 gate) = 25.2M
    assert extra == 3 * (2 * 4096 * 1024 + 1)
    ratio = extra / base
    print(f"PVM overhead on a Qwen3-VL-8B-shaped config: {extra / 1e6:.1f}M of {base / 1e9:.2f}B = {ratio:.2%}")
    assert 0.002 < ratio < 0.004  # the paper: 0.32%


def test_gradient_checkpointing_gives_the_same_gradients(processor):
    inputs = tiny_inputs("tiny-llava", processor, PROMPTS)
    grads = []
    for checkpointing in (False, True):
        model = build_model("tiny-llava", processor.tokenizer, seed=1)
        attach_pvm(model)
        _set_gates(model, 0.2)
        for name, p in model.named_parameters():
            p.requires_grad = name.startswith("pvm.")
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        model(**inputs, labels=inputs["input_ids"]).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], atol=1e-6, rtol=1e-5)


def test_several_images_per_sample_and_text_only_rows(processor):
    from keepsight.world import generate_scenes, render, world_config

    model = build_model("tiny-llava", processor.tokenizer)
    attach_pvm(model)
    _set_gates(model, 0.5)
    cfg = world_config()
    images = [render(s, cfg.noise_std) for s in generate_scenes(cfg, 2, seed=0)]
    tok = processor.tokenizer
    text = "<bos>user : <image> <image> compare the images . assistant :"
    enc = processor(text=[text], images=[images], return_tensors="pt")
    with torch.no_grad():
        model(**enc)
    st = model._keepsight_pvm
    assert st.memory.visual.shape[1] == 2 * 17 and bool(st.memory.visual_mask.all())
    # a text-only batch: no visual memory, so PVM adds nothing even with a non-zero gate
    plain = tok(["<bos>user : what scene is this ? assistant :"], return_tensors="pt")
    with torch.no_grad():
        with_pvm = model(**plain).logits
        with pvm_disabled(model):
            base = model(**plain).logits
    assert torch.equal(with_pvm, base)


def test_pvm_on_gemma4_kv_shared_layers_generates_as_the_full_forward():
    """Gemma 4's KV-shared layers (E2B / E4B: the last ones) run on the last ``logits_to_keep`` positions only at
    prefill, so a PVM block there sees a suffix of the tracked positions: gate 0 is the model, and with the gate open
    the cached generation equals a full forward over the generated sequence."""
    from PIL import Image

    from families import _gemma4, family_batch
    from keepsight.models import arch_info, arch_spec

    model, processor = _gemma4(0, kv_shared=2)
    assert model.model.language_model.first_kv_shared_layer_idx == 2
    row = family_batch(processor, ["describe the scene ."], [Image.new("RGB", (64, 64), (200, 20, 20))])
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=processor.tokenizer.pad_token_id,
              bad_words_ids=[[t] for t in arch_info(model).visual_token_ids])
    base = model.generate(**row, **kw)
    attach_pvm(model, PVMConfig(layers=[1, 2, 3]))  # one layer before the shared ones, two of them
    assert torch.equal(model.generate(**row, **kw), base)
    with torch.no_grad():
        for p in pvm_parameters(model):
            p.add_(torch.randn_like(p) * 0.5)
    out = model.generate(**row, **kw, output_scores=True, return_dict_in_generate=True)
    ids = out.sequences[:, :-1]
    full = dict(row, input_ids=ids, attention_mask=torch.ones_like(ids))
    extra = ids.shape[1] - row["input_ids"].shape[1]
    for key in arch_spec("gemma4").token_inputs:  # processor outputs aligned with the ids, extended over new tokens
        if key in row:
            full[key] = torch.cat([row[key], torch.zeros(1, extra, dtype=row[key].dtype)], 1)
    with torch.no_grad():
        logits = model(**full).logits
    n = row["input_ids"].shape[1]
    for step, scores in enumerate(out.scores):
        fin = torch.isfinite(scores)
        torch.testing.assert_close(scores[fin], logits[:, n - 1 + step][fin], atol=1e-4, rtol=1e-4)


def test_adapter_configs_are_read_by_the_block_they_record():
    assert PVMConfig.from_dict(PVMConfig(layers=[1]).to_dict()) == PVMConfig(layers=[1])
    branch = BranchConfig(heads=2, pvm_hidden_size=8)  # our earlier reading (keepsight.pvm.readings)
    assert branch.to_dict()["variant"] == "branch" and PVMConfig.from_dict(branch.to_dict()) == branch
    old = {k: v for k, v in branch.to_dict().items() if k not in ("variant", "pvm_hidden_size", "expander_init",
                                                                   "output_norm")}
    assert PVMConfig.from_dict({**old, "latent_dim": 8}) == branch  # written before the released block existed
    with pytest.raises(ValueError, match=r"unknown PVM variant 'tiny': keepsight reads \['branch', 'released'\]"):
        PVMConfig.from_dict({"variant": "tiny"})
