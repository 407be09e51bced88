"""LLaDA-V as shipped: the directory of the official release (``config.json`` of ``model_type = "llava_llada"``,
the LLaVA repository's weight layout) loaded with no hand-written config.

The official ``config.json`` holds the language model's LLaMA fields (``hidden_size``, ``num_hidden_layers``,
``rope_theta``, ...) beside LLaVA's ``mm_*`` fields, and names its vision tower (``mm_vision_tower``) by hub id.
``official_config`` builds the ``LlavaConfig`` our classes need:

- text: a ``LladaConfig`` from the LLaMA fields (bidirectional, untied head; ``mask_token_id`` from the tokenizer,
  else LLaDA's 126336);
- vision: a ``SiglipVisionConfig`` from ``mm_vision_tower`` - a local directory's ``config.json`` when it names
  one, else the published sizes of the SigLIP / SigLIP-2 so400m towers LLaDA-V uses (``KNOWN_TOWERS``; anything
  else is an error naming the field);
- projector: ``mm_projector_type = "mlp2x_gelu"`` is LLaVA's two-layer GELU projector (the only one accepted);
- features: layer ``mm_vision_select_layer`` (LLaDA-V: -2, the second-to-last), every patch (SigLIP has no CLS).

``official_processor`` builds a ``LlavaProcessor``: the directory's tokenizer (an ``<image>`` token added when it
has none; its id must fall inside the embedding table, LLaDA's has unused rows), the tower's image processor (a
local tower directory's ``preprocessor_config.json``, else SigLIP's at the tower's image size: resize, rescale,
normalise to mean = std = 0.5), and LLaDA-V's chat template (LLaMA-3 headers, ``<|eot_id|>`` turn ends) when the
tokenizer carries none. Its special ids (mask 126336, ``<|startoftext|>`` 126080,
``<|endoftext|>`` 126081 = pad, headers 126346 / 126347, ``<|eot_id|>`` 126348) come from the tokenizer.

Our reading: LLaDA-V's ``image_aspect_ratio = "anyres_max_N"`` tiles a large image into crops plus a base view and
inserts ``model.image_newline`` between rows; here every image is one view at the tower's size (LLaVA-1.5's
layout), and ``model.image_newline`` is read and left unused. Answers on large, detailed images may differ from
the official pipeline's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    LlavaConfig,
    LlavaProcessor,
    SiglipImageProcessorPil,
    SiglipVisionConfig,
)

from .llada import LladaConfig

OFFICIAL_MODEL_TYPE = "llava_llada"
UNUSED_KEYS = (r"^model\.image_newline$",)  # read from the checkpoint, not used by the single-view reading
LLADA_MASK_ID = 126336
_SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
           "patch_size": 14, "image_size": 384}
KNOWN_TOWERS = {"google/siglip2-so400m-patch14-384": _SO400M, "google/siglip-so400m-patch14-384": _SO400M}
TEXT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta", "hidden_act",
               "attention_bias", "pad_token_id", "bos_token_id", "eos_token_id")

# LLaDA-V's conversation as its scripts send it (conv_llava_llada in the LLaVA repository's conversation.py, rendered
# by the tokenizer's template): the system prompt first, LLaMA-3 headers, each content trimmed, every turn ended by
# <|eot_id|>; an image question is its images' placeholders joined by spaces, a newline, then the text
LLADA_V_SYSTEM = ("You are a helpful language and vision assistant. You are able to understand the visual content "
                  "that the user provides, and assist the user with a variety of tasks using natural language.")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] != 'system' %}<|start_header_id|>system<|end_header_id|>\n\n"
    + LLADA_V_SYSTEM + "<|eot_id|>{% endif %}"
    "{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}"
    "{% set images = message['content'] | selectattr('type', 'equalto', 'image') | list %}"
    "{% set texts = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join(' ') %}"
    "{% if images %}{{ (['<image>'] * (images | length)) | join(' ') }}\n{% endif %}{{ texts | trim }}{% endif %}"
    "<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# what LLaDA-V's sampler bans at still-masked slots, and where its answers end (LLaDA-V's generate_with_embeds)
SHIPPED_SUPPRESS = ("<|endoftext|>", "<|startoftext|>", "<|start_header_id|>", "<|end_header_id|>")
SHIPPED_STOP = "<|eot_id|>"


def _tower_config(raw: dict, directory: Path) -> tuple[SiglipVisionConfig, Path | None]:
    name = raw.get("mm_vision_tower") or raw.get("vision_tower")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{directory}/config.json names no vision tower (mm_vision_tower)")
    local = Path(name) if Path(name).is_absolute() else directory / name
    if (local / "config.json").is_file():
        try:
            cfg = json.loads((local / "config.json").read_text(encoding="utf-8-sig"))
            cfg = cfg.get("vision_config", cfg)  # a full SiglipConfig, or the vision config itself
        except (ValueError, AttributeError) as e:  # not JSON, or not an object
            raise ValueError(f"{local}/config.json is not a tower config ({type(e).__name__}: {e})") from None
        if not isinstance(cfg, dict) or cfg.get("model_type") not in (None, "siglip_vision_model", "siglip"):
            what = cfg.get("model_type") if isinstance(cfg, dict) else type(cfg).__name__
            raise ValueError(f"{local}/config.json is a {what!r} tower; LLaDA-V's is SigLIP")
        keep = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "transformers_version")}
        try:
            return SiglipVisionConfig(**keep), local
        except (TypeError, ValueError) as e:
            raise ValueError(f"{local}/config.json: not a SigLIP vision config ({e})") from None
    if name in KNOWN_TOWERS:
        return SiglipVisionConfig(**KNOWN_TOWERS[name]), None
    raise ValueError(f"{directory}/config.json: mm_vision_tower {name!r} is neither a local directory with a "
                     f"config.json nor a tower keepsight knows the sizes of ({sorted(KNOWN_TOWERS)})")


def _tokenizer(directory: Path):
    try:
        tok = AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError, TypeError, KeyError) as e:  # no tokenizer files, or unreadable ones
        have = sorted(p.name for p in directory.glob("tokenizer*")) or "none"
        raise ValueError(f"{directory}: cannot load its tokenizer (tokenizer files: {have}; {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if tok.convert_tokens_to_ids("<image>") in (None, tok.unk_token_id):
        tok.add_tokens(["<image>"], special_tokens=True)  # the LLaVA repository used a placeholder id (-200) instead
    return tok


def official_config(raw: dict, directory: str | Path) -> LlavaConfig:
    """The ``LlavaConfig`` (Llada text model, SigLIP tower) of an official LLaDA-V ``config.json`` (see the module
    docstring); errors name the field that does not fit."""
    directory = Path(directory)
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in raw]
    if missing:
        raise ValueError(f"{directory}/config.json lacks the language model's {missing}")
    projector = raw.get("mm_projector_type", "mlp2x_gelu")
    if projector != "mlp2x_gelu":
        raise ValueError(f"{directory}/config.json: mm_projector_type {projector!r}; keepsight reads LLaDA-V's "
                         "'mlp2x_gelu' (two linear layers with a GELU)")
    vision, _ = _tower_config(raw, directory)
    if raw.get("mm_hidden_size") not in (None, vision.hidden_size):
        raise ValueError(f"{directory}/config.json: mm_hidden_size {raw['mm_hidden_size']} but the tower is "
                         f"{vision.hidden_size} wide")
    tok = _tokenizer(directory)
    mask = tok.mask_token_id
    if mask is None:
        mask = tok.convert_tokens_to_ids("<|mdm_mask|>")
    if mask in (None, tok.unk_token_id):
        mask = LLADA_MASK_ID
    text = LladaConfig(**{k: raw[k] for k in TEXT_FIELDS if raw.get(k) is not None}, mask_token_id=int(mask),
                       tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)))
    image_id = tok.convert_tokens_to_ids("<image>")
    if not 0 <= image_id < text.vocab_size:
        raise ValueError(f"the <image> token (id {image_id}) falls outside the {text.vocab_size}-row embedding table")
    side = vision.image_size // vision.patch_size
    return LlavaConfig(vision_config=vision.to_dict(), text_config=text.to_dict(), image_token_id=int(image_id),
                       projector_hidden_act="gelu", vision_feature_select_strategy="full",
                       vision_feature_layer=int(raw.get("mm_vision_select_layer", -2)), image_seq_length=side * side,
                       tie_word_embeddings=False)


def shipped_decoding(tokenizer) -> tuple[list[int], list[int]]:
    """``(suppress_ids, stop_ids)`` of LLaDA-V's sampler as shipped, looked up in ``tokenizer``: the end / start of
    text and the header ids get -inf at still-masked slots, and an answer ends before the first ``<|eot_id|>``.
    A tokenizer without those tokens (not LLaDA's) gives ``([], [])``."""
    def ids(names):
        found = [tokenizer.convert_tokens_to_ids(n) for n in names]
        return [int(i) for i in found if i is not None and i != tokenizer.unk_token_id]

    return ids(SHIPPED_SUPPRESS), ids([SHIPPED_STOP])


def drop_after_image(processor, out, text):
    """The ids the LLaVA repository's ``tokenizer_image_token`` makes (LLaDA-V's and LaViDa's inference): it
    tokenizes the prompt in pieces around each ``<image>`` and, because the template's text already starts with the
    bos token, drops the first token of every piece after an image (for LLaDA's tokenizer: the newline after the
    image). ``out``: a processor's output for ``text``; the same token is dropped from each row starting with bos
    (and the padding and attention mask rebuilt)."""
    if text is None or "input_ids" not in out:
        return out
    ids, mask = out["input_ids"], out.get("attention_mask")
    tensor = isinstance(ids, torch.Tensor)
    rows = ids.tolist() if tensor else [list(r) for r in ([ids] if ids and isinstance(ids[0], int) else ids)]
    keep = mask.tolist() if tensor and mask is not None else [[1] * len(r) for r in rows]
    image_id, bos = processor.tokenizer.convert_tokens_to_ids(processor.image_token), processor.tokenizer.bos_token_id
    kept = []
    for row, m in zip(rows, keep):
        real = [t for t, on in zip(row, m) if on]
        if real and real[0] == bos:
            real = [t for j, t in enumerate(real) if not (j and real[j - 1] == image_id and t != image_id)]
        kept.append(real)
    width = max(len(r) for r in kept)
    pad = processor.tokenizer.pad_token_id if processor.tokenizer.pad_token_id is not None else 0
    left = processor.tokenizer.padding_side == "left"

    def padded(r, fill):
        extra = [fill] * (width - len(r))
        return extra + r if left else r + extra

    new_ids = [padded(r, pad) for r in kept]
    new_mask = [padded([1] * len(r), 0) for r in kept]
    if tensor:
        out["input_ids"] = torch.tensor(new_ids, dtype=ids.dtype)
        if mask is not None:
            out["attention_mask"] = torch.tensor(new_mask, dtype=mask.dtype)
        if "mm_token_type_ids" in out:
            out["mm_token_type_ids"] = (out["input_ids"] == image_id).to(out["mm_token_type_ids"].dtype)
    else:
        out["input_ids"] = new_ids if len(new_ids) > 1 or not isinstance(ids[0], int) else new_ids[0]
    return out


class LladaVProcessor(LlavaProcessor):
    """LLaDA-V's processor as its scripts run: LlavaProcessor's images and text, LLaDA-V's conversation template, and
    the ids its ``tokenizer_image_token`` makes (``drop_after_image``). Saved, it is a plain ``LlavaProcessor``
    (without the drop)."""

    def __call__(self, images=None, text=None, **kwargs):
        return drop_after_image(self, super().__call__(images=images, text=text, **kwargs), text)

    def save_pretrained(self, save_directory, **kwargs):
        plain = LlavaProcessor(image_processor=self.image_processor, tokenizer=self.tokenizer, patch_size=self.patch_size,
                               vision_feature_select_strategy=self.vision_feature_select_strategy,
                               chat_template=self.chat_template, image_token=self.image_token,
                               num_additional_image_tokens=self.num_additional_image_tokens)
        return plain.save_pretrained(save_directory, **kwargs)


def official_processor(directory: str | Path, config: LlavaConfig) -> LladaVProcessor:
    """The processor of an official LLaDA-V directory (see the module docstring). The tokenizer's own chat template is
    not used: LLaDA-V's renders string content only and has no system prompt; its scripts send the conversation
    above."""
    directory = Path(directory)
    raw = json.loads((directory / "config.json").read_text())
    _, local = _tower_config(raw, directory)
    vision = config.vision_config
    if local is not None and (local / "preprocessor_config.json").is_file():
        images = SiglipImageProcessorPil.from_pretrained(local)
    elif (directory / "preprocessor_config.json").is_file():
        images = SiglipImageProcessorPil.from_pretrained(directory)
    else:
        images = SiglipImageProcessorPil(size={"height": vision.image_size, "width": vision.image_size},
                                      image_mean=[0.5] * 3, image_std=[0.5] * 3)
    tok = _tokenizer(directory)
    return LladaVProcessor(image_processor=images, tokenizer=tok, patch_size=vision.patch_size,
                           vision_feature_select_strategy="full", num_additional_image_tokens=0,
                           image_token="<image>", chat_template=CHAT_TEMPLATE)
