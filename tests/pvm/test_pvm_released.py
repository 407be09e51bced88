"""PVM as its authors released it (``keepsight.pvm.block``, the default variant), pinned to a reference written
here from the release's equations (never from the block's own methods), inside tiny LLaVA / Qwen3-VL / Qwen2.5-VL:

    q_lat = input_norm(text_reducer h)     v_lat = vision_reducer V
    m_raw = o_proj softmax(q_norm(q_proj q_lat) k_norm(k_proj v_lat)^T / sqrt(hd)) v_proj v_lat   (GQA heads)
    m = m_raw + SwiGLU(post_attn_norm m_raw);   out = gate_alpha * rms(output_expander m) * (1 - visual query)

with h the residual stream after self-attention (the input of the post-attention norm) and the update added to
the FFN's output. The parity with the authors' own code (run under its transformers) is in
``test_pvm_reference.py``."""

from __future__ import annotations

import math

import pytest
import torch
from test_probes import PRESETS, PROMPTS, assert_cached_scores_match_full, tiny_inputs
from transformers import Qwen3Config, Qwen3VLConfig, Qwen3VLForConditionalGeneration

from keepsight.data import chat_example
from keepsight.pvm import PVMConfig, PVMMemoryBlock, attach_pvm, pvm_memory, pvm_parameters
from keepsight.pvm.readings import BranchConfig
from keepsight.world import generate_scenes, render, world_config
from keepsight.world.models import build_model, preset_processor


def _rms(x, eps, weight=None):
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def released_reference(block: PVMMemoryBlock, h, V, visual_mask, text_mask):
    """The released block's update in float64, one row and one head at a time. h [B, T, d], V [B, M, d] (padded),
    visual_mask [B, M] bool, text_mask [B, T] -> [B, T, d]."""
    W = {n: p.detach().double() for n, p in block.named_parameters()}
    ca = block.cross_attn
    hd, heads, kvh, eps = ca.head_dim, ca.heads, ca.kv_heads, block.eps
    h, V = h.double(), V.double()
    B, T, d = h.shape
    out = torch.zeros(B, T, d, dtype=torch.float64)
    for b in range(B):
        vis = V[b][visual_mask[b]]  # [M_b, d]
        if vis.shape[0] == 0:
            continue
        q_lat = _rms(h[b] @ W["text_reducer.weight"].T, eps, W["input_norm.weight"])  # [T, p]
        v_lat = vis @ W["vision_reducer.weight"].T  # [M_b, p]
        q = q_lat @ W["cross_attn.q_proj.weight"].T  # [T, heads * hd]
        k = v_lat @ W["cross_attn.k_proj.weight"].T  # [M_b, kvh * hd]
        v = v_lat @ W["cross_attn.v_proj.weight"].T
        heads_out = []
        for i in range(heads):
            j = i // (heads // kvh)  # the KV head this query head reads (grouped-query attention)
            qi = _rms(q[:, i * hd:(i + 1) * hd], eps, W["cross_attn.q_norm.weight"])
            kj = _rms(k[:, j * hd:(j + 1) * hd], eps, W["cross_attn.k_norm.weight"])
            scores = qi @ kj.T / math.sqrt(hd)  # [T, M_b]
            w = torch.softmax(scores, -1)  # over this row's visual tokens only
            heads_out.append(w @ v[:, j * hd:(j + 1) * hd])
        m_raw = torch.cat(heads_out, -1) @ W["cross_attn.o_proj.weight"].T  # [T, p]
        x = _rms(m_raw, eps, W["post_attn_norm.weight"])
        mlp = (torch.nn.functional.silu(x @ W["mlp.gate_proj.weight"].T) * (x @ W["mlp.up_proj.weight"].T)) \
            @ W["mlp.down_proj.weight"].T
        m = m_raw + mlp
        expanded = m @ W["output_expander.weight"].T  # [T, d]
        if block.output_norm:
            expanded = _rms(expanded, eps)
        out[b] = W["gate_alpha"] * expanded * text_mask[b].double()[:, None]
    return out


def _text_config(**kw):
    base = dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=8, intermediate_size=160,
                rms_norm_eps=1e-6)
    return Qwen3Config(**{**base, **kw})


@pytest.mark.parametrize("output_norm", [True, False])
@pytest.mark.parametrize("kv_heads", [8, 2, 1])
@pytest.mark.parametrize("p", [16, 32])
def test_block_equals_the_released_equations(kv_heads, p, output_norm):
    """The released equations; ``output_norm=False`` (the ablation) is the same block without the output norm."""
    torch.manual_seed(p + kv_heads)
    block = PVMMemoryBlock(_text_config(num_key_value_heads=kv_heads),
                           PVMConfig(pvm_hidden_size=p, output_norm=output_norm)).double()
    with torch.no_grad():
        block.gate_alpha.fill_(0.7)
        for norm in (block.input_norm, block.post_attn_norm, block.cross_attn.q_norm, block.cross_attn.k_norm):
            norm.weight.copy_(torch.rand_like(norm.weight) + 0.5)  # learned scales that are not 1
    assert block.cross_attn.heads == p // 8 and block.cross_attn.kv_heads == max(1, (p // 8) // (8 // kv_heads))
    h = torch.randn(3, 7, 64, dtype=torch.float64) * 4
    V = torch.randn(3, 6, 64, dtype=torch.float64)
    visual_mask = torch.zeros(3, 6, dtype=torch.bool)
    visual_mask[0] = True
    visual_mask[1, :2] = True  # row 2: no visual token
    V[1, 2:] = 1e3  # padding slots hold garbage
    text_mask = torch.ones(3, 7, dtype=torch.bool)
    text_mask[0, :3] = False  # visual query positions: silenced
    with torch.no_grad():
        out = block(h, V, visual_mask, text_mask)
    ref = released_reference(block, h, V, visual_mask, text_mask)
    # fails on: softmax over padding, a missing k / q norm, another GQA grouping, the MLP without its residual, the
    # output norm before the expander, a gate or silencing mask missing
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    assert torch.all(out[2] == 0) and torch.all(out[0, :3] == 0)


def test_decoding_norms_are_fused_and_equal_the_training_forward_bit_for_bit():
    """With no gradient recorded (decoding) the block's RMSNorms are torch's fused kernel; in fp32 its output equals
    the training forward's step-by-step norms exactly, so a decode picks the tokens the trained block would."""
    torch.manual_seed(0)
    block = PVMMemoryBlock(_text_config(), PVMConfig(pvm_hidden_size=32))
    with torch.no_grad():
        block.gate_alpha.fill_(0.3)
    h, V = torch.randn(2, 5, 64) * 3, torch.randn(2, 9, 64)
    visual_mask, text_mask = torch.ones(2, 9, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)
    trained = block(h, V, visual_mask, text_mask)  # grad enabled: the step-by-step norms
    with torch.no_grad():
        decoded = block(h, V, visual_mask, text_mask)
    assert trained.requires_grad and torch.equal(decoded, trained.detach())


def test_identity_at_init_with_a_gate_that_learns_and_the_released_trap(processor):
    """Default init: the model starts as the base and the gate (only it, at first) has a gradient. The released
    file's construction (expander and gate both zero) is also the identity, but nothing in the block gets a
    gradient: a branch that can never start learning."""
    inputs = tiny_inputs("tiny-llava", processor, PROMPTS)
    base = build_model("tiny-llava", processor.tokenizer, seed=1)
    with torch.no_grad():
        base_logits = base(**inputs).logits
    for init in ("backbone", "zero"):
        model = build_model("tiny-llava", processor.tokenizer, seed=1)
        attach_pvm(model, PVMConfig(layers=[1, 3], expander_init=init))
        with torch.no_grad():
            assert torch.equal(model(**inputs).logits, base_logits)
        for name, p in model.named_parameters():
            p.requires_grad = name.startswith("pvm.")
        model(**inputs, labels=inputs["input_ids"]).loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if n.startswith("pvm.")}
        gate_grads = [g for n, g in grads.items() if n.endswith("gate_alpha")]
        if init == "backbone":
            assert all(g is not None and g.abs().item() > 0 for g in gate_grads)
        else:
            assert all(g is None or torch.all(g == 0) for g in grads.values())


def test_query_is_the_residual_after_attention_and_the_update_goes_to_the_ffn_output(processor):
    """Inside a real LLaVA, through generate: the block's query is the input of the layer's post-attention norm (not
    the FFN's normed input), V is the projector's output, and the FFN's output gains exactly the block's update."""
    model = build_model("tiny-llava", processor.tokenizer)
    attach_pvm(model, PVMConfig(layers=[1, 3]))
    with torch.no_grad():
        for p in model.pvm.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        for block in model.pvm.values():
            block.gate_alpha.fill_(0.5)
    inputs = tiny_inputs("tiny-llava", processor, PROMPTS)
    rec = {"proj": [], "norm": {}, "ffn": {}}
    hooks = [model.model.multi_modal_projector.register_forward_hook(lambda m, a, o: rec["proj"].append(o.clone()))]
    for key in ("1", "3"):
        layer = model.model.language_model.layers[int(key)]
        rec["norm"][key], rec["ffn"][key] = [], []
        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(
            lambda m, a, key=key: rec["norm"][key].append(a[0].clone())))
        hooks.append(layer.mlp.register_forward_hook(
            lambda m, a, o, key=key: rec["ffn"][key].append((m, a[0].clone(), o.clone()))))
    with torch.no_grad():
        model.generate(**inputs, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    for h in hooks:
        h.remove()
    V = rec["proj"][0]  # [B, M, d]: one image per row, the same size
    ids = inputs["input_ids"]
    image = ids == processor.tokenizer.image_token_id
    for key in ("1", "3"):
        block = model.pvm[key]
        assert len(rec["ffn"][key]) == 3  # the prefill and two cached decode steps
        for step, ((mlp, x, out), h) in enumerate(zip(rec["ffn"][key], rec["norm"][key])):
            ffn = mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
            text_mask = ~image if step == 0 else torch.ones(h.shape[:2], dtype=torch.bool)
            ref = released_reference(block, h, V, torch.ones(V.shape[:2], dtype=torch.bool), text_mask)
            torch.testing.assert_close((out - ffn).double(), ref, atol=2e-5, rtol=1e-4)
            assert ref.abs().max() > 1e-2


@pytest.mark.parametrize("preset", PRESETS)
def test_cached_generation_equals_full_forward_and_memory_lives_with_the_cache(preset, processor):
    model = build_model(preset, processor.tokenizer)
    attach_pvm(model, PVMConfig(layers=[0, 2]))
    with torch.no_grad():
        for p in model.pvm.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        for block in model.pvm.values():
            block.gate_alpha.fill_(0.7)
    inputs = tiny_inputs(preset, processor, [PROMPTS[0]] * 3)
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False, output_scores=True,
                         return_dict_in_generate=True)
    memory = pvm_memory(out.past_key_values)
    assert memory is not None and set(memory.projected) == {"0", "2"}  # V and its projections: with the cache
    assert_cached_scores_match_full(model, inputs, out)


def test_interleaved_generations_keep_their_own_memory(processor):
    """Two requests decoded step by step in turn (a server interleaving them): each cached step reads the memory of
    its own cache. With V on the model object the second prefill would overwrite the first request's V."""
    model = build_model("tiny-llava", processor.tokenizer)
    attach_pvm(model, PVMConfig(layers=[1, 2]))
    with torch.no_grad():
        for p in model.pvm.parameters():
            p.add_(torch.randn_like(p) * 0.3)
        for block in model.pvm.values():
            block.gate_alpha.fill_(1.0)
    cfg = world_config()
    scenes = generate_scenes(cfg, 2, seed=5)
    proc = preset_processor("tiny-llava")
    a, b = (proc(text=[chat_example(processor, q)], images=[render(s, cfg.noise_std)], return_tensors="pt")
            for q, s in zip(PROMPTS[:2], scenes))
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
    alone_a, alone_b = model.generate(**a, **kw), model.generate(**b, **kw)

    def step(inputs, state):
        with torch.no_grad():
            if state is None:
                o = model(**inputs, use_cache=True)
                return o.past_key_values, [inputs["input_ids"], o.logits[:, -1:].argmax(-1)], inputs["attention_mask"]
            cache, ids, mask = state
            mask = torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype)], 1)
            o = model(input_ids=ids[-1], attention_mask=mask, past_key_values=cache, use_cache=True)
            return cache, ids + [o.logits[:, -1:].argmax(-1)], mask

    sa, sb = None, None
    for _ in range(4):
        sa, sb = step(a, sa), step(b, sb)
    assert torch.equal(torch.cat(sa[1], 1), alone_a) and torch.equal(torch.cat(sb[1], 1), alone_b)


def test_fp32_master_weights_under_a_bf16_backbone(processor):
    """The blocks stay fp32 on a bf16 model; a step at the released GRPO learning rate (1e-6) moves them (in bf16
    such a step is below the resolution of weights of size ~0.02 and is lost)."""
    model = build_model("tiny-llava", processor.tokenizer).to(torch.bfloat16)
    attach_pvm(model, PVMConfig(layers=[1, 2]))
    assert all(p.dtype == torch.float32 for p in pvm_parameters(model))
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("pvm.")
    with torch.no_grad():
        for block in model.pvm.values():
            block.gate_alpha.fill_(0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("pvm.")}
    opt = torch.optim.AdamW(list(pvm_parameters(model)), lr=1e-6)
    inputs = tiny_inputs("tiny-llava", processor, PROMPTS)
    inputs["pixel_values"] = inputs["pixel_values"].to(torch.bfloat16)
    loss = model(**inputs, labels=inputs["input_ids"]).loss
    assert loss.dtype == torch.float32 or loss.dtype == torch.bfloat16
    loss.backward()
    opt.step()
    moved = [n for n, p in model.named_parameters() if n in before and not torch.equal(p, before[n])]
    assert len(moved) >= len(before) - 2  # every block weight moved (output norms have none)
    # the same step (Adam's first step moves every weight by lr) on bf16 copies is lost to rounding almost everywhere
    w = before["pvm.1.text_reducer.weight"].to(torch.bfloat16)
    stepped = w - (1e-6 * torch.sign(w)).to(torch.bfloat16)
    assert (stepped != w).float().mean() < 0.05  # 2.4% of the weights move at std 0.02


def test_parameters_at_the_qwen3vl_8b_shape():
    """Three released blocks at Qwen3-VL-8B's width (p = 512, 4 query heads, 1 KV head, SwiGLU 1,536): 27.92M."""
    cfg = Qwen3VLConfig(text_config=dict(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288,
                                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                         vocab_size=151936))
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(cfg)
        base = sum(p.numel() for p in model.parameters())
        attach_pvm(model, PVMConfig())
        extra = sum(p.numel() for p in pvm_parameters(model))
    assert model._keepsight_pvm.layers == [8, 16, 24]
    block = model.pvm["8"]
    assert block.pvm_hidden_size == 512 and block.cross_attn.heads == 4 and block.cross_attn.kv_heads == 1
    assert block.mlp.gate_proj.out_features == 1536
    per = 3 * 4096 * 512 + 2 * 512 * 512 + 2 * 512 * 128 + 3 * 512 * 1536 + 2 * 128 + 2 * 512 + 1
    assert extra == 3 * per
    print(f"released PVM at Qwen3-VL-8B's shape: {extra / 1e6:.2f}M parameters, {extra / base:.2%} of {base / 1e9:.2f}B")
    assert round(extra / 1e6, 2) == 27.92 and round(100 * extra / base, 2) == 0.32  # the paper: 0.32%


def test_config_resolves_the_latent_width(processor):
    cfg = PVMConfig()
    assert cfg.resolve_pvm_hidden_size(4096, 128) == 512 and cfg.resolve_pvm_hidden_size(2560, 128) == 512
    assert cfg.resolve_pvm_hidden_size(128, 32) == 32 and cfg.resolve_pvm_hidden_size(64, 32) == 32
    with pytest.raises(ValueError, match="pvm_hidden_size 48 must be a multiple of the backbone's head_dim 32"):
        PVMConfig(pvm_hidden_size=48).resolve_pvm_hidden_size(128, 32)
    assert PVMConfig(pvm_hidden_size=512).resolve_pvm_hidden_size(128, 32) == 512  # 4x the width: still allowed
    with pytest.raises(ValueError, match="pvm_hidden_size 512000000000 is more than 4x the backbone's width 128"):
        PVMConfig(pvm_hidden_size=512_000_000_000).resolve_pvm_hidden_size(128, 32)  # named, not an allocator error
    with pytest.raises(ValueError, match="config must be a PVMConfig"):
        attach_pvm(build_model("tiny-llava", processor.tokenizer), {"layers": [1]})


# ----------------------------------------------------------------------------- the released checkpoint layout


def _layout_inputs(processor):
    from PIL import Image

    imgs = [Image.new("RGB", (64, 64), c) for c in ((220, 30, 30), (30, 220, 30))]
    return processor(text=[chat_example(processor, "describe the scene .")] * 2, images=imgs, return_tensors="pt",
                     padding=True)


@pytest.mark.parametrize("name", PRESETS)
def test_released_layout_round_trip_through_the_loader(name, tmp_path):
    """save_released writes config.json with text_config.pvm_hidden_size / pvm_layers and pvm_block.* tensors;
    load_checkpoint reads them back (its blocks attached, bit-identical logits) without the directory's Python files:
    an auto_map into a module that raises on import changes nothing."""
    import json

    from safetensors import safe_open

    from keepsight.models import load_checkpoint
    from keepsight.pvm.layout import save_released
    from tiny_checkpoints import save_tiny_checkpoint

    base = save_tiny_checkpoint(name, tmp_path / "base")
    model, processor = load_checkpoint(base, dtype="float32", device="cpu")
    attach_pvm(model, PVMConfig(layers=[1, 2]))
    with torch.no_grad():
        for p in model.pvm.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    enc = _layout_inputs(processor)
    with torch.no_grad():
        want = model(**enc).logits
    out = save_released(model, tmp_path / "released", processor)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["text_config"]["pvm_layers"] == [1, 2] and cfg["text_config"]["pvm_hidden_size"] == 32
    assert cfg["architectures"][0].startswith("PVM")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        blocks = [k for k in f.keys() if ".pvm_block." in k]
    assert blocks and all(".layers.1.pvm_block." in k or ".layers.2.pvm_block." in k for k in blocks)
    assert not any(k.startswith("pvm.") for k in blocks)
    (out / "modeling_pvm.py").write_text("raise RuntimeError('remote code must not run')\n")
    cfg["auto_map"] = {"AutoModelForImageTextToText": "modeling_pvm.PVMModel"}
    (out / "config.json").write_text(json.dumps(cfg))
    again, _ = load_checkpoint(out, dtype="float32", device="cpu")
    assert again._keepsight_pvm.layers == [1, 2] and again._keepsight_pvm.config.variant == "released"
    with torch.no_grad():
        assert torch.equal(again(**enc).logits, want)


def test_convert_between_adapter_files_and_the_released_layout(tmp_path):
    from keepsight.cli import main
    from keepsight.models import load_checkpoint
    from keepsight.pvm import load_pvm, save_pvm
    from tiny_checkpoints import save_tiny_checkpoint

    base = save_tiny_checkpoint("tiny-qwen3vl", tmp_path / "base")
    model, processor = load_checkpoint(base, dtype="float32", device="cpu")
    attach_pvm(model, PVMConfig(layers=[0, 2]))
    with torch.no_grad():
        for p in model.pvm.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    save_pvm(model, tmp_path / "adapter")
    assert main(["pvm", "convert", "--model", str(base), "--pvm", str(tmp_path / "adapter"), "--out",
                 str(tmp_path / "released")]) == 0
    assert main(["pvm", "convert", "--model", str(tmp_path / "released"), "--out", str(tmp_path / "back")]) == 0
    fresh, _ = load_checkpoint(base, dtype="float32", device="cpu")
    load_pvm(fresh, tmp_path / "back")  # the adapter from the released layout fits the base it came from
    a = dict(model.named_parameters())
    for n, p in fresh.named_parameters():
        assert torch.equal(p, a[n]), n
    # a base without PVM cannot become an adapter; a branch adapter cannot enter the released layout
    assert main(["pvm", "convert", "--model", str(base), "--out", str(tmp_path / "none")]) == 2
    branch, _ = load_checkpoint(base, dtype="float32", device="cpu")
    attach_pvm(branch, BranchConfig(layers=[1]))
    save_pvm(branch, tmp_path / "branch")
    assert main(["pvm", "convert", "--model", str(base), "--pvm", str(tmp_path / "branch"), "--out",
                 str(tmp_path / "r2")]) == 2
    # nor can the ablation without the output norm (the released block always normalises)
    ablation, _ = load_checkpoint(base, dtype="float32", device="cpu")
    attach_pvm(ablation, PVMConfig(layers=[1], output_norm=False))
    save_pvm(ablation, tmp_path / "ablation")
    assert main(["pvm", "convert", "--model", str(base), "--pvm", str(tmp_path / "ablation"), "--out",
                 str(tmp_path / "r3")]) == 2
    assert not (tmp_path / "r3").exists()
