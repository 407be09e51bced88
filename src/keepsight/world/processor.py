"""The world's word-level tokenizer and a real ``LlavaProcessor`` around it.

The tokenizer is built with the ``tokenizers`` library over the world's closed vocabulary and wrapped
as a ``PreTrainedTokenizerFast``; both it and the processor round-trip through
``save_pretrained`` / ``from_pretrained``.
"""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import CLIPImageProcessorPil, LlavaProcessor, PreTrainedTokenizerFast

from .texts import scene_vocabulary

PAD, BOS, EOS, IMAGE, MASK, UNK = "<pad>", "<bos>", "<eos>", "<image>", "<mask>", "<unk>"
# Qwen-VL-style models also need a video token and vision start/end markers.
QWEN_TOKENS = ("<video>", "<vision_start>", "<vision_end>")
SPECIAL_TOKENS = (PAD, BOS, EOS, IMAGE, MASK, UNK, *QWEN_TOKENS)

# "<bos> user : <image> question assistant : answer <eos>". The {% generation %} block marks the
# assistant's tokens so `return_assistant_tokens_mask=True` (and TRL's assistant-only loss) can find them.
CHAT_TEMPLATE = (
    "{% macro render(content) %}"
    "{% if content is string %} {{ content }}"
    "{% else %}{% for part in content %}"
    "{% if part['type'] == 'image' %} <image>"
    "{% elif part['type'] == 'text' %} {{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endmacro %}"
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }} :"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ render(message['content']) }} {{ eos_token }}{% endgeneration %}"
    "{% else %}{{ render(message['content']) }}{% endif %} "
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)


def build_tokenizer():
    """A ``PreTrainedTokenizerFast`` over every word the world can write, plus the special tokens."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for w in scene_vocabulary():
        vocab.setdefault(w, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Whitespace()  # splits "scene." into "scene" "."
    core.add_special_tokens(list(SPECIAL_TOKENS))  # matched whole, before pre-tokenization
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK, mask_token=MASK,
        extra_special_tokens={"image_token": IMAGE},
        chat_template=CHAT_TEMPLATE,
        padding_side="right",
        model_max_length=4096,
    )
    return tok


def build_processor(image_size: int = 64, patch_size: int = 16, tokenizer=None, strategy: str = "full"):
    """A ``LlavaProcessor``: CLIP-style image processor at the world's size + the world tokenizer.

    With ``strategy="full"`` the vision tower keeps its CLS token, so an image becomes
    ``(image_size // patch_size) ** 2 + 1`` image tokens; ``"default"`` (LLaVA-1.5's) drops it.
    """
    if image_size % patch_size:
        raise ValueError(f"image_size {image_size} must be a multiple of patch_size {patch_size}")
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        do_convert_rgb=True,
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer if tokenizer is not None else build_tokenizer(),
        patch_size=patch_size,
        vision_feature_select_strategy=strategy,
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    )


def num_image_tokens(image_size: int, patch_size: int) -> int:
    return (image_size // patch_size) ** 2 + 1
