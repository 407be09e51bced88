"""Labels from the checkpoint's own chat template: on tiny saved Qwen2.5-VL, Qwen3-VL and LLaVA checkpoints given
their real templates (Qwen's ``<|im_start|>assistant``, LLaVA-1.5's ``USER: / ASSISTANT:``, and LLaMA-3 headers as
LLaDA-V writes them), exactly the assistant tokens and their end-of-turn token are labelled, in every turn of a
3-turn conversation. The expected labels come from the rendered text itself (character spans of each answer and
its end-of-turn marker, mapped to tokens by the tokenizer's offsets), not from the collator's prefix logic."""

import json

import pytest
import torch
from PIL import Image
from transformers import AutoTokenizer

from keepsight.data import IGNORE_INDEX, Sample, VLMCollator, render
from keepsight.models.checkpoint import load_processor
from tiny_checkpoints import save_tiny_checkpoint


def _content(image: str) -> str:
    return ("{% if message['content'] is string %}{{ message['content'] }}{% else %}"
            "{% for part in message['content'] %}{% if part['type'] == 'image' %}" + image +
            "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}")


# written from each family's documented prompt layout
QWEN = ("{% for message in messages %}"
        "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant."
        "<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
        + _content("<|vision_start|><|image_pad|><|vision_end|>") + "<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAVA = ("{% for message in messages %}"
         "{% if message['role'] == 'system' %}" + _content("") + " "
         "{% elif message['role'] == 'user' %}USER: " + _content("<image>\n") + " "
         "{% else %}ASSISTANT: " + _content("") + "{{ eos_token }}{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}ASSISTANT:{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
          + _content("<image>\n") + "<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

STYLES = {  # name: (tiny preset, template, tokens it needs, end-of-turn marker, image token)
    "qwen2.5-vl": ("tiny-qwen25vl", QWEN, ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                                          "<|image_pad|>"], "<|im_end|>", "<|image_pad|>"),
    "qwen3-vl": ("tiny-qwen3vl", QWEN, ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                                       "<|image_pad|>"], "<|im_end|>", "<|image_pad|>"),
    "llava-1.5": ("tiny-llava", LLAVA, ["USER", "ASSISTANT"], "<eos>", "<image>"),
    "llama-3 (llada-v)": ("tiny-llava", LLAMA3, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                          "<|eot_id|>", "<image>"),
}


def _with_template(root, style):
    preset, template, tokens, _, image_token = STYLES[style]
    d = save_tiny_checkpoint(preset, root / style.replace(" ", "_"))
    tok = AutoTokenizer.from_pretrained(d)
    tok.add_tokens(tokens, special_tokens=True)
    tok.chat_template = template
    tok.save_pretrained(d)
    (d / "chat_template.jinja").write_text(template)
    (d / "chat_template.json").unlink(missing_ok=True)  # the .jinja is the one template
    cfg = json.loads((d / "config.json").read_text())
    if "image_token_id" in cfg:
        cfg["image_token_id"] = tok.convert_tokens_to_ids(image_token)
        (d / "config.json").write_text(json.dumps(cfg))
    return load_processor(d)


CONVERSATION = [
    {"role": "system", "content": [{"type": "text", "text": "answer in words ."}]},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "is there a red circle ?"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "yes , at b2 ."}]},
    {"role": "user", "content": [{"type": "text", "text": "what colour is the square ?"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "blue"}]},
    {"role": "user", "content": [{"type": "text", "text": "how many objects are there ?"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "3 objects : a red circle , a blue square ."}]},
]


def _expected(processor, sample, end_marker, n_tokens):
    """Label positions from the rendered text: each answer + its end-of-turn marker as a character span."""
    tok = processor.tokenizer
    text = render(processor, sample.messages).rstrip()
    spans, at = [], 0
    for m in sample.messages:
        if m["role"] != "assistant":
            continue
        answer = m["content"][0]["text"]
        start = text.index(answer + end_marker, at)
        at = start + len(answer) + len(end_marker)
        spans.append((start, at))
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    shift = n_tokens - len(enc["input_ids"])  # image expansion (every image is in the first user turn)
    want = torch.zeros(n_tokens, dtype=torch.bool)
    for k, (a, b) in enumerate(enc["offset_mapping"]):
        if any(s <= a and b <= e and b > a for s, e in spans):
            want[k + shift] = True
    return want, text


@pytest.mark.parametrize("style", list(STYLES))
def test_exactly_the_assistant_tokens_are_labelled(style, tmp_path):
    processor = _with_template(tmp_path, style)
    _, _, _, end_marker, image_token = STYLES[style]
    sample = Sample([dict(m) for m in CONVERSATION], [Image.new("RGB", (64, 64), (200, 30, 30))], "c3")
    batch = VLMCollator(processor)([sample])
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    labelled = labels != IGNORE_INDEX
    want, text = _expected(processor, sample, end_marker, len(ids))
    assert end_marker in text and text.count(end_marker) >= 3
    assert torch.equal(labelled, want), (style, processor.tokenizer.convert_ids_to_tokens(ids[labelled].tolist()))
    assert torch.equal(labels[labelled], ids[labelled])
    tok = processor.tokenizer
    got = tok.convert_ids_to_tokens(ids[labelled].tolist())
    expected = []
    for m in CONVERSATION:
        if m["role"] == "assistant":
            expected += tok.tokenize(m["content"][0]["text"]) + [end_marker]
    assert got == expected  # three turns, each closed by the template's end-of-turn token
    image_id = tok.convert_tokens_to_ids(image_token)
    assert (ids == image_id).sum() > 1 and not labelled[ids == image_id].any()  # expanded, never labelled


def test_a_cut_never_lands_inside_the_image_tokens(tmp_path):
    processor = _with_template(tmp_path, "qwen2.5-vl")
    sample = Sample([dict(m) for m in CONVERSATION], [Image.new("RGB", (64, 64))], "long")
    full = VLMCollator(processor)([sample])
    n = full["input_ids"].shape[1]
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    last_image = int((full["input_ids"][0] == image_id).nonzero().max())
    first_label = int((full["labels"][0] != -100).nonzero().min())  # the first answer token
    assert first_label > last_image
    cut = VLMCollator(processor, max_length=first_label + 1)([sample])
    assert cut["input_ids"].shape[1] == first_label + 1 < n
    assert torch.equal(cut["labels"][0], full["labels"][0, : first_label + 1])
    with pytest.raises(ValueError, match=r"samples \['long'\]: --max-length \d+ cuts off every answer token"):
        VLMCollator(processor, max_length=first_label)([sample])  # nothing would be learned from the row
    with pytest.raises(ValueError, match=r"samples \['long'\]: their image tokens do not fit in --max-length"):
        VLMCollator(processor, max_length=last_image)([sample])
    short = Sample.single_turn("hi", "yes", None, id="text-only")
    skipping = VLMCollator(processor, max_length=last_image, skip_bad_rows=True)
    out = skipping([sample, short])
    assert out["input_ids"].shape[0] == 1 and skipping.skipped == 1
