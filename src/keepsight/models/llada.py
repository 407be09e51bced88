"""A LLaDA-style masked-diffusion language model on transformers' Llama classes, and LLaDA-V loading.

LLaDA is the LLaMA architecture with fully bidirectional attention (no causal mask; padding is still
masked) and no exact KV cache: a position's keys change whenever any token changes. ``BlockKV`` is the
approximate cache of keepsight's cached sampler (``keepsight.diffusion.generate(cache=...)``, after the ideas
Fast-dLLM published): a full forward records the keys / values of the positions outside a query window; later
forwards run the window only, attending to the recorded keys and their own.
``LladaModel`` is ``LlamaModel`` with ``is_causal = False`` on every attention module and a padding-only
mask; ``LladaForMaskedDiffusion`` adds the untied ``lm_head`` (logits at position t predict the token
*at* t, no shift). ``keepsight.models.register_model_types()`` (called by the loader and the tiny
builders) registers ``model_type = "llada"`` with ``AutoConfig``, ``AutoModel`` (so a
``LlavaForConditionalGeneration`` whose ``text_config`` is a ``LladaConfig`` builds a ``LladaModel`` as its
language model) and ``AutoModelForCausalLM``.

Checkpoint names. ``CHECKPOINT_KEY_MAP`` maps source names to ours, first match wins:

=========================================================  ==================================================
source (regex)                                             ours
=========================================================  ==================================================
OLMo-style LLaDA-8B (LM only)
``model.transformer.blocks.N.q_proj|k_proj|v_proj``        ``model.layers.N.self_attn.q_proj|k_proj|v_proj``
``model.transformer.blocks.N.attn_out``                    ``model.layers.N.self_attn.o_proj``
``model.transformer.blocks.N.ff_proj``                     ``model.layers.N.mlp.gate_proj``
``model.transformer.blocks.N.up_proj``                     ``model.layers.N.mlp.up_proj``
``model.transformer.blocks.N.ff_out``                      ``model.layers.N.mlp.down_proj``
``model.transformer.blocks.N.attn_norm``                   ``model.layers.N.input_layernorm``
``model.transformer.blocks.N.ff_norm``                     ``model.layers.N.post_attention_layernorm``
``model.transformer.wte``                                  ``model.embed_tokens``
``model.transformer.ln_f``                                 ``model.norm``
``model.transformer.ff_out``                               ``lm_head``
LLaDA-V VLM (LLaVA repository layout)
``model.vision_tower.vision_tower.``                       ``model.vision_tower.``
``model.mm_projector.0.`` / ``model.mm_projector.2.``      ``model.multi_modal_projector.linear_1.`` / ``linear_2.``
LLaMA names (``model.embed_tokens``, ``model.layers.*``, ``model.norm``, ``lm_head``) and HF names pass unchanged.
=========================================================  ==================================================

After the table, placement for the VLM target: language-model keys ``model.{embed_tokens,layers,norm}.*``
move under ``model.language_model.`` (HF LLaVA's placement), and ``model.vision_tower.vision_model.``
becomes ``model.vision_tower.`` when the target tower has no ``vision_model`` wrapper (transformers 5's
``CLIPVisionModel``; ``SiglipVisionModel`` keeps it). Keys that end up unknown to the target model, and
target keys no source key provides, are errors that name them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from accelerate import init_empty_weights
from huggingface_hub.dataclasses import strict
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    LlavaConfig,
    LlavaForConditionalGeneration,
)
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils.output_capturing import capture_outputs

from .weights import check_finite_weights, check_weights


@strict
class LladaConfig(LlamaConfig):
    """``LlamaConfig`` of a bidirectional masked-diffusion LM; ``mask_token_id`` is the [MASK] id."""

    model_type = "llada"
    mask_token_id: int | None = None
    use_cache: bool = False  # no KV cache: each denoising step re-reads the whole sequence


class BlockKV:
    """Keys / values of the positions outside a query window, per layer (duck-typed as transformers' ``Cache``:
    the attention modules call ``update``).

    ``record(keep, key_mask)``: the next forward is a full one over all T positions; it runs unchanged and the
    columns ``keep [T]`` (bool) of every layer's keys / values are stored with their padding mask
    ``key_mask [B, n_keep]``. ``read()``: later forwards run a window of Q positions; each layer attends to the
    stored keys followed by the window's own (attention has no order, RoPE was applied when they were made).
    """

    def __init__(self) -> None:
        self.keys: dict[int, torch.Tensor] = {}  # layer -> [B, H_kv, n_keep, D]
        self.values: dict[int, torch.Tensor] = {}
        self.keep: torch.Tensor | None = None  # [T] bool
        self.key_mask: torch.Tensor | None = None  # [B, n_keep], 1 = a real token
        self.recording = False

    def record(self, keep: torch.Tensor, key_mask: torch.Tensor) -> BlockKV:
        self.keep, self.key_mask, self.recording = keep, key_mask, True
        self.keys.clear()
        self.values.clear()
        return self

    def read(self) -> BlockKV:
        if self.keep is None:
            raise RuntimeError("BlockKV.read() before any record(): nothing is cached")
        self.recording = False
        return self

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        if self.recording:
            self.keys[layer_idx] = key_states[:, :, self.keep]
            self.values[layer_idx] = value_states[:, :, self.keep]
            return key_states, value_states
        return (torch.cat([self.keys[layer_idx], key_states], 2), torch.cat([self.values[layer_idx], value_states], 2))


class LladaModel(LlamaModel):
    """``LlamaModel`` with bidirectional attention. Input ``[B, T]`` ids or ``[B, T, d]`` embeddings,
    optional ``[B, T]`` padding mask (1 = token, 0 = pad); output ``last_hidden_state [B, T, d]``.
    ``cache`` is None (every position attends to every other) or a ``BlockKV``; ``use_cache`` is ignored."""

    config_class = LladaConfig

    def __init__(self, config: LladaConfig):
        super().__init__(config)
        for layer in self.layers:
            layer.self_attn.is_causal = False

    @capture_outputs
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=None, past_key_values=None, **kwargs) -> BaseModelOutputWithPast:
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # [B, T, d]
        if position_ids is None:
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)[None]  # [1, T]
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, BlockKV):
            raise TypeError(f"LLaDA takes no {type(cache).__name__}: its keys change with every token (BlockKV is the "
                            "approximate cache of keepsight.diffusion.generate)")
        if isinstance(cache, BlockKV) and not cache.recording:
            B, Q = inputs_embeds.shape[:2]
            window = attention_mask if attention_mask is not None else inputs_embeds.new_ones(B, Q, dtype=torch.long)
            keys = torch.cat([cache.key_mask.to(window.dtype), window], 1)  # [B, n_keep + Q]
            mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=keys,
                                             encoder_hidden_states=inputs_embeds.new_empty(B, keys.shape[1], 1))
        else:  # padding-only mask; None when there is no padding (every query sees every key)
            mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds,
                                             attention_mask=attention_mask)
        hidden = inputs_embeds
        position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)  # (cos, sin) [B|1, T, head_dim]
        for layer in self.layers[: self.config.num_hidden_layers]:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                           position_ids=position_ids, cache=cache, **kwargs)
        hidden = self.norm(hidden)
        return BaseModelOutputWithPast(last_hidden_state=hidden, cache=None)


class LladaForMaskedDiffusion(LlamaForCausalLM):
    """LLaDA's mask predictor: ``LladaModel`` + untied ``lm_head``; ``logits [B, T, V]``.

    With ``labels [B, T]`` the loss is the plain cross-entropy of position t's logits against
    ``labels[:, t]`` (no shift; -100 ignored) - LLaDA's masked-token loss without its 1/t weighting.
    Generate with ``keepsight.diffusion.generate``, not the autoregressive ``GenerationMixin.generate``.
    """

    config_class = LladaConfig

    def __init__(self, config: LladaConfig):
        # skip LlamaForCausalLM.__init__ (it would build a causal LlamaModel first); same attributes
        super(LlamaForCausalLM, self).__init__(config)
        self.model = LladaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                labels=None, use_cache=None, past_key_values=None, logits_to_keep=0,
                **kwargs) -> CausalLMOutputWithPast:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         inputs_embeds=inputs_embeds, cache=cache if cache is not None else past_key_values, **kwargs)
        logits = self.lm_head(out.last_hidden_state)  # [B, T, V]
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), labels.flatten().to(logits.device), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                      attentions=out.attentions)


def register_llada() -> None:
    """Register ``model_type = "llada"`` with transformers' Auto classes (idempotent; see the module doc)."""
    AutoConfig.register("llada", LladaConfig, exist_ok=True)
    AutoModel.register(LladaConfig, LladaModel, exist_ok=True)
    AutoModelForCausalLM.register(LladaConfig, LladaForMaskedDiffusion, exist_ok=True)


# ----------------------------------------------------------------------------- checkpoint loading

# source-name regex -> our name (``re.sub`` replacement); see the module docstring. First match wins.
_BLOCK = r"^model\.transformer\.blocks\.(\d+)\."
CHECKPOINT_KEY_MAP: dict[str, str] = {
    _BLOCK + r"q_proj\.": r"model.layers.\1.self_attn.q_proj.",
    _BLOCK + r"k_proj\.": r"model.layers.\1.self_attn.k_proj.",
    _BLOCK + r"v_proj\.": r"model.layers.\1.self_attn.v_proj.",
    _BLOCK + r"attn_out\.": r"model.layers.\1.self_attn.o_proj.",
    _BLOCK + r"ff_proj\.": r"model.layers.\1.mlp.gate_proj.",
    _BLOCK + r"up_proj\.": r"model.layers.\1.mlp.up_proj.",
    _BLOCK + r"ff_out\.": r"model.layers.\1.mlp.down_proj.",
    _BLOCK + r"attn_norm\.": r"model.layers.\1.input_layernorm.",
    _BLOCK + r"ff_norm\.": r"model.layers.\1.post_attention_layernorm.",
    r"^model\.transformer\.wte\.": "model.embed_tokens.",
    r"^model\.transformer\.ln_f\.": "model.norm.",
    r"^model\.transformer\.ff_out\.": "lm_head.",
    r"^model\.vision_tower\.vision_tower\.": "model.vision_tower.",
    r"^model\.mm_projector\.0\.": "model.multi_modal_projector.linear_1.",
    r"^model\.mm_projector\.2\.": "model.multi_modal_projector.linear_2.",
}
_LM_KEY = re.compile(r"^model\.(embed_tokens|layers|norm)\.")
_TOWER_WRAPPER = re.compile(r"^model\.vision_tower\.vision_model\.")


def map_checkpoint_keys(state: dict[str, torch.Tensor], target: str = "lm",
                        tower_wrapper: bool = False) -> dict[str, torch.Tensor]:
    """Rename a LLaDA / LLaDA-V state dict to our names. ``target``: "lm" (``LladaForMaskedDiffusion``)
    or "vlm" (``LlavaForConditionalGeneration`` with a Llada language model); ``tower_wrapper``: whether
    the target vision tower keeps its ``vision_model.`` prefix."""
    if target not in ("lm", "vlm"):
        raise ValueError(f"target must be 'lm' or 'vlm', got {target!r}")
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        new = key
        for pattern, repl in CHECKPOINT_KEY_MAP.items():
            if re.match(pattern, key):
                new = re.sub(pattern, repl, key)
                break
        if target == "vlm":
            new = _LM_KEY.sub(r"model.language_model.\1.", new)
            if not tower_wrapper:
                new = _TOWER_WRAPPER.sub("model.vision_tower.", new)
        if new in out:
            raise ValueError(f"two checkpoint keys map to {new!r} (one is {key!r})")
        out[new] = value
    return out


def load_mapped_state(model: torch.nn.Module, state: dict[str, torch.Tensor], target: str, drop=(),
                      assign: bool = False) -> None:
    """Map ``state`` (see ``map_checkpoint_keys``) and load it strictly into ``model``.
    ``drop``: regexes of source keys to discard knowingly (e.g. LLaVA-OneVision's ``model.image_newline``).
    ``assign``: the checkpoint's tensors become the parameters (a model built on the meta device)."""
    state = {k: v for k, v in state.items() if not any(re.search(p, k) for p in drop)}
    own = model.state_dict()
    mapped = map_checkpoint_keys(state, target, any(_TOWER_WRAPPER.match(k) for k in own))
    unknown = sorted(k for k in mapped if k not in own)
    if unknown:
        raise ValueError(f"{len(unknown)} checkpoint keys are unknown to {type(model).__name__} after mapping: "
                         f"{unknown[:20]}{' ...' if len(unknown) > 20 else ''} (pass drop=[regex] to discard them)")
    missing = sorted(k for k in own if k not in mapped)
    if missing:
        raise ValueError(f"the checkpoint lacks {len(missing)} keys of {type(model).__name__}: "
                         f"{missing[:20]}{' ...' if len(missing) > 20 else ''}")
    for k, v in mapped.items():
        if v.shape != own[k].shape:
            raise ValueError(f"checkpoint key {k!r} has shape {tuple(v.shape)}, the model wants {tuple(own[k].shape)}")
    model.load_state_dict(mapped, strict=True, assign=assign)


def llada_config_from_olmo(d: dict) -> LladaConfig:
    """Our ``LladaConfig`` from an original (OLMo-style) LLaDA-8B ``config.json`` dict."""
    heads = d["n_heads"]
    return LladaConfig(
        vocab_size=d.get("embedding_size") or d["vocab_size"], hidden_size=d["d_model"],
        intermediate_size=d.get("mlp_hidden_size") or d.get("mlp_ratio", 4) * d["d_model"],
        num_hidden_layers=d["n_layers"], num_attention_heads=heads, num_key_value_heads=d.get("n_kv_heads") or heads,
        head_dim=d["d_model"] // heads, max_position_embeddings=d.get("max_sequence_length", 4096),
        rms_norm_eps=d.get("rms_norm_eps", 1e-5), rope_parameters={"rope_type": "default",
                                                                   "rope_theta": float(d.get("rope_theta", 10000.0))},
        attention_bias=bool(d.get("include_bias", False)), tie_word_embeddings=bool(d.get("weight_tying", False)),
        mask_token_id=d.get("mask_token_id"), eos_token_id=d.get("eos_token_id"), pad_token_id=d.get("pad_token_id"),
        bos_token_id=d.get("bos_token_id"),
    )


def _read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {directory}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        part = load_file(str(f))
        clash = sorted(set(part) & set(state))
        if clash:
            raise ValueError(f"keys {clash[:5]} appear in more than one shard ({f.name})")
        state.update(part)
    return state


def has_hf_layout(directory: Path) -> bool:
    """True when the directory's safetensors were written by ``save_pretrained`` (LLaVA's ``model.language_model.*``
    names), False for LLaDA / LLaDA-V repository layouts (``model.transformer.*``, ``model.layers.*``)."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory} has no *.safetensors weights")
    for f in files:
        with safe_open(f, "pt") as fh:
            if any(k.startswith(("model.language_model.", "language_model.model.")) for k in fh.keys()):
                return True
    return False


def load_llada_v(directory, config=None, drop=(), dtype: torch.dtype | None = None, model_class=None):
    """Load a LLaDA / LLaDA-V checkpoint directory (``*.safetensors`` + ``config.json``) into our classes.

    ``config`` (optional) overrides ``config.json``. A directory in transformers' own layout (what
    ``save_pretrained`` writes, e.g. ``keepsight diffusion train``) loads with ``from_pretrained``; the LLaDA /
    LLaDA-V repository layouts through the key map. A ``llava`` config (text_config of type "llada")
    gives a ``LlavaForConditionalGeneration``; a ``llada`` config gives ``LladaForMaskedDiffusion``; an
    OLMo-style LLaDA config (it has ``d_model``) is converted with ``llada_config_from_olmo``. LLaDA-V's
    own ``llava_llada`` config names its vision tower by hub id only - pass ``config`` for it. ``model_class``: the
    VLM class to build from ``config`` (default ``LlavaForConditionalGeneration``; LaViDa's for LaViDa).
    """
    register_llada()
    directory = Path(directory)
    check_weights(directory)
    if config is None and (directory / "config.json").is_file() and has_hf_layout(directory):
        raw = json.loads((directory / "config.json").read_text())
        if raw.get("model_type") != "llava" or (raw.get("text_config") or {}).get("model_type") != "llada":
            raise ValueError(f"{directory} holds a {raw.get('model_type')!r} model, not a LLaDA-V-style VLM (a llava "
                             "config with a llada text_config); load it with keepsight.models.load_checkpoint")
        model = LlavaForConditionalGeneration.from_pretrained(directory, dtype=dtype or "auto").eval()
        check_finite_weights(model, directory)
        return model
    if config is None:
        path = directory / "config.json"
        if not path.exists():
            raise ValueError(f"{directory} has no config.json; pass config=")
        raw = json.loads(path.read_text())
        if "d_model" in raw:
            config = llada_config_from_olmo(raw)
        elif raw.get("model_type") == "llava":
            config = LlavaConfig.from_dict(raw)
        elif raw.get("model_type") == "llada":
            config = LladaConfig.from_dict(raw)
        else:
            raise ValueError(f"config.json has model_type {raw.get('model_type')!r}; expected 'llava' (with a "
                             "'llada' text_config) or 'llada', or pass config=")
    if isinstance(config, LladaConfig):
        cls, target = LladaForMaskedDiffusion, "lm"
    elif getattr(getattr(config, "text_config", None), "model_type", None) == "llada":
        cls, target = model_class or LlavaForConditionalGeneration, "vlm"
    else:
        raise ValueError(f"config {type(config).__name__} is neither a LladaConfig nor a LLaVA config with a "
                         "'llada' text_config")
    with init_empty_weights():  # parameters on the meta device: no random model is built before the weights load
        model = cls(config)
    state = _read_safetensors(directory)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    load_mapped_state(model, state, target, drop, assign=True)
    check_finite_weights(model, directory)
    return model.eval()
