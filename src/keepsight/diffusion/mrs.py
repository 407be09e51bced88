"""Monotonic RoPE Scaling (MRS) and the NTK / YaRN drop-in baselines.

As released (github.com/hong-sujung/MPD-PAC, ``LLaDARotaryEmbedding.make_monotonic_freq_mask``): every RoPE angle
``position * inv_freq_i`` is multiplied by ``s_i = 1 + beta * y(tau_i)``, ``tau_i = i / (D/2 - 1)`` over the
frequency index (0: the highest), the same scale for both dims of a pair, for every token
(``keepsight.ops.rope.angle_scales``; its ``rope`` argument is ``10 * beta``). Since the angle is linear
in the position this is ``inv_freq_i * s_i``, swapped into the rotary module inside ``apply``.

Our earlier readings of the paper (gains on each pair's attention logit, or on its frequency) are
``keepsight.diffusion.readings.RoPEGains``.

Segments: ``"all"`` (default) or a subset of {"visual", "prompt", "generation"}. Transformers rotates q and
k with the same cos/sin, so the scaling is per *token*: a token in the chosen segments has both its query
and its key scaled: a logit between two chosen tokens is scaled on both sides, between a chosen and an unchosen
token on one, between two unchosen tokens not at all. Segment membership is read per
forward from the ``input_ids`` given to the model passed to ``apply`` (visual = image token; generation =
columns >= ``gen_start``; prompt = the other columns before ``gen_start``), or from ``segment_mask``
(a ``[B, T]`` bool tensor or a callable ``input_ids -> [B, T]``; it overrides ``segments``). Segment
subsets need full-sequence forwards (no KV cache), which is what a diffusion sampler does.

Works on any transformers-5 text stack with ``rotary_emb`` (Llada, LLaMA, Qwen3) and on LLaVA around one.
``beta = 0`` leaves every logit bit-identical.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from contextlib import contextmanager

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..checks import number
from ..methods import register_method
from ..models.arch import decoder_stack
from ..models.arch import image_token_id as config_image_token_id
from ..ops.rope import angle_scaled_inv_freq, angle_scales, scale_rotary
from .config import SEGMENTS, MRSConfig  # noqa: F401  (the segment names, re-exported)


def _input_ids_of(args, kwargs) -> torch.Tensor | None:
    ids = kwargs.get("input_ids")
    if ids is None and args and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point():
        ids = args[0]
    return ids


class MonotonicRoPEScaling:
    """``with MonotonicRoPEScaling(beta=0.01).apply(model): model(...)``; see the module docstring."""

    config_class = MRSConfig
    scales_rotary_output = False  # True: (cos, sin) scaled per pair by sqrt(gains) in place of the frequencies

    def __init__(self, beta: float | MRSConfig | None = None, **settings):
        """``MonotonicRoPEScaling(0.01)``, ``MonotonicRoPEScaling(beta=0.5, eta=12)`` or
        ``MonotonicRoPEScaling(MRSConfig(...))``; defaults are ``MRSConfig``'s (the paper's)."""
        if isinstance(beta, MRSConfig) and not isinstance(beta, self.config_class):
            raise TypeError(f"{type(self).__name__} takes a {self.config_class.__name__}, got {type(beta).__name__}")
        base = beta if isinstance(beta, MRSConfig) else self.config_class()
        if beta is not None and not isinstance(beta, MRSConfig):
            settings = {"beta": beta, **settings}
        try:
            self.config = dataclasses.replace(base, **settings)
        except TypeError as e:
            raise ValueError(f"MonotonicRoPEScaling: {e}") from None

    def __getattr__(self, name: str):  # the settings read as attributes: mrs.beta, mrs.segments, ...
        config = self.__dict__.get("config")
        if config is not None and name in {f.name for f in dataclasses.fields(config)}:
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def gains(self, head_dim: int) -> torch.Tensor:
        """Per pair ``[head_dim / 2]`` (float64): the angle scales ``s``."""
        return angle_scales(head_dim, self.beta, self.eta, self.tau0, self.schedule)

    def scaled_inv_freq(self, inv_freq: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
        """The rotary module's ``inv_freq`` under ``gains``: each pair's frequency times its angle scale."""
        return angle_scaled_inv_freq(inv_freq, gains)

    def _segment_where(self, ids: torch.Tensor, gen_start, image_token_id) -> torch.Tensor:
        """``[B, T]`` bool: tokens of the chosen segments."""
        col = torch.arange(ids.shape[1], device=ids.device)[None]  # [1, T]
        visual = ids == image_token_id if image_token_id is not None else torch.zeros_like(ids, dtype=torch.bool)
        out = torch.zeros_like(ids, dtype=torch.bool)
        if "visual" in self.segments:
            out |= visual
        if "generation" in self.segments:
            out |= (col >= gen_start).expand_as(ids)
        if "prompt" in self.segments:
            out |= (col < gen_start) & ~visual
        return out

    @contextmanager
    def apply(self, model: torch.nn.Module, *, gen_start: int | None = None, image_token_id: int | None = None,
              segment_mask: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None = None):
        """Scale RoPE inside the ``with`` block; hooks and buffers are restored on exit."""
        rotary = decoder_stack(model).rotary_emb
        gains = self.gains(rotary.inv_freq.shape[-1] * 2)  # [D/2]
        handles, state = [], {"ids": None}
        auto = self.segments != "all" and segment_mask is None
        if gen_start is not None:
            number("gen_start", gen_start, 0, integer=True)  # the first generation column
        if auto:
            if image_token_id is None and getattr(model, "config", None) is not None:
                image_token_id = config_image_token_id(model.config)
            if "visual" in self.segments and image_token_id is None:
                raise ValueError("segment 'visual' needs image_token_id (the model config names none)")
            if self.segments & {"prompt", "generation"} and gen_start is None:
                raise ValueError(f"segments {sorted(self.segments)} need gen_start (first generation column)")

        def grab(module, args, kwargs):
            state["ids"] = _input_ids_of(args, kwargs)

        def first_forward(module, args, kwargs):  # the whole sequence (later cached forwards may see windows)
            ids = _input_ids_of(args, kwargs)
            x = ids if ids is not None else kwargs.get("inputs_embeds")
            if x is not None and not state.get("checked"):
                state["checked"] = True
                if gen_start > x.shape[1]:
                    raise ValueError(f"gen_start {gen_start} lies past the sequence ({x.shape[1]} columns)")

        def where_now() -> torch.Tensor | None:
            if isinstance(segment_mask, torch.Tensor):
                return segment_mask.bool()
            if segment_mask is None and self.segments == "all":
                return None
            if state["ids"] is None:
                raise RuntimeError("MRS segments need input_ids on the model's forward (got inputs_embeds only); "
                                   "pass segment_mask= as a [B, T] tensor")
            if callable(segment_mask):
                return segment_mask(state["ids"]).bool()
            if gen_start is not None and gen_start > state["ids"].shape[1]:
                raise ValueError(f"gen_start {gen_start} lies past the sequence ({state['ids'].shape[1]} columns)")
            return self._segment_where(state["ids"], gen_start, image_token_id)

        original = (rotary.inv_freq, rotary.attention_scaling)
        new_freq = self.scaled_inv_freq(rotary.inv_freq, gains)

        def amplitude_hook(module, args, kwargs, out):
            cos, sin = out  # [B|1, T, D]
            return scale_rotary(cos, sin, gains, where_now())

        def frequency_hook(module, args, kwargs, out):
            where = where_now()  # [B, T]
            module.inv_freq = new_freq
            try:
                alt = module.forward(*args, **kwargs)  # plain forward: no hooks, no recursion
            finally:
                module.inv_freq = original[0]
            w = where[..., None].to(out[0].device)  # [B, T, 1]
            return tuple(torch.where(w, a, o) for a, o in zip(alt, out))

        reads_columns = auto or callable(segment_mask)
        try:
            if gen_start is not None:
                handles.append(model.register_forward_pre_hook(first_forward, with_kwargs=True))
            if reads_columns:  # the cached samplers forward windows: their column indices are not the sequence's
                model._keepsight_reads_columns = "MRS with segments other than 'all'"
                handles.append(model.register_forward_pre_hook(grab, with_kwargs=True))
            if self.scales_rotary_output:
                handles.append(rotary.register_forward_hook(amplitude_hook, with_kwargs=True))
            elif segment_mask is None and self.segments == "all":
                rotary.inv_freq = new_freq
            else:
                handles.append(rotary.register_forward_hook(frequency_hook, with_kwargs=True))
            yield self
        finally:
            for h in handles:
                h.remove()
            rotary.inv_freq, rotary.attention_scaling = original
            if reads_columns:
                model.__dict__.pop("_keepsight_reads_columns", None)


class RoPEBaseline:
    """NTK-aware or YaRN inverse frequencies swapped into the model's rotary module inside ``apply``,
    computed with ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` from the model's own config.

    ``kind="ntk"``: static NTK-aware scaling, base -> base * factor ** (D / (D - 2)); transformers'
    "dynamic" function evaluated at the length where its multiplier equals that (at lengths up to
    ``max_position_embeddings`` the dynamic variant itself is a no-op). ``kind="yarn"``: transformers'
    "yarn" with ``factor`` and ``original_max_position_embeddings`` (default: the config's
    ``max_position_embeddings``); its attention factor (mscale) replaces ``attention_scaling``."""

    KINDS = {"ntk": "dynamic", "yarn": "yarn"}

    def __init__(self, kind: str = "ntk", factor: float = 2.0, original_max_position_embeddings: int | None = None,
                 **rope_extra):
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {sorted(self.KINDS)}, got {kind!r}")
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        self.kind, self.factor, self.rope_extra = kind, factor, rope_extra
        self.original_max = original_max_position_embeddings

    def inv_freq(self, rotary: torch.nn.Module) -> tuple[torch.Tensor, float]:
        cfg = copy.deepcopy(rotary.config)
        theta = cfg.rope_parameters["rope_theta"]
        cfg.rope_parameters = {
            "rope_type": self.KINDS[self.kind], "rope_theta": theta, "factor": float(self.factor),
            "original_max_position_embeddings": self.original_max or cfg.max_position_embeddings, **self.rope_extra}
        kwargs = {}
        if self.kind == "ntk":  # evaluate the dynamic formula where its base multiplier is factor ** (d / (d - 2))
            kwargs["seq_len"] = cfg.max_position_embeddings * (2 * self.factor - 1) / self.factor
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[self.KINDS[self.kind]](cfg, rotary.inv_freq.device, **kwargs)
        return inv_freq.to(rotary.inv_freq.dtype), float(scaling)

    @contextmanager
    def apply(self, model: torch.nn.Module):
        rotary = decoder_stack(model).rotary_emb
        original = (rotary.inv_freq, rotary.attention_scaling)
        inv_freq, scaling = self.inv_freq(rotary)
        try:
            rotary.inv_freq, rotary.attention_scaling = inv_freq, scaling
            yield self
        finally:
            rotary.inv_freq, rotary.attention_scaling = original


class FlashPathSpans:
    """What MPD-PAC's LLaDA-V flash-attention path does to RoPE (``LLaDAFlashAttention2.forward`` in
    ``LLaDA-V/llava/model/language_model/modeling_llada_ours.py``; ``flash_attention_2`` is its model builder's default
    attention): whenever its sampler passes the image span, MRS on or off, the rotary cos and sin (so q and k alike)
    are multiplied by ``vision_scale`` (0.3) over the image tokens ``[img_start, img_end)`` and by ``gen_scale`` (2.0)
    over the last ``min(span, T - img_end)`` columns (``span`` 128: the generation slots, and the prompt's last text
    when fewer than 128 are generated). A logit between columns i and j is so multiplied by ``s_i * s_j``. The release's
    eager and sdpa paths, and keepsight's default, leave RoPE alone; this is that path as a named setting.

    Per row, the image span is its first to last image token (the release runs one row, whose image features fill
    exactly that span); a row without image tokens is left as it is (the release's text-only call passes no span).
    Like MRS's segments it reads columns, so it needs full-sequence forwards (``cache="none"``)."""

    def __init__(self, vision_scale: float = 0.3, gen_scale: float = 2.0, span: int = 128):
        self.vision_scale = number("vision_scale", vision_scale, 0.0, open_low=True)
        self.gen_scale = number("gen_scale", gen_scale, 0.0, open_low=True)
        self.span = number("span", span, 0, integer=True)

    def scales(self, ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
        """``[B, T]``: each column's factor on cos and sin."""
        T = ids.shape[1]
        image = (ids == image_token_id).int()  # [B, T]
        has = image.any(1, keepdim=True)  # [B, 1]
        start = image.argmax(1, keepdim=True)  # first image column
        end = T - image.flip(1).argmax(1, keepdim=True)  # one past the last
        col = torch.arange(T, device=ids.device)[None]  # [1, T]
        gen = (col >= T - (T - end).clamp(max=self.span)) & (col >= end)  # the last min(span, T - end) columns
        out = torch.ones(ids.shape, dtype=torch.float32, device=ids.device)
        out = out.masked_fill(has & (col >= start) & (col < end), self.vision_scale)
        return out.masked_fill(has & gen, self.gen_scale)

    @contextmanager
    def apply(self, model: torch.nn.Module, image_token_id: int | None = None):
        rotary = decoder_stack(model).rotary_emb
        if image_token_id is None:
            image_token_id = config_image_token_id(getattr(model, "config", None) or {})
        if image_token_id is None:
            raise ValueError("FlashPathSpans needs image_token_id (the model config names none)")
        state: dict = {"ids": None}

        def grab(module, args, kwargs):
            state["ids"] = _input_ids_of(args, kwargs)

        def hook(module, args, kwargs, out):
            ids = state["ids"]
            if ids is None:
                raise RuntimeError("FlashPathSpans reads the image span from input_ids (got inputs_embeds only)")
            cos, sin = out  # [B|1, T, D]
            if cos.shape[-2] != ids.shape[1]:
                raise RuntimeError(f"the rotary embedding covers {cos.shape[-2]} columns but the input {ids.shape[1]}: "
                                   "FlashPathSpans needs full-sequence forwards (cache='none')")
            s = self.scales(ids, image_token_id)[..., None].to(cos.dtype)  # [B, T, 1]
            return cos * s, sin * s

        handles = [model.register_forward_pre_hook(grab, with_kwargs=True),
                   rotary.register_forward_hook(hook, with_kwargs=True)]
        model._keepsight_reads_columns = "FlashPathSpans"
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            model.__dict__.pop("_keepsight_reads_columns", None)


register_method("mrs", MRSConfig, MonotonicRoPEScaling, family="diffusion", needs="a RoPE text model",
                enter=lambda obj, model, prompt_len: obj.apply(model, gen_start=prompt_len))
