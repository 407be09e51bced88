"""Tiny real Hugging Face VLMs, built from configs (never downloaded), with the world's tokenizer ids.

``tiny-llava``: ``LlavaForConditionalGeneration`` = CLIP vision tower + 2-layer GELU projector + Qwen3
text model. ``tiny-qwen3vl`` / ``tiny-qwen25vl``: ``Qwen3VLForConditionalGeneration`` /
``Qwen2_5_VLForConditionalGeneration`` with a tiny vision tower and text model. ``build_llada_lm`` /
``build_llada_v``: a tiny LLaDA (masked-diffusion) LM and a LLaDA-V-style VLM with a preset's sizes.
A preset's ``arch`` is the architecture table's kind (``keepsight.models.arch``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen3Config,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    SiglipImageProcessorPil,
    SiglipVisionConfig,
)

from ..atomic import atomic_save_dir
from ..models import LladaConfig, LladaForMaskedDiffusion, QwenImageProcessor, register_model_types
from ..models.lavida import (
    NO_SHRINK,
    LavidaConfig,
    LavidaForConditionalGeneration,
    LavidaProcessor,
    hf_pinpoints,
    lavida_image_processor,
)
from ..models.llada_official import CHAT_TEMPLATE as LLADA_V_TEMPLATE
from .processor import CHAT_TEMPLATE, IMAGE, build_processor, build_tokenizer


@dataclass(frozen=True)
class TinyPreset:
    """Sizes of a tiny VLM. ``vision_*`` describe the tower, ``text_*`` the language model."""

    arch: str  # the architecture kind: "llava" | "qwen3_vl" | "qwen2_5_vl"
    image_size: int = 64
    patch_size: int = 16  # = the default world's cell size: one patch token per grid cell
    vision_hidden: int = 96
    vision_layers: int = 3
    vision_heads: int = 4
    text_hidden: int = 128
    text_layers: int = 4
    text_heads: int = 4
    text_kv_heads: int = 2
    text_intermediate: int = 384
    max_positions: int = 1024
    text_model: str = "qwen3"  # the LLaVA's language model: "qwen3" | "llama" (LLaVA-1.5's)
    feature_layer: int = -1  # the tower layer the LLaVA reads (LLaVA-1.5: -2, the second to last)
    feature_strategy: str = "full"  # "full" (every token, CLS included) | "default" (patches only: LLaVA-1.5's)
    rope_theta: float | None = None  # the language model's RoPE base (None: its config class's default, 10,000)

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["rope_theta"] is None:  # a preset without it keeps the dict it had before the field existed
            del d["rope_theta"]
        return d


PRESETS: dict[str, TinyPreset] = {
    "tiny-llava": TinyPreset(arch="llava"),
    "tiny-llava-6l": TinyPreset(arch="llava", text_layers=6),
    "tiny-qwen3vl": TinyPreset(arch="qwen3_vl", patch_size=8, vision_hidden=64, vision_layers=2),
    "tiny-llava-p8": TinyPreset(arch="llava", patch_size=8),  # 65 image tokens (4 per cell)
    # RoPE base 300: the attention of a far position rotates through its slowest frequency within the few hundred
    # tokens of a long world conversation (at the default 10,000 it barely turns), so reaching the image takes more the
    # further the text has run from it: the regime recipe's base (keepsight.world.base.REGIME_RECIPE)
    "tiny-llava-r300": TinyPreset(arch="llava", rope_theta=300.0),
    "tiny-qwen25vl": TinyPreset(arch="qwen2_5_vl", patch_size=8, vision_hidden=64, vision_layers=2),
    # LLaVA-1.5's layout (a LLaMA language model, the tower's second-to-last layer, patch tokens only) at 32 layers, the
    # depth MemVR's released code assumes; as many KV heads as heads (PAI's released attention has no GQA)
    "tiny-llava-1.5": TinyPreset(arch="llava", vision_hidden=32, vision_layers=2, vision_heads=2, text_hidden=64,
                                 text_layers=32, text_heads=4, text_kv_heads=4, text_intermediate=128,
                                 text_model="llama", feature_layer=-2, feature_strategy="default"),
}


def get_preset(name: str) -> TinyPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return PRESETS[name]


def preset_processor(preset: str | TinyPreset):
    """The ``LlavaProcessor`` matching a LLaVA preset's image and patch size and its feature strategy."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    return build_processor(p.image_size, p.patch_size, strategy=p.feature_strategy)


def _rope(preset: TinyPreset) -> dict:
    """The text config's RoPE argument for ``preset`` (none: the config class's default base)."""
    if preset.rope_theta is None:
        return {}
    return {"rope_parameters": {"rope_type": "default", "rope_theta": float(preset.rope_theta)}}


def text_config(preset: TinyPreset, tokenizer):
    """The text config (Qwen3, or LLaMA for LLaVA-1.5's layout) shared by the text-only LM and the VLM's language
    model."""
    rope = _rope(preset)
    if preset.text_model == "llama":
        return LlamaConfig(**rope, vocab_size=len(tokenizer), hidden_size=preset.text_hidden,
                           intermediate_size=preset.text_intermediate, num_hidden_layers=preset.text_layers,
                           num_attention_heads=preset.text_heads, num_key_value_heads=preset.text_kv_heads,
                           max_position_embeddings=preset.max_positions, rms_norm_eps=1e-5, tie_word_embeddings=False,
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id)
    return Qwen3Config(
        **rope,
        vocab_size=len(tokenizer),
        hidden_size=preset.text_hidden,
        intermediate_size=preset.text_intermediate,
        num_hidden_layers=preset.text_layers,
        num_attention_heads=preset.text_heads,
        num_key_value_heads=preset.text_kv_heads,
        head_dim=preset.text_hidden // preset.text_heads,
        max_position_embeddings=preset.max_positions,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def vision_config(preset: TinyPreset):
    return CLIPVisionConfig(
        hidden_size=preset.vision_hidden,
        intermediate_size=preset.vision_hidden * 4,
        num_hidden_layers=preset.vision_layers,
        num_attention_heads=preset.vision_heads,
        image_size=preset.image_size,
        patch_size=preset.patch_size,
    )


def build_model(preset: str | TinyPreset, tokenizer, seed: int = 0) -> torch.nn.Module:
    """A randomly initialised tiny VLM of ``preset`` for ``tokenizer`` (deterministic by ``seed``)."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    torch.manual_seed(seed)
    if p.arch == "llava":
        cfg = LlavaConfig(
            vision_config=vision_config(p).to_dict(),
            text_config=text_config(p, tokenizer).to_dict(),
            image_token_id=tokenizer.image_token_id,
            projector_hidden_act="gelu",
            vision_feature_select_strategy=p.feature_strategy,
            vision_feature_layer=p.feature_layer,
            image_seq_length=(p.image_size // p.patch_size) ** 2 + (p.feature_strategy == "full"),
            tie_word_embeddings=False,
        )
        model = LlavaForConditionalGeneration(cfg)
    elif p.arch in ("qwen3_vl", "qwen2_5_vl"):
        qwen3 = p.arch == "qwen3_vl"
        tc = text_config(p, tokenizer).to_dict()
        tc["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": _mrope_section(p.text_hidden // p.text_heads)}
        vision = dict(depth=p.vision_layers, hidden_size=p.vision_hidden, num_heads=p.vision_heads,
                      patch_size=p.patch_size, spatial_merge_size=2, temporal_patch_size=2,
                      out_hidden_size=p.text_hidden)
        if qwen3:
            tc["rope_parameters"]["mrope_interleaved"] = True
            vision.update(intermediate_size=p.vision_hidden * 4, deepstack_visual_indexes=[0],
                          num_position_embeddings=(p.image_size // p.patch_size) ** 2)
        else:
            vision.update(intermediate_size=p.vision_hidden * 2, window_size=4 * p.patch_size,
                          fullatt_block_indexes=[p.vision_layers - 1])
        config_cls, model_cls = ((Qwen3VLConfig, Qwen3VLForConditionalGeneration) if qwen3
                                 else (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration))
        cfg = config_cls(
            text_config=tc,
            vision_config=vision,
            image_token_id=tokenizer.image_token_id,
            video_token_id=tokenizer.convert_tokens_to_ids("<video>"),
            vision_start_token_id=tokenizer.convert_tokens_to_ids("<vision_start>"),
            vision_end_token_id=tokenizer.convert_tokens_to_ids("<vision_end>"),
            tie_word_embeddings=False,
        )
        model = model_cls(cfg)
    else:  # pragma: no cover - presets are validated above
        raise ValueError(f"unknown architecture {p.arch!r}")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval()


def _mrope_section(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary pairs over (t, h, w) like Qwen3-VL's [24, 20, 20] of 64."""
    half = head_dim // 2
    h = w = (half * 5) // 16
    return [half - h - w, h, w]


def qwen3vl_inputs(image_processor, tokenizer, prompts: list[str], images: list) -> dict:
    """Model inputs for ``tiny-qwen3vl`` / ``tiny-qwen25vl`` from prompts with a bare ``<image>`` per image:
    each becomes ``<vision_start> <image> <vision_end>`` (what Qwen's chat template writes), then
    ``keepsight.models.QwenImageProcessor`` expands it to the patch count and adds
    ``mm_token_type_ids`` (``Qwen3VLProcessor`` itself needs torchvision for its video half)."""
    texts = [p.replace("<image>", "<vision_start><image><vision_end>") for p in prompts]
    processor = QwenImageProcessor(image_processor, tokenizer, "<image>")
    return processor(text=texts, images=images, return_tensors="pt", padding=True)


# ----------------------------------------------------------------------------- tiny masked-diffusion models


def llada_text_config(tokenizer, preset: str | TinyPreset = "tiny-llava") -> LladaConfig:
    """A ``LladaConfig`` with the sizes of a tiny preset's text model and ``tokenizer``'s ids."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    if tokenizer.mask_token_id is None:
        raise ValueError("the tokenizer has no mask token; a masked-diffusion LM needs one")
    return LladaConfig(
        **_rope(p), vocab_size=len(tokenizer), hidden_size=p.text_hidden, intermediate_size=p.text_intermediate,
        num_hidden_layers=p.text_layers, num_attention_heads=p.text_heads, num_key_value_heads=p.text_kv_heads,
        head_dim=p.text_hidden // p.text_heads, max_position_embeddings=p.max_positions, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        mask_token_id=tokenizer.mask_token_id,
    )


def build_llada_lm(tokenizer, preset: str | TinyPreset = "tiny-llava", seed: int = 0) -> LladaForMaskedDiffusion:
    """A randomly initialised text-only tiny LLaDA (deterministic by ``seed``)."""
    torch.manual_seed(seed)
    return LladaForMaskedDiffusion(llada_text_config(tokenizer, preset)).eval()


def build_llada_v(processor, preset: str | TinyPreset = "tiny-llava", seed: int = 0) -> LlavaForConditionalGeneration:
    """A tiny LLaDA-V-style VLM: HF ``LlavaForConditionalGeneration`` (CLIP tower, 2-layer GELU
    projector) whose language model is a ``LladaModel``; sizes from a LLaVA preset."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    if p.arch != "llava":
        raise ValueError(f"build_llada_v needs a LLaVA preset, got arch {p.arch!r}")
    register_model_types()  # LlavaConfig resolves its "llada" text_config through the Auto classes
    tok = processor.tokenizer
    torch.manual_seed(seed)
    cfg = LlavaConfig(
        vision_config=vision_config(p).to_dict(), text_config=llada_text_config(tok, p).to_dict(),
        image_token_id=tok.image_token_id, projector_hidden_act="gelu", vision_feature_select_strategy="full",
        vision_feature_layer=-1, image_seq_length=(p.image_size // p.patch_size) ** 2 + 1, tie_word_embeddings=False,
    )
    model = LlavaForConditionalGeneration(cfg)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(tok, key))
    return model.eval()


# ----------------------------------------------------------------------------- checkpoint directories

QWEN_CHAT_TEMPLATE_IMAGE = " <vision_start> <image> <vision_end>"  # what Qwen-VL templates write per image


TINY_KIND = "tiny-model"  # keepsight's marker in a directory save_tiny_checkpoint wrote
TINY_CHECKPOINTS = ("tiny-llava", "tiny-llava-6l", "tiny-llava-p8", "tiny-qwen3vl", "tiny-qwen25vl", "tiny-llada-v",
                    "tiny-llada-v-official", "tiny-lavida", "tiny-lavida-official")
OFFICIAL_TOWER_DIR = "siglip-tower"  # where a tiny official-layout LLaDA-V keeps its tower's config


def build_llada_v_siglip(processor, preset: str | TinyPreset = "tiny-llava", seed: int = 0):
    """A tiny LLaDA-V-style VLM with a SigLIP tower (as LLaDA-V's), the layer before the last as its features;
    returns (model, image processor)."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    register_model_types()
    tok = processor.tokenizer
    torch.manual_seed(seed)
    vision = SiglipVisionConfig(hidden_size=p.vision_hidden, intermediate_size=p.vision_hidden * 4,
                                num_hidden_layers=p.vision_layers, num_attention_heads=p.vision_heads,
                                image_size=p.image_size, patch_size=p.patch_size)
    cfg = LlavaConfig(vision_config=vision.to_dict(), text_config=llada_text_config(tok, p).to_dict(),
                      image_token_id=tok.image_token_id, projector_hidden_act="gelu",
                      vision_feature_select_strategy="full", vision_feature_layer=-2,
                      image_seq_length=(p.image_size // p.patch_size) ** 2, tie_word_embeddings=False)
    images = SiglipImageProcessorPil(size={"height": p.image_size, "width": p.image_size}, image_mean=[0.5] * 3,
                                  image_std=[0.5] * 3)
    return LlavaForConditionalGeneration(cfg).eval(), images


# LLaDA's special tokens (names as in its tokenizer) and the tokenizer's own chat template, which renders string
# content only (LLaDA-V's tokenizer_config.json)
LLADA_SPECIAL = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                 "mask_token": "<|mdm_mask|>"}
LLADA_TOKENIZER_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}")


def llada_style_tokenizer():
    """The world tokenizer with LLaDA's special tokens (start / end of text, the header ids, ``<|eot_id|>``, the mask
    ``<|mdm_mask|>``) as its bos / eos / pad / mask, and LLaDA-V's tokenizer template: what a tiny directory in the
    released LLaDA-V layout carries."""
    tok = build_tokenizer()
    tok.add_special_tokens({**LLADA_SPECIAL, "additional_special_tokens": [
        "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}, replace_extra_special_tokens=False)
    tok.chat_template = LLADA_TOKENIZER_TEMPLATE
    return tok


def _renamed(state: dict, rules) -> dict:
    """``state`` (contiguous copies) under a release's names: the first ``(pattern, replacement)`` of ``rules`` that
    matches a key renames it."""
    out = {}
    for key, value in state.items():
        for pattern, repl in rules:
            if re.match(pattern, key):
                key = re.sub(pattern, repl, key)
                break
        out[key] = value.contiguous().clone()
    return out


def official_llada_v_files(model, tokenizer, images, out: Path) -> None:
    """Write ``model`` (a LLaDA-V-style LLaVA with a SigLIP tower) as the official LLaDA-V release lays a directory
    out: ``config.json`` of model_type ``llava_llada`` (LLaMA fields + ``mm_*``), weights with the LLaVA
    repository's names (``model.layers.*``, ``model.mm_projector.{0,2}``, ``model.vision_tower.vision_tower.*``,
    an ``model.image_newline``), the tokenizer, and the tower's config in a subdirectory ``mm_vision_tower``
    names (the official one names a hub id; ``keepsight.models.llada_official`` knows its sizes)."""
    text, vision = model.config.text_config, model.config.vision_config
    rename = ((r"^model\.language_model\.", "model."), (r"^model\.multi_modal_projector\.linear_1\.", "model.mm_projector.0."),
              (r"^model\.multi_modal_projector\.linear_2\.", "model.mm_projector.2."),
              (r"^model\.vision_tower\.", "model.vision_tower.vision_tower."))
    state = _renamed(model.state_dict(), rename)
    state["model.image_newline"] = torch.zeros(text.hidden_size)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    raw = {"model_type": "llava_llada", "architectures": ["LlavaLLaDAModelLM"], "vocab_size": text.vocab_size,
           "hidden_size": text.hidden_size, "intermediate_size": text.intermediate_size,
           "num_hidden_layers": text.num_hidden_layers, "num_attention_heads": text.num_attention_heads,
           "num_key_value_heads": text.num_key_value_heads, "max_position_embeddings": text.max_position_embeddings,
           "rms_norm_eps": text.rms_norm_eps, "rope_theta": text.rope_parameters.get("rope_theta", 10000.0)
           if getattr(text, "rope_parameters", None) else 10000.0, "hidden_act": text.hidden_act,
           "tie_word_embeddings": False, "mm_vision_tower": OFFICIAL_TOWER_DIR, "mm_hidden_size": vision.hidden_size,
           "mm_projector_type": "mlp2x_gelu", "mm_vision_select_layer": -2, "mm_vision_select_feature": "patch",
           "image_aspect_ratio": "anyres_max_4", "mm_patch_merge_type": "spatial_unpad", "use_mm_proj": True}
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    tokenizer.save_pretrained(out)
    tower = out / OFFICIAL_TOWER_DIR
    tower.mkdir(exist_ok=True)
    (tower / "config.json").write_text(json.dumps({**vision.to_dict(), "model_type": "siglip_vision_model"}, indent=2))
    images.save_pretrained(tower)



# a tiny LaViDa: 56 px views of 7 x 7 patches (odd, as so400m's 27), pooled to 4 x 4; the release's pinpoints scaled
LAVIDA_TINY_VIEW = 56
LAVIDA_TINY_PINPOINTS = [[56, 112], [112, 56], [112, 112], [168, 56], [56, 168]]


def build_lavida(seed: int = 0, preset: str | TinyPreset = "tiny-llava"):
    """A tiny random LaViDa (``keepsight.models.lavida``): a SigLIP tower of the preset's widths at 56 px views,
    LaViDa's pooling and packing, a LLaDA language model, over the LLaDA-style world tokenizer; returns
    ``(model, LavidaProcessor)``."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    register_model_types()
    tok = llada_style_tokenizer()
    vision = SiglipVisionConfig(hidden_size=p.vision_hidden, intermediate_size=p.vision_hidden * 4,
                                num_hidden_layers=p.vision_layers, num_attention_heads=p.vision_heads,
                                image_size=LAVIDA_TINY_VIEW, patch_size=8, vision_use_head=False)
    cfg = LavidaConfig(vision_config=vision.to_dict(), text_config=llada_text_config(tok, p).to_dict(),
                       image_token_index=tok.convert_tokens_to_ids(IMAGE), video_token_index=tok.convert_tokens_to_ids(IMAGE),
                       vision_feature_select_strategy="full", vision_feature_layer=-1,
                       image_grid_pinpoints=LAVIDA_TINY_PINPOINTS, vision_aspect_ratio=NO_SHRINK,
                       tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LavidaForConditionalGeneration(cfg).eval()
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(tok, key))
    processor = LavidaProcessor(lavida_image_processor(LAVIDA_TINY_VIEW, LAVIDA_TINY_PINPOINTS), tok,
                                num_image_tokens=cfg.tokens_per_view, chat_template=LLADA_V_TEMPLATE)
    return model, processor


# ours -> LaViDa's released names (the LLaVA repository's module tree over OLMo-style LLaDA blocks)
_LAVIDA_RELEASE_NAMES = (
    (r"^model\.language_model\.layers\.(\d+)\.self_attn\.o_proj\.", r"model.transformer.blocks.\1.attn_out."),
    (r"^model\.language_model\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.", r"model.transformer.blocks.\1.\2_proj."),
    (r"^model\.language_model\.layers\.(\d+)\.mlp\.gate_proj\.", r"model.transformer.blocks.\1.ff_proj."),
    (r"^model\.language_model\.layers\.(\d+)\.mlp\.up_proj\.", r"model.transformer.blocks.\1.up_proj."),
    (r"^model\.language_model\.layers\.(\d+)\.mlp\.down_proj\.", r"model.transformer.blocks.\1.ff_out."),
    (r"^model\.language_model\.layers\.(\d+)\.input_layernorm\.", r"model.transformer.blocks.\1.attn_norm."),
    (r"^model\.language_model\.layers\.(\d+)\.post_attention_layernorm\.", r"model.transformer.blocks.\1.ff_norm."),
    (r"^model\.language_model\.embed_tokens\.", "model.transformer.wte."),
    (r"^model\.language_model\.norm\.", "model.transformer.ln_f."),
    (r"^lm_head\.", "model.transformer.ff_out."),
    (r"^model\.multi_modal_projector\.linear_1\.", "model.mm_projector.0."),
    (r"^model\.multi_modal_projector\.linear_2\.", "model.mm_projector.2."),
    (r"^model\.vision_tower\.", "model.vision_tower.vision_tower.vision_model."),  # LaViDa wraps SigLipVisionModel
)


def official_lavida_files(model, tokenizer, out: Path) -> None:
    """Write a LaViDa model as the release lays a directory out: ``config.json`` of model_type ``llava_llada`` with
    OLMo-style LLaDA fields (``d_model``, ``n_layers``, ...) and the ``mm_*`` fields of the stage-2 script, weights
    with the release's names (``model.transformer.*``, ``model.mm_projector.{0,2}``, ``model.image_newline``,
    ``model.vision_tower.vision_tower.*``), the tokenizer, and the tower's config in the subdirectory
    ``mm_vision_tower`` names, one layer deeper than the weights (the release deletes the tower's last layer)."""
    cfg = model.config
    text, vision = cfg.text_config, cfg.vision_config
    state = _renamed(model.state_dict(), _LAVIDA_RELEASE_NAMES)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    raw = {"model_type": "llava_llada", "architectures": ["LlavaLladaForMaskedDiffusion"], "d_model": text.hidden_size,
           "n_layers": text.num_hidden_layers, "n_heads": text.num_attention_heads,
           "n_kv_heads": text.num_key_value_heads, "mlp_hidden_size": text.intermediate_size,
           "vocab_size": text.vocab_size, "embedding_size": text.vocab_size,
           "max_sequence_length": text.max_position_embeddings, "rope": True,
           "rope_theta": text.rope_parameters["rope_theta"], "rms_norm_eps": text.rms_norm_eps, "include_bias": False,
           "block_type": "llama", "layer_norm_type": "rms", "activation_type": "silu", "weight_tying": False,
           "mask_token_id": text.mask_token_id, "eos_token_id": text.eos_token_id, "pad_token_id": text.pad_token_id,
           "bos_token_id": text.bos_token_id, "mm_vision_tower": OFFICIAL_TOWER_DIR,
           "mm_hidden_size": vision.hidden_size, "mm_projector_type": "mlp2x_gelu", "mm_vision_select_layer": -2,
           "mm_vision_select_feature": "patch", "mm_patch_merge_type": "spatial_unpad", "image_aspect_ratio": "anyres",
           "image_grid_pinpoints": hf_pinpoints(cfg.image_grid_pinpoints),  # the release's (width, height)
           "mm_spatial_pool_mode": cfg.spatial_pool_mode, "mm_newline_position": "grid", "use_mm_proj": True,
           "mm_use_im_start_end": False, "mm_use_im_patch_token": False}
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    tokenizer.save_pretrained(out)
    tower = out / OFFICIAL_TOWER_DIR
    tower.mkdir(exist_ok=True)
    deeper = {**vision.to_dict(), "model_type": "siglip_vision_model", "num_hidden_layers": vision.num_hidden_layers + 1}
    (tower / "config.json").write_text(json.dumps(deeper, indent=2))


def save_tiny_checkpoint(preset: str, out_dir, seed: int = 0) -> Path:
    """Write a tiny *random* VLM directory laid out like a real Hugging Face checkpoint (weights, config, tokenizer,
    image processor, chat template; ``keepsight world tiny``): to try keepsight's loader and methods on each
    architecture without a download. Presets: the LLaVA ones, ``tiny-qwen3vl``, ``tiny-qwen25vl``, and
    ``tiny-llada-v`` (a LLaDA-V-style masked-diffusion VLM). Qwen directories hold a Qwen2-VL image processor and a
    template that brackets the image token with vision start / end markers, as Qwen's do; no video processor (it
    needs torchvision)."""
    if preset not in TINY_CHECKPOINTS:
        raise ValueError(f"unknown preset {preset!r}; choose from {list(TINY_CHECKPOINTS)}")
    out = Path(out_dir)

    def write(d: Path) -> None:
        if preset in ("tiny-lavida", "tiny-lavida-official"):
            model, processor = build_lavida(seed)
            if preset == "tiny-lavida":
                model.save_pretrained(d)
                processor.save_pretrained(d)
            else:
                official_lavida_files(model, processor.tokenizer, d)
            return
        if preset == "tiny-llada-v-official":
            processor = build_processor(tokenizer=llada_style_tokenizer())
            model, images = build_llada_v_siglip(processor, seed=seed)
            official_llada_v_files(model, processor.tokenizer, images, d)
            return
        if preset == "tiny-llada-v":
            processor = build_processor()
            build_llada_v(processor, seed=seed).save_pretrained(d)
            processor.save_pretrained(d)
            return
        p = get_preset(preset)
        torch.manual_seed(seed)
        if p.arch == "llava":
            processor = preset_processor(p)
            build_model(p, processor.tokenizer, seed=seed).save_pretrained(d)
            processor.save_pretrained(d)
            return
        tok = build_processor().tokenizer
        tok.chat_template = CHAT_TEMPLATE.replace(" <image>", QWEN_CHAT_TEMPLATE_IMAGE)
        side = p.image_size
        ip = Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side, patch_size=p.patch_size,
                                      merge_size=2, temporal_patch_size=2)
        build_model(p, tok, seed=seed).save_pretrained(d)
        tok.save_pretrained(d)
        ip.save_pretrained(d)

    return atomic_save_dir(out, write, kind=TINY_KIND)
