"""Tiny random models of real transformers VLM families, each with a real processor of its family, built offline.

``tiny_family(kind)`` returns ``(model, processor)`` for a transformers ``model_type`` (``"llava_next"``,
``"qwen3_5"``, ...): a randomly initialised ``AutoModelForImageTextToText`` class of that family with transformers'
own model testers' sizes (text hidden 32, 3 decoder layers: MemVR's window needs a layer on each side; vision hidden 32, 1-2 layers; 32-64 px images), and the
family's processor class around the world tokenizer (``keepsight.world.processor.build_tokenizer``) plus the
special tokens that processor needs, with a chat template that writes the family's image placeholder. Nothing is
downloaded. ``save_family`` writes a directory that ``AutoModelForImageTextToText`` / ``AutoProcessor`` load back.

Without torchvision (not installed here) the processors with a video half (LLaVA-OneVision, InternVL, Gemma 4, Qwen3-VL /
Qwen3.5, SmolVLM, GLM-4V) are keepsight's image-only versions (``keepsight.models.image_only``, the rows'
``processor_fallback``), and ``PixtralProcessor`` comes from ``keepsight.models.image_only.pixtral_processor``;
Qwen3.5's directories carry a byte-level BPE (``Qwen3_5Tokenizer``) over the world's words, since ``AutoTokenizer``
forces that class on them. keepsight's loader (``load_checkpoint``) reads every directory back. The families
keepsight had before (LLaVA, the bridged LLaVA, Qwen3-VL, Qwen2.5-VL) are the world's tiny presets
(``keepsight.world.models``), so every autoregressive row of the architecture table has a builder here.

The structural facts of each family (where the decoder, projector and tower are, the layer's norms and MLP, RoPE,
which inputs ``generate`` needs) are at the bottom of this file, printed from the instantiated models.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import (
    BatchFeature,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Gemma3Processor,
    Gemma4AudioFeatureExtractor,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4ImageProcessorPil,
    Glm4vConfig,
    Glm4vForConditionalGeneration,
    Glm4vImageProcessorPil,
    GotOcr2ImageProcessorPil,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    Idefics3Processor,
    InternVLConfig,
    InternVLForConditionalGeneration,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    PixtralImageProcessorPil,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    ProcessorMixin,
    Qwen2VLImageProcessorPil,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessorPil,
)

from keepsight.data import Sample, padding_side, render_prompt
from keepsight.inference import METHODS, method_names
from keepsight.models.image_only import (
    Gemma4ProcessorImageOnly,
    Glm4vProcessorImageOnly,
    InternVLProcessorImageOnly,
    LlavaOnevisionProcessorImageOnly,
    Qwen3VLProcessorImageOnly,
    SmolVLMProcessorImageOnly,
    pixtral_processor,
)
from keepsight.world.processor import BOS, CHAT_TEMPLATE, EOS, IMAGE, MASK, PAD, UNK, build_tokenizer

__all__ = ["FAMILY_BUILDERS", "family_batch", "save_family", "tiny_family"]

# ----------------------------------------------------------------------------- shared pieces

TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=512, tie_word_embeddings=False)


def _tokenizer(named: dict[str, str] | None = None, extra: tuple[str, ...] = (), placeholder: str = IMAGE,
               ) -> PreTrainedTokenizerFast:
    """The world tokenizer with more special tokens: ``named`` ones become attributes (``tok.boi_token``,
    ``tok.boi_token_id``, saved in ``tokenizer_config.json``), ``extra`` ones are plain special tokens. The chat
    template writes ``placeholder`` where an image part is; padding is on the left (batched generation)."""
    core: Tokenizer = build_tokenizer().backend_tokenizer
    new = [t for t in (*(named or {}).values(), *extra) if core.token_to_id(t) is None]
    core.add_special_tokens(new)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK, mask_token=MASK,
        extra_special_tokens={"image_token": IMAGE, **(named or {})},
        chat_template=_template(placeholder), padding_side="left", model_max_length=4096,
    )


def _byte_level_tokenizer(named: dict[str, str], placeholder: str):
    """Qwen3.5's own tokenizer class (``Qwen3_5Tokenizer``: byte-level BPE with Qwen's pre-tokenizer) over the world's
    words, with the world's special tokens and ``named`` ones. ``AutoTokenizer`` always loads a ``qwen3_5`` /
    ``qwen3_5_moe`` directory with that class, which rebuilds a BPE from ``tokenizer.json``'s vocab and merges; the
    world's word-level tokenizer would not survive it. The merges are learnt (deterministically) from the world's
    words with and without a leading space, so each word is one token, as in the world tokenizer."""
    from tokenizers import Regex, models, pre_tokenizers, trainers
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX, Qwen3_5Tokenizer

    from keepsight.world.texts import scene_vocabulary

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    words = list(scene_vocabulary())
    core.train_from_iterator(words + [" " + w for w in words], trainers.BpeTrainer(
        vocab_size=4096, min_frequency=1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    learnt = json.loads(core.to_str())["model"]
    tok = Qwen3_5Tokenizer(vocab=learnt["vocab"], merges=[tuple(m) for m in learnt["merges"]], bos_token=BOS,
                           eos_token=EOS, pad_token=PAD, unk_token=UNK, mask_token=MASK,
                           extra_special_tokens={**named}, chat_template=_template(placeholder),
                           padding_side="left", model_max_length=4096)
    tok.add_special_tokens({"extra_special_tokens": [IMAGE, "<video>"]}, replace_extra_special_tokens=False)
    return tok


def _template(placeholder: str) -> str:
    """The world's chat template with ``placeholder`` (what the family's processor expands) for an image part."""
    image_part = "{% if part['type'] == 'image' %} <image>"
    assert image_part in CHAT_TEMPLATE
    return CHAT_TEMPLATE.replace(image_part, "{% if part['type'] == 'image' %} " + placeholder)


def _text(model_type: str, tok, **over) -> dict:
    """A tiny decoder config (as a dict for a composite config's ``text_config``) with ``tok``'s ids."""
    return dict(model_type=model_type, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **{**TEXT, **over})


def _finish(model: PreTrainedModel, tok) -> PreTrainedModel:
    """Generation ids from the tokenizer, eval mode."""
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(tok, key))
    return model.eval()


PixtralProcessor = pixtral_processor()


# ----------------------------------------------------------------------------- the families


def _llava_next(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """LLaVA-NeXT: CLIP tower (CLS + 4x4 patches of a 32 px tile), anyres tiles up to 64 px, LLaMA decoder."""
    tok = _tokenizer()
    pinpoints = [[32, 64], [64, 32], [64, 64]]
    images = LlavaNextImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                        image_grid_pinpoints=pinpoints)
    proc = LlavaNextProcessor(images, tok, patch_size=8, vision_feature_select_strategy="default",
                              num_additional_image_tokens=1, chat_template=tok.chat_template)
    cfg = LlavaNextConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, image_size=32, patch_size=8, projection_dim=32),
        text_config=_text("llama", tok), image_token_index=tok.image_token_id, image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="default", vision_feature_layer=-2, image_seq_length=16,
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    return _finish(LlavaNextForConditionalGeneration(cfg), tok), proc


def _llava_onevision(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """LLaVA-OneVision: SigLIP tower (4x4 patches of a 32 px tile, no CLS), anyres tiles up to 64 px, Qwen2 decoder.
    Processor: ``LlavaOnevisionProcessorImageOnly`` (no video processor)."""
    tok = _tokenizer(named={"video_token": "<video>"})
    pinpoints = [[32, 32], [32, 64], [64, 32], [64, 64]]
    images = LlavaOnevisionImageProcessorPil(size={"height": 32, "width": 32}, image_grid_pinpoints=pinpoints)
    proc = LlavaOnevisionProcessorImageOnly(
        images, tok, num_image_tokens=16, vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9",
        chat_template=tok.chat_template)
    cfg = LlavaOnevisionConfig(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8),
        text_config=_text("qwen2", tok), image_token_index=tok.image_token_id, video_token_index=tok.video_token_id,
        image_grid_pinpoints=pinpoints, vision_feature_select_strategy="full", vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9", tie_word_embeddings=False)
    torch.manual_seed(seed)
    return _finish(LlavaOnevisionForConditionalGeneration(cfg), tok), proc


def _mistral3(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """Mistral 3: Pixtral tower (patch 4, 2-D RoPE, images up to 32 px kept at their aspect ratio), a patch merger
    (2x2), Mistral decoder; ``PixtralProcessor`` writes rows of ``[IMG]`` ended by ``[IMG_BREAK]`` / ``[IMG_END]``."""
    tok = _tokenizer(extra=("[IMG]", "[IMG_BREAK]", "[IMG_END]"), placeholder="[IMG]")
    images = PixtralImageProcessorPil(size={"longest_edge": 32}, patch_size={"height": 4, "width": 4})
    proc = PixtralProcessor(images, tok, patch_size=4, spatial_merge_size=2, chat_template=tok.chat_template,
                            image_token="[IMG]", image_break_token="[IMG_BREAK]", image_end_token="[IMG_END]")
    cfg = Mistral3Config(
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, head_dim=8, image_size=32, patch_size=4),
        text_config=_text("mistral", tok, sliding_window=None), image_token_index=tok.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=2, vision_feature_layer=-1, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return _finish(Mistral3ForConditionalGeneration(cfg), tok), proc


def _internvl(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """InternVL 3: InternViT tower (patch 8 on 32 px tiles, pixel shuffle 0.5: 4 tokens a tile), up to 4 tiles plus
    a thumbnail, Qwen2 decoder; the processor writes ``<img>`` + ``<IMG_CONTEXT>`` x tokens + ``</img>``.
    Processor: ``InternVLProcessorImageOnly`` (no video processor)."""
    tok = _tokenizer(named={"start_image_token": "<img>", "end_image_token": "</img>",
                            "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"},
                     placeholder="<IMG_CONTEXT>")
    images = GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=True, min_patches=1,
                                      max_patches=4, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    proc = InternVLProcessorImageOnly(images, tok, image_seq_length=4, chat_template=tok.chat_template)
    cfg = InternVLConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=[32, 32], patch_size=[8, 8]),
        text_config=_text("qwen2", tok), image_token_id=tok.context_image_token_id, image_seq_length=4,
        downsample_ratio=0.5, vision_feature_layer=-1, vision_feature_select_strategy="default",
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    return _finish(InternVLForConditionalGeneration(cfg), tok), proc


def _gemma3(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """Gemma 3: SigLIP tower (4x4 patches of 32 px), average-pooled to 2x2 = 4 soft tokens an image, Gemma 3 decoder
    (one sliding-window layer, one global); the template writes ``<start_of_image>``, which the processor expands
    to ``<start_of_image>`` + 4 x ``<image_soft_token>`` + ``<end_of_image>``."""
    tok = _tokenizer(named={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                            "eoi_token": "<end_of_image>"}, placeholder="<start_of_image>")
    images = Gemma3ImageProcessorPil(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    proc = Gemma3Processor(images, tok, chat_template=tok.chat_template, image_seq_length=4)
    cfg = Gemma3Config(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8),
        text_config=_text("gemma3_text", tok, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                          sliding_window=128,
                          query_pre_attn_scalar=8, hidden_activation="gelu_pytorch_tanh"),
        mm_tokens_per_image=4, image_token_index=tok.image_token_id, boi_token_index=tok.boi_token_id,
        eoi_token_index=tok.eoi_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(cfg)
    with torch.no_grad():  # transformers initialises the projection at zero: every image would embed as zeros
        torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.5)
    return _finish(model, tok), proc


QWEN_TOKENS = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
               "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"}
QWEN_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"  # what Qwen's chat templates write for an image


def _gemma4(seed: int, kv_shared: int = 0) -> tuple[PreTrainedModel, ProcessorMixin]:
    """Gemma 4 (dense, as the 31B): Gemma 4 vision encoder (patch 8, 2-D RoPE, 2x2 pooling; images kept at their
    aspect ratio, up to 70 soft tokens: its least budget), Gemma 4 decoder (sliding layers with head 8, a global one
    with head 16, bidirectional attention over image tokens); the template writes ``<|image|>``, which the processor
    expands to ``<start_of_image>`` + n x ``<|image|>`` + ``<end_of_image>``. Processor:
    ``Gemma4ProcessorImageOnly``. ``kv_shared`` > 0: as the E2B / E4B checkpoints are built, the last ``kv_shared``
    of 4 layers (sliding, global, sliding, global) reuse the keys / values of the last earlier layer of their kind,
    with per-layer inputs (width 8); at prefill transformers runs those layers on the last ``logits_to_keep``
    positions only."""
    tok = _tokenizer(named={"image_token": "<|image|>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                            "video_token": "<|video|>", "audio_token": "<audio_soft_token>",
                            "boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>"},
                     placeholder="<|image|>")
    images = Gemma4ImageProcessorPil(patch_size=8, max_soft_tokens=70, pooling_kernel_size=2)  # 70: its least
    proc = Gemma4ProcessorImageOnly(Gemma4AudioFeatureExtractor(), images, tok, chat_template=tok.chat_template,
                                    image_seq_length=70)
    layers = (["sliding_attention", "full_attention"] * 2 if kv_shared else
              ["sliding_attention", "sliding_attention", "full_attention"])
    text = _text("gemma4_text", tok, layer_types=layers, num_hidden_layers=len(layers), sliding_window=512,
                 global_head_dim=16, num_kv_shared_layers=kv_shared, use_bidirectional_attention="vision",
                 hidden_activation="gelu_pytorch_tanh",
                 **(dict(hidden_size_per_layer_input=8, vocab_size_per_layer_input=len(tok)) if kv_shared else
                    dict(hidden_size_per_layer_input=0)))
    ids = tok.convert_tokens_to_ids
    cfg = Gemma4Config(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=4, head_dim=8, patch_size=8, pooling_kernel_size=2,
                           position_embedding_size=64),
        text_config=text, audio_config=None, image_token_id=tok.image_token_id, boi_token_id=tok.boi_token_id,
        eoi_token_id=tok.eoi_token_id, video_token_id=tok.video_token_id, audio_token_id=tok.audio_token_id,
        boa_token_id=ids("<start_of_audio>"), eoa_token_index=ids("<end_of_audio>"), tie_word_embeddings=False)
    torch.manual_seed(seed)
    return _finish(Gemma4ForConditionalGeneration(cfg), tok), proc


def _qwen_processor(byte_level: bool = False) -> ProcessorMixin:
    """Qwen3-VL's processor: Qwen2-VL PIL image processor, patch 8, 2x2 merge, images resized to 32-64 px a side;
    the world tokenizer, or with ``byte_level`` a byte-level BPE over the world's words (Qwen3.5's, see
    ``_byte_level_tokenizer``)."""
    tok = (_byte_level_tokenizer if byte_level else _tokenizer)(named=QWEN_TOKENS, placeholder=QWEN_PLACEHOLDER)
    images = Qwen2VLImageProcessorPil(min_pixels=32 * 32, max_pixels=64 * 64, patch_size=8, merge_size=2,
                                      temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return Qwen3VLProcessorImageOnly(images, tok, chat_template=tok.chat_template)


def _qwen_ids(tok) -> dict:
    return dict(image_token_id=tok.image_token_id, video_token_id=tok.video_token_id,
                vision_start_token_id=tok.vision_start_token_id, vision_end_token_id=tok.vision_end_token_id)


QWEN_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=8, spatial_merge_size=2,
                   temporal_patch_size=2, out_hidden_size=32, num_position_embeddings=16)
# Qwen3.5's decoder: two Gated DeltaNet (linear attention) layers, then a full-attention layer with a gated output;
# M-RoPE on a quarter of each 32-wide head (8 dims = 4 pairs split over t, h, w), interleaved
QWEN3_5_TEXT = dict(head_dim=32, layer_types=["linear_attention", "linear_attention", "full_attention"], linear_conv_kernel_dim=4,
                    linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                     "mrope_section": [2, 1, 1], "mrope_interleaved": True})
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


def _qwen3_5(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """Qwen3.5: Qwen3-VL-style tower (patch 8, 2x2 merger), hybrid Gated DeltaNet / attention decoder.
    Processor: ``Qwen3VLProcessorImageOnly`` (no video processor) with a ``Qwen3_5Tokenizer``."""
    proc = _qwen_processor(byte_level=True)
    tok = proc.tokenizer
    cfg = Qwen3_5Config(vision_config=QWEN_VISION, text_config=_text("qwen3_5_text", tok, **QWEN3_5_TEXT),
                        tie_word_embeddings=False, **_qwen_ids(tok))
    torch.manual_seed(seed)
    return _finish(Qwen3_5ForConditionalGeneration(cfg), tok), proc


def _qwen3_5_moe(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """Qwen3.5-MoE: as Qwen3.5, with 4 experts (2 a token) and a shared expert in every layer."""
    proc = _qwen_processor(byte_level=True)
    tok = proc.tokenizer
    text = _text("qwen3_5_moe_text", tok, **QWEN3_5_TEXT, **MOE, shared_expert_intermediate_size=16)
    del text["intermediate_size"]
    cfg = Qwen3_5MoeConfig(vision_config=QWEN_VISION, text_config=text, tie_word_embeddings=False, **_qwen_ids(tok))
    torch.manual_seed(seed)
    return _finish(Qwen3_5MoeForConditionalGeneration(cfg), tok), proc


def _qwen3_vl_moe(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """Qwen3-VL-MoE: Qwen3-VL tower with a DeepStack feature from its first layer, Qwen3-MoE decoder (4 experts, 2
    a token) with interleaved M-RoPE. Processor: ``Qwen3VLProcessorImageOnly`` (no video processor)."""
    proc = _qwen_processor()
    tok = proc.tokenizer
    text = _text("qwen3_vl_moe_text", tok, **MOE, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    cfg = Qwen3VLMoeConfig(vision_config={**QWEN_VISION, "deepstack_visual_indexes": [0]}, text_config=text,
                           tie_word_embeddings=False, **_qwen_ids(tok))
    torch.manual_seed(seed)
    return _finish(Qwen3VLMoeForConditionalGeneration(cfg), tok), proc


# Idefics3 / SmolVLM split an image into 32 px tiles (up to 2x2 for 64 px) plus a global view; each tile gives
# (32/8)^2 / 2^2 = 4 tokens after the pixel shuffle, written as <fake_token_around_image><row_i_col_j><image>x4
IDEFICS_TOKENS = ("<fake_token_around_image>", "<end_of_utterance>", "<global-img>",
                  *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)))
IDEFICS_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      image_size=32, patch_size=8)


def _idefics3(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """Idefics3: SigLIP-style tower on 32 px tiles (image split into tiles + a global view), pixel-shuffle connector,
    LLaMA decoder."""
    tok = _tokenizer(extra=IDEFICS_TOKENS)
    images = Idefics3ImageProcessorPil(size={"longest_edge": 64}, max_image_size={"longest_edge": 32},
                                       do_image_splitting=True, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    proc = Idefics3Processor(images, tok, image_seq_len=4, chat_template=tok.chat_template)
    cfg = Idefics3Config(vision_config=IDEFICS_VISION, text_config=_text("llama", tok),
                         image_token_id=tok.image_token_id, scale_factor=2, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    return _finish(Idefics3ForConditionalGeneration(cfg), tok), proc


def _smolvlm(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """SmolVLM: Idefics3's layout (tiles + global view, pixel-shuffle connector), LLaMA decoder.
    Processor: ``SmolVLMProcessorImageOnly`` (no video processor, no ``num2words``)."""
    tok = _tokenizer(named={"fake_image_token": "<fake_token_around_image>", "global_image_token": "<global-img>",
                            "end_of_utterance_token": "<end_of_utterance>", "video_token": "<video>"},
                     extra=IDEFICS_TOKENS)
    images = SmolVLMImageProcessorPil(size={"longest_edge": 64}, max_image_size={"longest_edge": 32},
                                      do_image_splitting=True, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    proc = SmolVLMProcessorImageOnly(images, tok, image_seq_len=4, chat_template=tok.chat_template)
    cfg = SmolVLMConfig(vision_config=IDEFICS_VISION, text_config=_text("llama", tok),
                        image_token_id=tok.image_token_id, scale_factor=2, pad_token_id=tok.pad_token_id,
                        tie_word_embeddings=False)
    torch.manual_seed(seed)
    return _finish(SmolVLMForConditionalGeneration(cfg), tok), proc


def _glm4v(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """GLM-4.1V: GLM-4V tower (patch 8, 2x2 merge; 2-D RoPE + interpolated absolute positions), GLM-4 decoder
    (hidden 64, head 16, M-RoPE on half of each head, split [2, 1, 1]; post-attention / post-MLP norms).
    Processor: ``Glm4vProcessorImageOnly`` (no video processor)."""
    tok = _tokenizer(named={"image_token": "<|image|>", "video_token": "<|video|>"},
                     extra=("<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>"),
                     placeholder="<|begin_of_image|><|image|><|end_of_image|>")
    images = Glm4vImageProcessorPil(size={"shortest_edge": 32 * 32, "longest_edge": 64 * 64}, patch_size=8,
                                    temporal_patch_size=2, merge_size=2)
    proc = Glm4vProcessorImageOnly(images, tok, chat_template=tok.chat_template)
    text = _text("glm4v_text", tok, hidden_size=64, intermediate_size=128, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]})
    del text["head_dim"], text["tie_word_embeddings"]  # head_dim = hidden_size / heads
    ids = tok.convert_tokens_to_ids
    cfg = Glm4vConfig(
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, image_size=32, patch_size=8,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64),
        text_config=text, image_token_id=tok.image_token_id, video_token_id=tok.video_token_id,
        image_start_token_id=ids("<|begin_of_image|>"), image_end_token_id=ids("<|end_of_image|>"),
        video_start_token_id=ids("<|begin_of_video|>"), video_end_token_id=ids("<|end_of_video|>"),
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    return _finish(Glm4vForConditionalGeneration(cfg), tok), proc


FAMILY_BUILDERS: dict[str, Callable[[int], tuple[PreTrainedModel, ProcessorMixin]]] = {
    "llava_next": _llava_next,
    "llava_onevision": _llava_onevision,
    "mistral3": _mistral3,
    "internvl": _internvl,
    "gemma3": _gemma3,
    "qwen3_5": _qwen3_5,
    "qwen3_vl_moe": _qwen3_vl_moe,
    "idefics3": _idefics3,
    "smolvlm": _smolvlm,
    "glm4v": _glm4v,
    "qwen3_5_moe": _qwen3_5_moe,
    "gemma4": _gemma4,
}


def _preset(name: str) -> Callable[[int], tuple[PreTrainedModel, ProcessorMixin]]:
    """A world preset (``keepsight world tiny --preset NAME``) as a builder: written as that command writes it, read
    back by keepsight's loader (float32)."""
    def build(seed: int):
        from keepsight.models import load_checkpoint
        from keepsight.world.models import save_tiny_checkpoint

        with tempfile.TemporaryDirectory() as tmp:
            return load_checkpoint(save_tiny_checkpoint(name, Path(tmp) / "m", seed), dtype="float32", device="cpu")
    return build


def _bridged(seed: int) -> tuple[PreTrainedModel, ProcessorMixin]:
    """A tiny LLaVA whose projector is a fresh LIA-MTR bridge (``model_type`` ``keepsight_llava``)."""
    from keepsight.bridge import replace_projector

    model, processor = _preset("tiny-llava")(seed)
    torch.manual_seed(seed)
    return replace_projector(model, "lia_mtr").eval(), processor


FAMILY_BUILDERS.update({"llava": _preset("tiny-llava"), "keepsight_llava": _bridged,
                        "qwen3_vl": _preset("tiny-qwen3vl"), "qwen2_5_vl": _preset("tiny-qwen25vl")})


# ----------------------------------------------------------------------------- the API


def tiny_family(kind: str, seed: int = 0) -> tuple[PreTrainedModel, ProcessorMixin]:
    """A tiny random model of transformers ``model_type`` ``kind`` (eval mode, generation ids set) and its
    processor; the same weights for the same ``seed``."""
    if kind not in FAMILY_BUILDERS:
        raise ValueError(f"unknown family {kind!r}; choose from {sorted(FAMILY_BUILDERS)}")
    return FAMILY_BUILDERS[kind](seed)


def save_family(kind: str, out_dir, seed: int = 0) -> Path:
    """Write ``tiny_family(kind, seed)`` (weights, config, processor, tokenizer, chat template) into ``out_dir``."""
    model, processor = tiny_family(kind, seed)
    out = Path(out_dir)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def family_batch(processor, questions: list[str], images: list) -> BatchFeature:
    """Model inputs for one image and one question per row, as keepsight renders them (``render_prompt``: the
    processor's chat template, the image then the text, the generation prompt), left padded."""
    texts = [render_prompt(processor, Sample.single_turn(q, image=im)) for q, im in zip(questions, images)]
    with padding_side(processor.tokenizer, "left"):
        return processor(text=texts, images=[[im] for im in images], return_tensors="pt", padding=True)


# ----------------------------------------------------------------------------- structural facts
# Printed from the models above (transformers 5.24), not recalled. Paths are from the top model
# (``...ForConditionalGeneration``); "model" is that object. Every decoder stack has ``.layers``, ``.norm`` (final
# RMSNorm), ``.rotary_emb``, ``.embed_tokens``; every top model has ``lm_head`` (untied here).
#
# decoder stack (D):     llava_next, llava_onevision, mistral3, internvl, gemma3, gemma4, qwen3_5, qwen3_5_moe,
#                        qwen3_vl_moe, glm4v: model.model.language_model; idefics3, smolvlm: model.model.text_model
# tower / projector:     llava_next (CLIP), llava_onevision (SigLIP): model.model.vision_tower /
#                          model.model.multi_modal_projector (linear_1, act, linear_2) + model.model.image_newline
#                        mistral3: vision_tower (Pixtral) / multi_modal_projector (norm, patch_merger, linear_1, act,
#                          linear_2)
#                        internvl: vision_tower / multi_modal_projector (layer_norm, linear_1, act, linear_2)
#                        gemma3: vision_tower (SigLIP) / multi_modal_projector (mm_soft_emb_norm, avg_pool, the
#                          parameter mm_input_projection_weight)
#                        gemma4: vision_tower (patch_embedder, encoder, pooler) / embed_vision
#                          (embedding_pre_projection_norm, embedding_projection)
#                        qwen3_5, qwen3_5_moe: model.model.visual / model.model.visual.merger
#                        qwen3_vl_moe: model.model.visual / visual.merger + visual.deepstack_merger_list (DeepStack:
#                          D adds those features to the image positions' hidden states after layers 0..k-1)
#                        glm4v: model.model.visual / visual.merger (after visual.downsample, a Conv2d)
#                        idefics3, smolvlm: model.model.vision_model / model.model.connector (modality_projection)
# decoder layer:         self_attn (q_proj, k_proj, v_proj, o_proj), mlp, input_layernorm, post_attention_layernorm;
#                        the norm whose input is the residual stream after attention (the MLP's input norm) is
#                        post_attention_layernorm, except:
#                        gemma3, gemma4: post_attention_layernorm normalises the attention OUTPUT (before the residual
#                          add); pre_feedforward_layernorm takes the residual stream; post_feedforward_layernorm
#                          normalises the MLP output. gemma4 also multiplies each layer's output by the buffer
#                          layer_scalar (ones) and has q_norm, k_norm and v_norm.
#                        glm4v: post_self_attn_layernorm normalises the attention output, post_attention_layernorm
#                          takes the residual stream (as LLaMA), post_mlp_layernorm normalises the MLP output; the MLP
#                          is gate_up_proj (fused) + down_proj.
#                        qwen3_5, qwen3_5_moe: "linear_attention" layers have linear_attn (Gated DeltaNet:
#                          in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, norm, out_proj) instead of
#                          self_attn; "full_attention" layers' self_attn has q_norm, k_norm and a sigmoid output gate
#                          (q_proj gives query and gate). output_attentions gives one tensor per FULL-attention layer
#                          only (1 for the 2 layers here).
#                        gemma3, qwen3_*: q_norm, k_norm in self_attn.
# MLP:                   dense gate_proj, up_proj, down_proj everywhere except glm4v (gate_up_proj, down_proj) and:
#                        qwen3_vl_moe: MoE (Qwen3VLMoeTextSparseMoeBlock): gate (router, gate.weight), experts with
#                          fused parameters experts.gate_up_proj, experts.down_proj; no shared expert
#                        qwen3_5_moe: MoE: gate, experts (experts.gate_up_proj, experts.down_proj), shared_expert
#                          (gate_proj, up_proj, down_proj), shared_expert_gate
# image / video ids:     llava_next: image_token_index (alias image_token_id); llava_onevision: image_token_index,
#                        video_token_index; mistral3: image_token_index ([IMG]; [IMG_BREAK] / [IMG_END] get no
#                        features); internvl: image_token_id (<IMG_CONTEXT>); gemma3: image_token_index,
#                        boi_token_index, eoi_token_index; gemma4: image_token_id, boi_token_id, eoi_token_id,
#                        video_token_id, audio_token_id, boa_token_id, eoa_token_index; qwen3_5, qwen3_5_moe,
#                        qwen3_vl_moe: image_token_id, video_token_id, vision_start_token_id, vision_end_token_id;
#                        glm4v: image_token_id, video_token_id, image_start_token_id, image_end_token_id,
#                        video_start_token_id, video_end_token_id; idefics3, smolvlm: image_token_id
# processor outputs:     all: input_ids, attention_mask, pixel_values, and
#                        llava_next: image_sizes; llava_onevision: image_sizes, batch_num_images; mistral3:
#                        image_sizes; internvl: nothing more (pixel_values = every tile of the batch, flat);
#                        gemma3: token_type_ids; gemma4: mm_token_type_ids, image_position_ids; qwen3_*, glm4v:
#                        mm_token_type_ids, image_grid_thw (pixel_values = flat patches); idefics3, smolvlm:
#                        pixel_attention_mask
# RoPE (text):           1-D: llava_next, llava_onevision, mistral3, internvl, idefics3, smolvlm; gemma3: 1-D, one
#                        theta per layer type; gemma4: 1-D, "default" for sliding layers, "proportional" (partial
#                        0.25) for full ones; M-RoPE (rope_parameters.mrope_section): qwen3_5, qwen3_5_moe
#                        (interleaved, partial 0.25), qwen3_vl_moe (interleaved), glm4v (partial 0.5). The M-RoPE
#                        ones cache rope_deltas on model.model (recomputed when a forward starts with an empty cache).
# Gemma extras:          gemma3, gemma4: embed_tokens is a ScaledWordEmbedding (embed_scale = sqrt(hidden_size));
#                        final_logit_softcapping / attn_logit_softcapping are None in these configs (the default).
# what generate needs:   qwen3_5, qwen3_5_moe, qwen3_vl_moe, glm4v: mm_token_type_ids (without it forward and
#                        generate raise ValueError); gemma4: mm_token_type_ids and gemma3: token_type_ids
#                        (without them both run, but the image tokens lose their bidirectional attention and the
#                        logits change); the others: nothing beyond the processor's outputs.


def registered_settings() -> tuple[dict[str, dict], dict[str, dict]]:
    """(ZERO, STRONG): each registered autoregressive decoding method's declared test settings, by name, read from the
    registry (a method registered with them is tested with no list here to edit)."""
    names = [n for n in method_names("decode", "autoregressive") if METHODS[n].zero is not None]
    return {n: METHODS[n].zero for n in names}, {n: METHODS[n].strong for n in names}
