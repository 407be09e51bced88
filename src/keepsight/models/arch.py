"""The one architecture table: what keepsight knows about each model type it supports.

Every per-architecture difference lives here, read by the loader (``models.checkpoint``), the probes, PVM,
MPS / MRS and the lmms-eval model. An unknown architecture is a clear error naming the supported ones,
never a silent guess.

A *kind* is transformers' ``model_type`` where that names the architecture, else ours: ``llada_v`` is a
``llava`` config whose ``text_config`` is a ``llada`` model (LLaDA-V as ``save_pretrained`` writes it),
``llada_lm`` a text-only LLaDA (``llada``, or the original OLMo-style config with ``d_model``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ..checks import layer_indices

FAMILIES = ("autoregressive", "diffusion", "text")
ROPE_KINDS = ("1d", "mrope", "none")
IMAGE_LAYOUTS = ("per_image", "grid", "tiles", "runs", "sizes", "rows")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # LLaMA-style names


@dataclass(frozen=True)
class ArchSpec:
    """One row of the table."""

    kind: str
    family: str  # "autoregressive" VLM | "diffusion" (masked-diffusion LM / VLM) | "text" (a plain RoPE LM)
    decoder: str  # attribute path from the top model to the text decoder stack (.layers, .norm, .rotary_emb)
    vlm: bool = True  # has a vision tower and an image token
    ffn: str = "mlp"  # FFN attribute of a decoder layer (PVM adds its update to this module's output)
    pvm_query: str = "post_attention_layernorm"  # the decoder-layer module whose input is the residual stream after
    #                                              self-attention: the released PVM block's query
    pvm_update: str | None = None  # the decoder-layer module whose output PVM adds to (None: the FFN); Gemma 3
    #                                normalises the FFN's output, so there it is the norm after it
    attention: str = "self_attn"  # attribute of a decoder layer's softmax attention (hybrid stacks: some layers lack
    #                               it, and the attention probes read the layers that have it)
    projector: str | None = None  # attribute path of the vision -> LLM projector / merger
    projector_swappable: bool = False  # ``keepsight.bridge.replace_projector`` can replace it
    tower: str | None = None  # attribute path of the vision tower (frozen by the fine-tuning recipes)
    rope: str = "1d"  # the text model's RoPE: "1d", "mrope" (3-D positions from the image grid) or "none"
    rope_state: tuple[str, ...] = ()  # attribute paths the model caches positions in between forwards (Qwen-VL's
    #                                   rope_deltas): a second stream of the same model restores them afterwards
    lora_targets: tuple[str, ...] = PROJECTIONS  # linear modules of a decoder layer the LoRA control adapts
    image_layout: str = "per_image"  # how the image inputs split by image (OPERA decodes row by row):
    #   "per_image": dim 0 one entry per image, every image the same number of tokens (LLaVA, Gemma 3)
    #   "grid": pixel rows by patch, image_grid_thw rows per image (Qwen-VL, GLM-4.1V)
    #   "tiles": pixel rows by tile, the same tokens per tile, an image's tiles one run of image tokens (InternVL)
    #   "runs": dim 0 one entry per image, each image's tokens one run of image tokens (LLaVA-NeXT / OneVision,
    #           Gemma 4: tiles or sizes give each image its own count)
    #   "sizes": dim 0 one entry per image, its tokens (h // (patch * merge)) * (w // (patch * merge)) from
    #            image_sizes (Mistral 3 / Pixtral, whose rows of image tokens are split by [IMG_BREAK])
    #   "rows": the inputs batched by prompt row (Idefics3 / SmolVLM: each row's sub-images, zero padded)
    image_inputs: tuple[str, ...] = ("pixel_values",)  # processor outputs that carry the images
    token_inputs: tuple[str, ...] = ()  # processor outputs aligned with input_ids ([B, T]: mm_token_type_ids, ...)
    image_markers: tuple[str, ...] = ()  # config keys of the token ids written around each image (PAI's text-only
    #                                      prompt drops them with the image tokens)
    processor_fallback: str | None = None  # the image-only processor class (keepsight.models.checkpoint.FALLBACKS) built
    #                                        where the directory's own processor cannot be (it needs torchvision)
    loadable: bool = True  # ``load_checkpoint`` reads a directory of this kind
    unsupported: tuple[tuple[str, str], ...] = ()  # (method, why) for each method that does not apply to this kind
    note: str = ""  # shown when a directory of this kind cannot be loaded

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"{self.kind}: family must be one of {FAMILIES}, got {self.family!r}")
        if self.rope not in ROPE_KINDS:
            raise ValueError(f"{self.kind}: rope must be one of {ROPE_KINDS}, got {self.rope!r}")
        if self.image_layout not in IMAGE_LAYOUTS:
            raise ValueError(f"{self.kind}: image_layout must be one of {IMAGE_LAYOUTS}, got {self.image_layout!r}")

    def why_not(self, method: str) -> str | None:
        """Why ``method`` does not apply to this kind (None: it does, as far as the family allows)."""
        if method == "bridge" and not self.projector_swappable:
            return "LIA-MTR replaces a LLaVA projector (LlavaForConditionalGeneration's); this model's is not one"
        if method == "mrs" and self.rope == "none":
            return "Monotonic RoPE Scaling needs a RoPE text model"
        return dict(self.unsupported).get(method)


_QWEN_VL = dict(image_markers=("vision_start_token_id", "vision_end_token_id"), projector="model.visual.merger", tower="model.visual", rope="mrope", rope_state=("model.rope_deltas",),
                image_layout="grid", image_inputs=("pixel_values", "image_grid_thw"), token_inputs=("mm_token_type_ids",),
                processor_fallback="QwenImageProcessor")
_QWEN35 = {**_QWEN_VL, "processor_fallback": "Qwen3VLProcessorImageOnly"}
_LLAVA = dict(projector="model.multi_modal_projector", tower="model.vision_tower")

_ROWS = (
    ArchSpec("llava", "autoregressive", "model.language_model", projector_swappable=True, **_LLAVA),
    ArchSpec("keepsight_llava", "autoregressive", "model.language_model", projector_swappable=True,
             **_LLAVA),  # a LLaVA whose projector keepsight replaced (keepsight.bridge)
    ArchSpec("qwen3_vl", "autoregressive", "model.language_model", **_QWEN_VL),
    ArchSpec("qwen2_5_vl", "autoregressive", "model.language_model", **_QWEN_VL),
    # FFN: a sparse MoE block; Qwen3.5: a hybrid stack (Gated DeltaNet layers between the attention layers)
    ArchSpec("qwen3_vl_moe", "autoregressive", "model.language_model", **_QWEN35),
    ArchSpec("qwen3_5", "autoregressive", "model.language_model", **_QWEN35),
    ArchSpec("qwen3_5_moe", "autoregressive", "model.language_model", **_QWEN35),
    ArchSpec("glm4v", "autoregressive", "model.language_model", pvm_update="post_mlp_layernorm",
             lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"),
             **{**_QWEN_VL, "processor_fallback": "Glm4vProcessorImageOnly",
                "image_markers": ("image_start_token_id", "image_end_token_id")}),
    ArchSpec("llava_next", "autoregressive", "model.language_model", image_inputs=("pixel_values", "image_sizes"),
             image_layout="runs", **_LLAVA),
    ArchSpec("llava_onevision", "autoregressive", "model.language_model", processor_fallback="LlavaOnevisionProcessorImageOnly",
             image_inputs=("pixel_values", "image_sizes", "batch_num_images"), image_layout="runs", **_LLAVA),
    ArchSpec("mistral3", "autoregressive", "model.language_model", image_inputs=("pixel_values", "image_sizes"),
             image_layout="sizes", **_LLAVA),
    ArchSpec("internvl", "autoregressive", "model.language_model", processor_fallback="InternVLProcessorImageOnly",
             image_layout="tiles", **_LLAVA),
    # Gemma 3 normalises the attention and the FFN outputs before adding them: the residual stream after attention
    # enters pre_feedforward_layernorm, and PVM adds to the FFN's normalised output
    ArchSpec("gemma3", "autoregressive", "model.language_model", pvm_query="pre_feedforward_layernorm",
             pvm_update="post_feedforward_layernorm", token_inputs=("token_type_ids",),
             image_markers=("boi_token_index", "eoi_token_index"), **_LLAVA),
    # Gemma 4: as Gemma 3 around the FFN; images keep their aspect ratio (a token count of their own)
    ArchSpec("gemma4", "autoregressive", "model.language_model", pvm_query="pre_feedforward_layernorm",
             pvm_update="post_feedforward_layernorm", projector="model.embed_vision", tower="model.vision_tower",
             image_inputs=("pixel_values", "image_position_ids"), token_inputs=("mm_token_type_ids",),
             image_markers=("boi_token_id", "eoi_token_id"), processor_fallback="Gemma4ProcessorImageOnly",
             image_layout="runs"),
    ArchSpec("idefics3", "autoregressive", "model.text_model", projector="model.connector", tower="model.vision_model",
             image_inputs=("pixel_values", "pixel_attention_mask"), image_layout="rows"),
    ArchSpec("smolvlm", "autoregressive", "model.text_model", projector="model.connector", tower="model.vision_model",
             image_inputs=("pixel_values", "pixel_attention_mask"), processor_fallback="SmolVLMProcessorImageOnly",
             image_layout="rows"),
    ArchSpec("llada_v", "diffusion", "model.language_model", **_LLAVA),
    # LaViDa: LLaVA-OneVision's views, each pooled after the projector, a LLaDA language model (keepsight.models.lavida)
    ArchSpec("lavida", "diffusion", "model.language_model", image_inputs=("pixel_values", "image_sizes",
             "batch_num_images"), image_layout="runs", **_LLAVA),
    ArchSpec("llada_lm", "diffusion", "model", vlm=False, image_inputs=()),
    # LLaDA-V as shipped (config + weights in the LLaVA repository's layout): keepsight.models.llada_official
    ArchSpec("llava_llada", "diffusion", "model.language_model", **_LLAVA),
    # plain RoPE language models: MRS and the NTK / YaRN baselines run on them; the loader refuses them
    ArchSpec("qwen3", "text", "model", vlm=False, loadable=False, image_inputs=()),
    ArchSpec("llama", "text", "model", vlm=False, loadable=False, image_inputs=()),
)
ARCHITECTURES: dict[str, ArchSpec] = {row.kind: row for row in _ROWS}
AUTOREGRESSIVE = tuple(k for k, r in ARCHITECTURES.items() if r.family == "autoregressive")
DIFFUSION = tuple(k for k, r in ARCHITECTURES.items() if r.family == "diffusion")
LOADABLE = tuple(k for k, r in ARCHITECTURES.items() if r.loadable)


def supported() -> str:
    return (f"keepsight supports the VLMs {', '.join(AUTOREGRESSIVE)} and LLaDA-V-style diffusion VLMs "
            "(llava with a llada text_config, or LLaDA / LLaDA-V checkpoint layouts)")


def _get(config, key: str, default=None):
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def kind_of(config) -> str:
    """The kind of a model config (a ``PretrainedConfig`` or a ``config.json`` dict); unknown -> ValueError."""
    model_type = _get(config, "model_type")
    if model_type in (None, "llada") and _get(config, "d_model") is not None:
        return "llada_lm"  # OLMo-style LLaDA config
    if model_type == "llada":
        return "llada_lm"
    if model_type == "llava" and _get(_get(config, "text_config") or {}, "model_type") == "llada":
        return "llada_v"
    if model_type == "llava_llada" and _get(config, "d_model") is not None:
        return "lavida"  # LaViDa as released: LLaDA-V's model_type over OLMo-style LLaDA fields
    if model_type in ARCHITECTURES:
        return model_type
    raise ValueError(f"unsupported architecture model_type={model_type!r}; {supported()}")


def arch_spec(model_or_kind) -> ArchSpec:
    """The table row of a kind name, a config, or a model (a row is its own row)."""
    if isinstance(model_or_kind, ArchSpec):
        return model_or_kind
    if isinstance(model_or_kind, str):
        if model_or_kind not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {model_or_kind!r}; {supported()}")
        return ARCHITECTURES[model_or_kind]
    config = getattr(model_or_kind, "config", model_or_kind)
    return ARCHITECTURES[kind_of(config)]


def image_token_id(config) -> int | None:
    """The image token id a VLM config names (``image_token_id`` or LLaVA's older ``image_token_index``)."""
    value = _get(config, "image_token_id")
    if value is None:
        value = _get(config, "image_token_index")
    return None if value is None else int(value)


def visual_token_ids(config) -> tuple[int, ...]:
    """The token ids whose positions hold visual embeddings: the image token and, where the config names one, the
    video token."""
    ids = [image_token_id(config), _get(config, "video_token_id")]
    return tuple(int(i) for i in ids if i is not None)


def check_method(model_or_kind, method: str) -> None:
    """A ValueError naming the kind and the reason when the table says ``method`` does not apply to it."""
    spec = arch_spec(model_or_kind)
    why = spec.why_not(method)
    if why is not None:
        raise ValueError(f"{method} does not apply to {spec.kind}: {why}")


@contextlib.contextmanager
def rope_state_kept(model: nn.Module):
    """Restores the positions the model caches between forwards (the row's ``rope_state``) when the block ends: a
    second stream of the same model (VCD's noised image, PAI's text-only prompt, OPERA's candidates) must not
    move the main stream's positions."""
    try:
        spec = arch_spec(model)
    except ValueError:
        spec = None
    saved = []
    for path in spec.rope_state if spec is not None else ():
        owner_path, _, attr = path.rpartition(".")
        owner = _follow(model, owner_path)
        saved.append((owner, attr, getattr(owner, attr, None)))
    try:
        yield
    finally:
        for owner, attr, value in saved:
            if hasattr(owner, attr):
                setattr(owner, attr, value)


def is_tower_parameter(model_or_kind, name: str) -> bool:
    """Whether the parameter ``name`` (as ``model.named_parameters()`` gives it, any wrapper prefix allowed)
    belongs to the vision tower of the model (or kind, or row): the table row's ``tower``."""
    tower = arch_spec(model_or_kind).tower
    return tower is not None and f".{tower}." in f".{name}"


def _follow(model: nn.Module, path: str) -> nn.Module:
    obj = model
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def _is_stack(module: nn.Module) -> bool:
    return isinstance(getattr(module, "layers", None), nn.ModuleList) and hasattr(module, "rotary_emb")


def decoder_stack(model: nn.Module) -> nn.Module:
    """The text decoder stack (``.layers``, ``.norm``, ``.rotary_emb``, ``.embed_tokens``) of any model in the
    table, or ``model`` itself when it is a bare stack (``LladaModel``, ``Qwen3Model``)."""
    if _is_stack(model):
        return model
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no config; cannot tell its architecture")
    spec = arch_spec(config)
    stack = _follow(model, spec.decoder)
    if not _is_stack(stack):
        raise ValueError(f"{type(model).__name__} ({spec.kind}): {spec.decoder} is not a decoder stack")
    return stack


@dataclass(frozen=True)
class ArchInfo:
    """Where an autoregressive VLM keeps the parts keepsight hooks."""

    spec: ArchSpec
    language_model: nn.Module  # the decoder stack (has .layers, .norm, .config)
    layers: nn.ModuleList  # decoder layers, in order
    final_norm: nn.Module  # norm applied before lm_head
    lm_head: nn.Module
    image_token_id: int
    visual_token_ids: tuple[int, ...] = ()  # image (and video) token ids

    @property
    def model_type(self) -> str:
        return self.spec.kind

    def ffn(self, layer: int) -> nn.Module:
        """The FFN module of decoder layer ``layer``."""
        return getattr(self.layers[layer], self.spec.ffn)

    def pvm_query(self, layer: int) -> nn.Module:
        """The module of decoder layer ``layer`` whose input is the residual stream after self-attention."""
        return getattr(self.layers[layer], self.spec.pvm_query)

    def pvm_update(self, layer: int) -> nn.Module:
        """The module of decoder layer ``layer`` whose output PVM's update is added to (the FFN unless the row says)."""
        return getattr(self.layers[layer], self.spec.pvm_update or self.spec.ffn)

    def layer_config(self, layer: int):
        """The text config as decoder layer ``layer`` sees it: its per-layer view where the stack is heterogeneous
        (Gemma 4's head sizes differ between sliding and global layers), else the stack's config."""
        config = self.language_model.config
        per_layer = getattr(config, "per_layer_config", None)
        return per_layer[layer] if per_layer is not None else config

    def attention_layers(self) -> list[int]:
        """The decoder layers with softmax attention (all of them but in hybrid stacks)."""
        return [i for i, layer in enumerate(self.layers) if hasattr(layer, self.spec.attention)]


def arch_info(model: nn.Module) -> ArchInfo:
    """Decoder layers, final norm, lm_head and image token id of a supported autoregressive VLM (what the
    attention probe, LogitLens, PVM and the LoRA control hook); other families are refused by name."""
    config = getattr(model, "config", None)
    try:
        spec = arch_spec(config)
    except ValueError:
        raise ValueError(f"unsupported architecture {getattr(config, 'model_type', None)!r} "
                         f"({type(model).__name__}); this needs an autoregressive VLM: {sorted(AUTOREGRESSIVE)}") from None
    if spec.family != "autoregressive":
        raise ValueError(f"unsupported architecture {spec.kind!r} ({type(model).__name__}, a {spec.family} model); "
                         f"this needs an autoregressive VLM: {sorted(AUTOREGRESSIVE)}")
    lm = _follow(model, spec.decoder)
    token = image_token_id(config)
    if token is None:
        raise ValueError(f"{type(model).__name__} config names no image token id")
    return ArchInfo(spec, lm, lm.layers, lm.norm, model.lm_head, token, visual_token_ids(config))


PROBE_VALUES = 32  # weight values sampled per tensor for a model's weights probe


def _weights_probe(model: nn.Module) -> list[float]:
    """A few input-embedding and lm_head values at fixed strided positions: two trainings of one architecture
    differ there, a dtype cast of the same weights does not (beyond rounding)."""
    values: list[float] = []
    for w in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
        flat = w.detach().reshape(-1)
        idx = torch.linspace(0, flat.numel() - 1, PROBE_VALUES).long().to(flat.device)
        values += flat[idx].float().cpu().tolist()
    return values


def signature(model: nn.Module) -> dict:
    """What an adapter trained on ``model`` needs of any model it is applied to: its kind, width and depth, and a
    probe of its weights (the adapter is a change to *these* frozen weights)."""
    info = arch_info(model)
    return {"model_type": info.model_type, "hidden_size": info.language_model.config.hidden_size,
            "num_layers": len(info.layers), "weights_probe": _weights_probe(model)}


def signature_mismatch(recorded: dict, model: nn.Module) -> str | None:
    """None when ``model`` has the ``recorded`` signature, else what differs ("hidden_size: adapter 128 vs model
    64", or that its weights are another model's). A signature without a probe (older adapters) checks shapes."""
    have = signature(model)
    diff = [f"{k}: adapter {recorded.get(k)} vs model {have[k]}" for k in ("model_type", "hidden_size", "num_layers")
            if recorded.get(k) != have[k]]
    probe = recorded.get("weights_probe")
    if not diff and probe is not None:
        a, b = torch.tensor(probe), torch.tensor(have["weights_probe"])
        if a.shape != b.shape or not torch.allclose(a, b, rtol=2e-2, atol=2e-2 * float(a.abs().max().clamp_min(1e-6))):
            diff.append("its weights are another model's (the adapter was trained on a different base checkpoint)")
    return ", ".join(diff) or None


def max_positions(model: nn.Module) -> int | None:
    """The text model's ``max_position_embeddings`` (None when its config names none)."""
    config = getattr(model, "config", None)
    for cfg in (getattr(config, "text_config", None), config):
        n = getattr(cfg, "max_position_embeddings", None)
        if isinstance(n, int) and n > 0:
            return n
    return None


def starts_sequence(cache) -> bool:
    """Whether a forward with this KV ``cache`` starts a sequence (no cache yet, or an empty one): the prefill."""
    return cache is None or cache.get_seq_length() == 0


def check_finite(name: str, x: torch.Tensor) -> None:
    """A ValueError naming ``name`` when the floating tensor ``x`` holds NaN or inf (a model input: the model would
    decode garbage from it without a word)."""
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} holds NaN or inf values; the model cannot read such an input")


def check_length(model: nn.Module, n: int, name: str, prompt: int = 0) -> None:
    """A ValueError naming ``name`` when ``prompt + n`` positions exceed what the model has."""
    limit = max_positions(model)
    if limit is not None and prompt + n > limit:
        raise ValueError(f"{name} {n}{f' + prompt {prompt}' if prompt else ''} exceeds the model's "
                         f"max_position_embeddings {limit}")


def check_layers(layers, n_layers: int) -> list[int]:
    """Validated layer indices, sorted (negative indices count from the end); None means all layers."""
    if layers is None:
        return list(range(n_layers))
    return sorted(layer_indices("layers", layers, n_layers))
