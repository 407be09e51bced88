"""LaViDa (Li et al., "LaViDa: A Large Diffusion Language Model for Multimodal Understanding"; the MPS / MRS paper's
second model): a LLaDA masked-diffusion language model behind LLaVA-OneVision's image pipeline, with every view's
visual tokens pooled after the projector. Read from the authors' released code (github.com/jacklishufan/LaViDa,
``llava/model/llava_arch.py``, ``llava/mm_utils.py``, ``llava/model/multimodal_encoder/siglip_encoder.py``).

Image pipeline, as released for a single image (``image_aspect_ratio = "anyres"``, ``mm_patch_merge_type =
"spatial_unpad"``):

1. views: the image resized (aspect kept) and padded black onto the best of ``image_grid_pinpoints``, cut into
   384 px crops, plus a base view squashed to 384 x 384 (LLaVA-OneVision's image processor does exactly this);
2. SigLIP so400m with its last layer removed (26 layers, no head): the last layer's output, 27 x 27 tokens a view;
3. the ``mlp2x_gelu`` projector, **then** each view's 27 x 27 grid pooled to 14 x 14 (``get_2dPool``: bilinear
   interpolation to ``ceil(27 / 2)``, the release's ``mm_spatial_pool_mode`` default; ``average`` / ``max`` pool
   with stride 2) - LaViDa pools every view because its ``ALWASY_DO_2DPOOL`` is on unless an environment variable
   turns it off;
4. packing: the base view's 196 tokens, then the crops as one grid with the black padding's rows / columns removed
   and ``image_newline`` after every row; a single view gets one trailing ``image_newline``. A 384 x 384 image gives
   196 + 14 x 15 = 406 tokens.

``LavidaForConditionalGeneration`` is ``LlavaOnevisionForConditionalGeneration`` with that pooling
(``LavidaProjector``) and packing (``LavidaModel.pack_image_features``, written from the release) and a
``LladaModel`` language model (``text_config`` of type ``llada``: bidirectional). ``LavidaProcessor`` is
LLaVA-OneVision's processor with the pooled token counts and the release's tokenization (the token after each image
dropped, as ``tokenizer_image_token`` does: ``keepsight.models.llada_official.drop_after_image``) and LaViDa's
conversation (LLaDA-V's: the same ``conv_llava_llada``).

Where our reading differs from the release: a prompt with several images in one row gives each image one view and a
trailing newline (196 + 1, LLaVA-OneVision's multi-image layout); the release switches to ``image_aspect_ratio =
"pad"`` there and sends the stacked views through a path without pooling or newline (729 each).

The released directory (``config.json`` of ``model_type = "llava_llada"`` with OLMo-style LLaDA fields ``d_model``,
``n_layers``, ...; weights ``model.transformer.*``, ``model.mm_projector.{0,2}.*``, ``model.image_newline``,
``model.vision_tower.vision_tower.vision_model.*`` with the tower's kept layers) loads through
``release_config`` / ``release_processor`` and the key map of ``keepsight.models.llada``; the tower's depth is read
from the weights (the release deletes the last layer before training). ``save_pretrained`` writes transformers'
own layout (``model_type = "lavida"``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from huggingface_hub.dataclasses import strict
from safetensors import safe_open
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForImageTextToText,
    AutoProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    SiglipVisionConfig,
)
from transformers.models.llava_onevision.modeling_llava_onevision import (
    LlavaOnevisionModel,
    LlavaOnevisionMultiModalProjector,
    get_anyres_image_grid_shape,
    unpad_image,
)

from .image_only import LlavaOnevisionProcessorImageOnly
from .llada import LladaConfig, llada_config_from_olmo, register_llada
from .llada_official import CHAT_TEMPLATE, LLADA_MASK_ID, _tokenizer, drop_after_image

POOL_MODES = ("bilinear", "average", "max")
# the stage-2 script's pinpoints (scripts/train/exps/cluster/llada-hd-llada-s2.sh): the release reads each pair as
# (width, height) (its select_best_resolution and get_anyres_image_grid_shape), transformers as (height, width)
RELEASE_PINPOINTS = [[384, 768], [768, 384], [768, 768], [1152, 384], [384, 1152]]  # as released: (width, height)


def hf_pinpoints(released) -> list[list[int]]:
    """Released (width, height) pinpoints as transformers' (height, width) ones (and back: the swap is its own
    inverse). Mirror-image pinpoints tie for small images, and the first in the list wins: read unswapped, a
    384 x 384 image would be cut side by side instead of stacked (other crops, other features)."""
    return [[int(p[1]), int(p[0])] for p in released]
# SigLIP so400m-patch14-384 with its last layer removed and no head (siglip_encoder.py: load_model)
SO400M_KEPT = {"hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16, "patch_size": 14,
               "image_size": 384, "vision_use_head": False}
_TOWER_LAYER = re.compile(r"^model\.vision_tower\.vision_tower\.vision_model\.encoder\.layers\.(\d+)\.")
# a cap on anyres crops no pinpoint reaches: LaViDa's "anyres" never shrinks the crop grid (OneVision's
# anyres_max_9 does past 9 crops)
NO_SHRINK = "anyres_max_1000000"


def pooled_side(side: int, mode: str, stride: int) -> int:
    """A view's grid side after ``get_2dPool``: ceil for bilinear (an interpolation to that size), floor for the
    pools (PyTorch's default)."""
    return math.ceil(side / stride) if mode == "bilinear" else side // stride


def pool_views(features: torch.Tensor, mode: str = "bilinear", stride: int = 2) -> torch.Tensor:
    """``get_2dPool``: ``features`` [views, side * side, C] -> [views, s * s, C] (s = ``pooled_side``)."""
    views, tokens, dim = features.shape
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise ValueError(f"a view of {tokens} tokens is not a square grid")
    x = features.view(views, side, side, dim).permute(0, 3, 1, 2)  # [V, C, side, side]
    if mode == "average":
        x = nn.functional.avg_pool2d(x, stride)
    elif mode == "max":
        x = nn.functional.max_pool2d(x, stride)
    elif mode == "bilinear":
        x = nn.functional.interpolate(x, size=[math.ceil(side / stride)] * 2, mode="bilinear")
    else:
        raise ValueError(f"spatial_pool_mode must be one of {POOL_MODES}, got {mode!r}")
    return x.permute(0, 2, 3, 1).reshape(views, -1, dim)


@strict
class LavidaConfig(LlavaOnevisionConfig):
    """``LlavaOnevisionConfig`` with LaViDa's pooling of each view after the projector (``mm_spatial_pool_mode``,
    stride 2) and a ``llada`` text config."""

    model_type = "lavida"
    spatial_pool_mode: str = "bilinear"
    spatial_pool_stride: int = 2

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.spatial_pool_mode not in POOL_MODES:
            raise ValueError(f"spatial_pool_mode must be one of {POOL_MODES}, got {self.spatial_pool_mode!r}")

    @property
    def tokens_per_view(self) -> int:
        side = pooled_side(self.vision_config.image_size // self.vision_config.patch_size, self.spatial_pool_mode,
                           self.spatial_pool_stride)
        return side * side


class LavidaProjector(LlavaOnevisionMultiModalProjector):
    """The ``mlp2x_gelu`` projector, then every view pooled (``pool_views``): [views, 27 * 27, 1152] ->
    [views, 14 * 14, hidden]."""

    def __init__(self, config: LavidaConfig):
        super().__init__(config)
        self.mode, self.stride = config.spatial_pool_mode, config.spatial_pool_stride

    def forward(self, image_features):
        return pool_views(super().forward(image_features), self.mode, self.stride)


class LavidaModel(LlavaOnevisionModel):
    config_class = LavidaConfig

    def __init__(self, config: LavidaConfig):
        super().__init__(config)
        self.multi_modal_projector = LavidaProjector(config)
        self.post_init()

    def pack_image_features(self, image_features, image_sizes, image_newline=None, vision_aspect_ratio=None):
        """LaViDa's ``spatial_unpad`` packing (llava_arch.py, ``prepare_inputs_labels_for_multimodal``): the base
        view, then the crops as one grid without the padding, ``image_newline`` after each row; one view: its
        tokens and a trailing ``image_newline``. ``image_features``: per image [views, s * s, C]; returns the packed
        features per image and their lengths."""
        side = math.isqrt(self.config.tokens_per_view)
        packed = []
        for i, feats in enumerate(image_features):
            if feats.shape[0] > 1:
                base, crops = feats[0], feats[1:]
                rows, cols = get_anyres_image_grid_shape(image_sizes[i], self.config.image_grid_pinpoints,
                                                         self.config.vision_config.image_size)
                grid = crops.view(rows, cols, side, side, -1).permute(4, 0, 2, 1, 3).flatten(1, 2).flatten(2, 3)
                grid = unpad_image(grid, image_sizes[i])  # [C, H, W] without the black padding's rows / columns
                if image_newline is not None:
                    newline = image_newline[:, None, None].expand(*grid.shape[:-1], 1).to(grid)
                    grid = torch.cat((grid, newline), dim=-1)
                feats = torch.cat((base, grid.flatten(1, 2).transpose(0, 1)), dim=0)
            else:
                feats = feats[0]
                if image_newline is not None:
                    feats = torch.cat((feats, image_newline[None].to(feats)), dim=0)
            packed.append(feats)
        lengths = torch.tensor([f.shape[0] for f in packed], dtype=torch.long, device=image_features[0].device)
        return packed, lengths


class LavidaForConditionalGeneration(LlavaOnevisionForConditionalGeneration):
    config_class = LavidaConfig

    def __init__(self, config: LavidaConfig):
        super().__init__(config)
        self.model = LavidaModel(config)
        self.post_init()


class LavidaProcessor(LlavaOnevisionProcessorImageOnly):
    """LLaVA-OneVision's processor (image-only) counting LaViDa's pooled tokens (``num_image_tokens`` = a view's
    tokens after pooling), never shrinking the crop grid, and tokenizing as the release does (the token after each
    image dropped: ``drop_after_image``)."""

    def __init__(self, image_processor=None, tokenizer=None, num_image_tokens=196, vision_feature_select_strategy="full",
                 chat_template=None, image_token="<image>", video_token="<video>", vision_aspect_ratio=NO_SHRINK,
                 **kwargs):
        super().__init__(image_processor, tokenizer, num_image_tokens=num_image_tokens,
                         vision_feature_select_strategy=vision_feature_select_strategy, chat_template=chat_template,
                         image_token=image_token, video_token=video_token, vision_aspect_ratio=vision_aspect_ratio,
                         **kwargs)

    def __call__(self, images=None, text=None, **kwargs):
        return drop_after_image(self, super().__call__(images=images, text=text, **kwargs), text)


def register_lavida() -> None:
    """Register ``model_type = "lavida"`` (config, model, processor) with transformers' Auto classes (idempotent)."""
    register_llada()
    AutoConfig.register("lavida", LavidaConfig, exist_ok=True)
    AutoModelForImageTextToText.register(LavidaConfig, LavidaForConditionalGeneration, exist_ok=True)
    AutoProcessor.register(LavidaConfig, LavidaProcessor, exist_ok=True)


def lavida_image_processor(image_size: int = 384, pinpoints=None) -> LlavaOnevisionImageProcessorPil:
    """The release's views (``process_anyres_image`` + SigLIP's processor): ``pinpoints`` in transformers' (height,
    width) order (default: the release's, swapped), square views of
    ``image_size``, bicubic, mean = std = 0.5."""
    return LlavaOnevisionImageProcessorPil(
        size={"height": image_size, "width": image_size},
        image_grid_pinpoints=pinpoints or hf_pinpoints(RELEASE_PINPOINTS),
        image_mean=[0.5] * 3, image_std=[0.5] * 3, resample=3)


# ----------------------------------------------------------------------------- the released layout


def is_release(raw: dict) -> bool:
    """A LaViDa ``config.json`` as released: ``llava_llada`` with OLMo-style LLaDA fields (LLaDA-V's has LLaMA's)."""
    return raw.get("model_type") == "llava_llada" and "d_model" in raw


def _tower_layers(directory: Path) -> int:
    layers = set()
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(f, "pt") as fh:
            layers.update(int(m.group(1)) for k in fh.keys() if (m := _TOWER_LAYER.match(k)))
    if not layers:
        raise ValueError(f"{directory}: no vision tower weights (model.vision_tower.vision_tower.vision_model."
                         "encoder.layers.*) in its safetensors")
    return max(layers) + 1


def release_config(raw: dict, directory: str | Path) -> LavidaConfig:
    """The ``LavidaConfig`` of a released LaViDa ``config.json``: the LLaDA text config from its OLMo fields, a
    SigLIP so400m tower as deep as the weights hold (a local ``mm_vision_tower`` directory's config when it names
    one), the projector, pooling and pinpoints from the ``mm_*`` fields. Errors name the field that does not fit."""
    directory = Path(directory)
    projector = raw.get("mm_projector_type", "mlp2x_gelu")
    if projector != "mlp2x_gelu":
        raise ValueError(f"{directory}/config.json: mm_projector_type {projector!r}; LaViDa's is 'mlp2x_gelu'")
    merge = raw.get("mm_patch_merge_type", "spatial_unpad")
    if merge != "spatial_unpad":
        raise ValueError(f"{directory}/config.json: mm_patch_merge_type {merge!r}; keepsight reads LaViDa's "
                         "'spatial_unpad'")
    aspect = raw.get("image_aspect_ratio", "anyres")
    if aspect != "anyres":
        raise ValueError(f"{directory}/config.json: image_aspect_ratio {aspect!r}; keepsight reads LaViDa's 'anyres'")
    pool = raw.get("mm_spatial_pool_mode") or "bilinear"
    vision = dict(SO400M_KEPT)
    tower = raw.get("mm_vision_tower")
    local = (Path(tower) if Path(tower).is_absolute() else directory / tower) if isinstance(tower, str) else None
    if local is not None and (local / "config.json").is_file():
        cfg = json.loads((local / "config.json").read_text())
        cfg = cfg.get("vision_config", cfg)
        vision.update({k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "patch_size",
                                           "image_size", "layer_norm_eps") if k in cfg})
    vision["num_hidden_layers"] = _tower_layers(directory)
    if raw.get("mm_hidden_size") not in (None, vision["hidden_size"]):
        raise ValueError(f"{directory}/config.json: mm_hidden_size {raw['mm_hidden_size']} but the tower is "
                         f"{vision['hidden_size']} wide")
    tok = _tokenizer(directory)
    text: LladaConfig = llada_config_from_olmo(raw)
    mask = tok.mask_token_id if tok.mask_token_id is not None else tok.convert_tokens_to_ids("<|mdm_mask|>")
    text.mask_token_id = int(mask) if mask not in (None, tok.unk_token_id) else LLADA_MASK_ID
    image_id = tok.convert_tokens_to_ids("<image>")
    if not 0 <= image_id < text.vocab_size:
        raise ValueError(f"the <image> token (id {image_id}) falls outside the {text.vocab_size}-row embedding table")
    pinpoints = raw.get("image_grid_pinpoints") or RELEASE_PINPOINTS
    if isinstance(pinpoints, str):
        raise ValueError(f"{directory}/config.json: image_grid_pinpoints is a string ({pinpoints!r}); the release "
                         "writes the parsed list")
    return LavidaConfig(
        vision_config=SiglipVisionConfig(**vision).to_dict(), text_config=text.to_dict(), image_token_index=image_id,
        video_token_index=image_id, vision_feature_select_strategy="full", vision_feature_layer=-1,
        image_grid_pinpoints=hf_pinpoints(pinpoints), vision_aspect_ratio=NO_SHRINK,
        spatial_pool_mode=pool, spatial_pool_stride=int(raw.get("mm_spatial_pool_stride") or 2),
        tie_word_embeddings=False)


def release_processor(directory: str | Path, config: LavidaConfig) -> LavidaProcessor:
    """The processor of a released LaViDa directory: its tokenizer (an ``<image>`` token added where it has none),
    the release's views at the tower's size and the config's pinpoints, LaViDa's conversation (LLaDA-V's)."""
    directory = Path(directory)
    images = lavida_image_processor(config.vision_config.image_size, config.image_grid_pinpoints)
    return LavidaProcessor(images, _tokenizer(directory), num_image_tokens=config.tokens_per_view,
                           chat_template=CHAT_TEMPLATE)


__all__ = ["LavidaConfig", "LavidaForConditionalGeneration", "LavidaModel", "LavidaProcessor", "LavidaProjector",
           "is_release", "lavida_image_processor", "pool_views", "pooled_side", "register_lavida", "release_config",
           "release_processor"]
