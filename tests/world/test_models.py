"""The world's tiny models: its tokenizer and processor, every preset built, saved and reloaded."""

import pytest
import torch

from keepsight.data import chat_example
from keepsight.world import description, generate_scenes, render, world_config
from keepsight.world.models import PRESETS, build_model, get_preset, preset_processor, qwen3vl_inputs
from keepsight.world.processor import SPECIAL_TOKENS, build_tokenizer
from keepsight.world.texts import (
    CAPTION_PROMPT,
    DESCRIBE_PROMPT,
    caption,
    cell_questions,
    open_questions,
    yes_no_questions,
)


def test_tokenizer_covers_every_world_text_without_unk():
    tok = build_tokenizer()
    for difficulty in ("easy", "default", "hard"):
        cfg = world_config(difficulty)
        for s in generate_scenes(cfg, 40, seed=0):
            texts = [description(s), caption(s), DESCRIBE_PROMPT, CAPTION_PROMPT]
            texts += [q["question"] for q in yes_no_questions(s, cfg) + open_questions(s)]
            texts += [q[k] for q in open_questions(s) + cell_questions(s, cfg) for k in ("question", "answer")]
            for t in texts:
                ids = tok(t)["input_ids"]
                assert tok.unk_token_id not in ids, t
                assert tok.decode(ids) == t


def test_tokenizer_special_tokens_and_round_trip(tmp_path):
    from transformers import AutoTokenizer

    tok = build_tokenizer()
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert len(set(ids)) == len(SPECIAL_TOKENS)  # each special token has its own id
    for t in SPECIAL_TOKENS:
        assert tok.tokenize(t) == [t]
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.mask_token, tok.unk_token) == (
        "<pad>", "<bos>", "<eos>", "<mask>", "<unk>")
    assert tok.image_token == "<image>"
    tok.save_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    text = "<bos> user : <image> is there a red circle ? assistant : yes <eos>"
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]
    assert tok2.image_token_id == tok.image_token_id and len(tok2) == len(tok)


def test_chat_template_marks_the_assistant_turn(processor):
    tok = processor.tokenizer
    text = chat_example(processor, "is there a red circle ?", "yes")
    assert text == "<bos>user : <image> is there a red circle ? assistant : yes <eos> "
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "yes"}]}]
    out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    marked = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tok.convert_ids_to_tokens(marked) == ["yes", "<eos>"]
    assert chat_example(processor, "hi").endswith("assistant :")


def test_processor_round_trip(processor, tmp_path):
    from transformers import AutoProcessor

    cfg = world_config()
    scenes = generate_scenes(cfg, 2, seed=0)
    images = [render(s, cfg.noise_std) for s in scenes]
    texts = [chat_example(processor, DESCRIBE_PROMPT, description(s)) for s in scenes]
    enc = processor(text=texts, images=images, return_tensors="pt", padding=True)
    n_img = (enc["input_ids"] == processor.tokenizer.image_token_id).sum(1)
    assert n_img.tolist() == [17, 17]  # (64 / 16) ** 2 patches (one per grid cell) + CLS
    processor.save_pretrained(tmp_path)
    p2 = AutoProcessor.from_pretrained(tmp_path)
    enc2 = p2(text=texts, images=images, return_tensors="pt", padding=True)
    for k in enc:
        assert torch.equal(enc[k], enc2[k]), k


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_tiny_model_save_reload_same_logits(preset, processor, tmp_path):
    from transformers import AutoModelForImageTextToText

    tok = processor.tokenizer
    model = build_model(preset, tok)
    cfg = world_config()
    images = [render(s, cfg.noise_std) for s in generate_scenes(cfg, 2, seed=0)]
    prompt = chat_example(processor, DESCRIBE_PROMPT)
    if get_preset(preset).arch == "llava":
        inputs = preset_processor(preset)(text=[prompt] * 2, images=images, return_tensors="pt")
    else:
        from transformers import Qwen2VLImageProcessorPil

        ip = Qwen2VLImageProcessorPil(min_pixels=64 * 64, max_pixels=64 * 64, patch_size=8, merge_size=2)
        inputs = qwen3vl_inputs(ip, tok, [prompt] * 2, images)
        if get_preset(preset).arch == "qwen2_5_vl":
            inputs.pop("mm_token_type_ids")
    with torch.no_grad():
        logits = model(**inputs).logits
    model.save_pretrained(tmp_path)
    model2 = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    assert type(model2) is type(model)
    with torch.no_grad():
        assert torch.equal(model2(**inputs).logits, logits)
        gen = model2.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] == inputs["input_ids"].shape[1] + 4


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'gpt-5'"):
        build_model("gpt-5", build_tokenizer())


def test_llava_15_layout_preset():
    """tiny-llava-1.5: a LLaMA language model of 32 layers (the depth MemVR's released window assumes), the
    tower's second-to-last layer, patch tokens only (no CLS): 16 image tokens for a 64-pixel image at patch 16."""
    from transformers import LlamaForCausalLM

    p = get_preset("tiny-llava-1.5")
    tok = build_tokenizer()
    model = build_model(p, tok)
    assert model.config.text_config.model_type == "llama" and model.config.text_config.num_hidden_layers == 32
    assert model.config.vision_feature_layer == -2 and model.config.vision_feature_select_strategy == "default"
    proc = preset_processor(p)
    cfg = world_config()
    image = render(generate_scenes(cfg, 1, seed=0)[0], cfg.noise_std)
    enc = proc(text=[chat_example(proc, DESCRIBE_PROMPT)], images=[image], return_tensors="pt")
    assert int((enc["input_ids"] == tok.image_token_id).sum()) == 16 == model.config.image_seq_length
    with torch.no_grad():
        assert model(**enc).logits.isfinite().all()
    assert not isinstance(model.model.language_model, LlamaForCausalLM)  # the bare decoder, as LLaVA builds it
