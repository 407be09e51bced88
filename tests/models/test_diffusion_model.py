"""LLaDA-style bidirectional LM on transformers' Llama classes, the tiny LLaDA-V VLM, and checkpoint loading."""

import json
import re

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from keepsight.data import chat_example
from keepsight.models import (
    LladaConfig,
    LladaForMaskedDiffusion,
    LladaModel,
    load_llada_v,
    map_checkpoint_keys,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vlm_inputs(processor):
    img = Image.new("RGB", (64, 64), (200, 30, 30))
    return processor(images=[img], text=[chat_example(processor, "describe the scene .")], return_tensors="pt")


def test_auto_registration_builds_llada_classes(processor, vlm):
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    cfg = AutoConfig.for_model("llada", vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, mask_token_id=7)
    assert isinstance(cfg, LladaConfig) and cfg.mask_token_id == 7 and cfg.use_cache is False
    assert type(AutoModel.from_config(cfg)) is LladaModel
    assert type(AutoModelForCausalLM.from_config(cfg)) is LladaForMaskedDiffusion
    lang = vlm.model.language_model
    assert type(lang) is LladaModel and vlm.config.model_type == "llava"
    assert vlm.config.text_config.mask_token_id == processor.tokenizer.mask_token_id
    assert all(layer.self_attn.is_causal is False for layer in lang.layers)


def test_parameter_names_are_llama_names_and_lm_head_is_untied(lm):
    names = {re.sub(r"\.\d+\.", ".N.", n) for n, _ in lm.named_parameters()}
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} | {
        f"model.layers.N.{m}.weight" for m in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")}
    assert names == expected
    assert lm.lm_head.weight.data_ptr() != lm.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_attention_is_bidirectional_and_padding_is_ignored(lm, impl):
    lm.set_attn_implementation(impl)
    try:
        ids = torch.randint(9, 150, (1, 8))
        base = lm(ids).logits  # [1, 8, V]
        later = ids.clone()
        later[0, -1] = (ids[0, -1] + 1 - 9) % 141 + 9
        assert not torch.allclose(lm(later).logits[0, 0], base[0, 0])  # a later token reaches position 0
        mask = torch.ones_like(ids)
        mask[0, 3] = 0  # a pad in the middle
        padded = lm(ids, attention_mask=mask).logits
        other = ids.clone()
        other[0, 3] = 0 if ids[0, 3] != 0 else 1
        padded2 = lm(other, attention_mask=mask).logits
        keep = torch.tensor([i != 3 for i in range(8)])
        torch.testing.assert_close(padded[0, keep], padded2[0, keep], rtol=0, atol=1e-6)
    finally:
        lm.set_attn_implementation("sdpa")


def test_matches_llama_without_a_causal_mask_and_labels_loss_is_unshifted(lm):
    from transformers import LlamaForCausalLM

    llama = LlamaForCausalLM(lm.config).eval()
    llama.load_state_dict(lm.state_dict())
    ids = torch.randint(9, 150, (2, 6))
    ours = lm(ids).logits
    assert not torch.allclose(ours[:, 0], llama(ids).logits[:, 0], atol=1e-4)  # causal differs
    full = torch.zeros(2, 1, 6, 6)  # a 4D additive mask that hides nothing: plain Llama made bidirectional
    torch.testing.assert_close(ours, llama(ids, attention_mask=full).logits, rtol=1e-5, atol=1e-5)
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    loss = lm(ids, labels=labels).loss
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(ours[:, 2], ids[:, 2]))


def test_vlm_runs_with_an_image_and_is_bidirectional(vlm, vlm_inputs):
    out = vlm(**vlm_inputs).logits  # [1, T, V]
    assert out.shape[:2] == vlm_inputs["input_ids"].shape
    ids = vlm_inputs["input_ids"].clone()
    ids[0, -1] = 100
    assert not torch.allclose(vlm(**{**vlm_inputs, "input_ids": ids}).logits[0, 0], out[0, 0])


def test_save_pretrained_round_trip(vlm, vlm_inputs, tmp_path):
    from transformers import LlavaForConditionalGeneration

    vlm.save_pretrained(tmp_path)
    again = LlavaForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert type(again.model.language_model) is LladaModel
    assert torch.equal(again(**vlm_inputs).logits, vlm(**vlm_inputs).logits)


def _to_llada_v_layout(state):
    """Our HF LLaVA names -> LLaDA-V's (LLaVA repository) names, written out independently of the loader."""
    out = {}
    for k, v in state.items():
        k2 = re.sub(r"^model\.language_model\.", "model.", k)
        k2 = re.sub(r"^model\.vision_tower\.", "model.vision_tower.vision_tower.vision_model.", k2)
        k2 = k2.replace("model.multi_modal_projector.linear_1.", "model.mm_projector.0.")
        k2 = k2.replace("model.multi_modal_projector.linear_2.", "model.mm_projector.2.")
        out[k2] = v.clone().contiguous()
    return out


def test_load_llada_v_layout_gives_the_same_logits(vlm, vlm_inputs, tmp_path):
    state = _to_llada_v_layout(vlm.state_dict())
    assert "model.layers.0.self_attn.q_proj.weight" in state and "model.mm_projector.0.weight" in state
    keys = sorted(state)
    save_file({k: state[k] for k in keys[: len(keys) // 2]}, str(tmp_path / "model-00001.safetensors"))
    save_file({k: state[k] for k in keys[len(keys) // 2:]}, str(tmp_path / "model-00002.safetensors"))
    vlm.config.save_pretrained(tmp_path)
    loaded = load_llada_v(tmp_path)
    assert type(loaded.model.language_model) is LladaModel
    assert torch.equal(loaded(**vlm_inputs).logits, vlm(**vlm_inputs).logits)


_OLMO = {"self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
         "self_attn.o_proj": "attn_out", "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj",
         "mlp.down_proj": "ff_out", "input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm"}


def _to_olmo_layout(state):
    out = {}
    for k, v in state.items():
        m = re.match(r"model\.layers\.(\d+)\.(.+)\.weight$", k)
        if m:
            k2 = f"model.transformer.blocks.{m[1]}.{_OLMO[m[2]]}.weight"
        else:
            k2 = {"model.embed_tokens.weight": "model.transformer.wte.weight",
                  "model.norm.weight": "model.transformer.ln_f.weight",
                  "lm_head.weight": "model.transformer.ff_out.weight"}[k]
        out[k2] = v.clone().contiguous()
    return out


def _olmo_config(cfg):
    return {"model_type": "llada", "d_model": cfg.hidden_size, "n_heads": cfg.num_attention_heads,
            "n_kv_heads": cfg.num_key_value_heads, "n_layers": cfg.num_hidden_layers,
            "mlp_hidden_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size, "embedding_size": cfg.vocab_size,
            "max_sequence_length": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_parameters["rope_theta"], "mask_token_id": cfg.mask_token_id,
            "include_bias": False, "weight_tying": False, "eos_token_id": cfg.eos_token_id,
            "pad_token_id": cfg.pad_token_id}


def test_load_olmo_layout_lm_gives_the_same_logits(lm, tmp_path):
    state = _to_olmo_layout(lm.state_dict())
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(_olmo_config(lm.config)))
    loaded = load_llada_v(tmp_path)
    assert type(loaded) is LladaForMaskedDiffusion and loaded.config.mask_token_id == lm.config.mask_token_id
    ids = torch.randint(9, 150, (2, 7))
    assert torch.equal(loaded(ids).logits, lm(ids).logits)


def test_unknown_and_missing_keys_are_named(lm, tmp_path):
    state = _to_olmo_layout(lm.state_dict())
    (tmp_path / "config.json").write_text(json.dumps(_olmo_config(lm.config)))
    save_file({**state, "model.image_newline": torch.zeros(3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unknown.*model\.image_newline"):
        load_llada_v(tmp_path)
    assert type(load_llada_v(tmp_path, drop=[r"^model\.image_newline$"])) is LladaForMaskedDiffusion
    del state["model.transformer.blocks.1.ff_norm.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks 1 keys.*model\.layers\.1\.post_attention_layernorm\.weight"):
        load_llada_v(tmp_path)


def test_key_map_table():
    got = map_checkpoint_keys({"model.transformer.blocks.3.ff_out.weight": 0, "model.transformer.ff_out.weight": 1,
                               "model.layers.2.mlp.down_proj.weight": 2, "model.mm_projector.2.bias": 3}, "vlm")
    assert set(got) == {"model.language_model.layers.3.mlp.down_proj.weight", "lm_head.weight",
                        "model.language_model.layers.2.mlp.down_proj.weight",
                        "model.multi_modal_projector.linear_2.bias"}
    with pytest.raises(ValueError, match="target"):
        map_checkpoint_keys({}, "encoder")
