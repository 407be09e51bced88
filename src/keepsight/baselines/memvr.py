"""MemVR (Zou et al. 2025, "Look Twice Before You Answer: Memory-Space Visual Retracing for Hallucination
Mitigation in Multimodal Large Language Models"), written from the paper's description: the training-free cousin of
PVM. When the model is uncertain about the next token, the visual tokens are re-injected into one decoder layer's
FFN as key-value memory:

    FFN'(x) = FFN(x) + alpha * softmax(x Z^T / sqrt(d)) Z

with Z the visual tokens as inserted into the language model's input (the projector / merger output) and x the
FFN's input at the generating position. The trigger (our reading of "uncertainty"): the normalised entropy
H(p) / ln V of the LogitLens distribution (final norm + lm_head) of ``probe_layer``'s output at that position;
rows above ``threshold`` get the memory at ``inject_layer`` (which must come after ``probe_layer``). Defaults (ours
where the paper leaves a choice): inject at the middle layer, probe the layer before it, threshold 0.75,
alpha 0.1. ``threshold`` above 1 (never reached) or ``alpha = 0`` is the plain model, bit for bit.

Which positions may be retraced (``rows``): "generated" (default): the last position of every forward (the prompt's
last one, then each new token), as decoding meets them; "after_image": every position after the image's last token,
each with its own trigger - a fixed function of the sequence, so a cached generation equals a full forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..models.arch import arch_info
from .base import Baseline, layer_range, number


@dataclass
class MemVRConfig:
    alpha: float = 0.1  # memory strength
    threshold: float = 0.75  # normalised entropy that triggers the retracing (in [0, 1]; > 1: never)
    inject_layer: int | None = None  # None: the middle layer
    probe_layer: int | None = None  # None: the layer before inject_layer
    rows: str = "generated"  # "generated" | "after_image" (see the module docstring)

    def __post_init__(self) -> None:
        if self.rows not in ("generated", "after_image"):
            raise ValueError(f"rows must be 'generated' or 'after_image', got {self.rows!r}")
        self.alpha = number("alpha", self.alpha, low=0.0)
        self.threshold = number("threshold", self.threshold, low=0.0)


class MemVR(Baseline):
    name = "memvr"

    def __init__(self, config: MemVRConfig | None = None, **settings):
        super().__init__(config or MemVRConfig(**settings))

    def _install(self, model, stack) -> None:
        info = arch_info(model)
        n = len(info.layers)
        cfg = self.config
        inject = layer_range("inject_layer", [cfg.inject_layer if cfg.inject_layer is not None else n // 2], n)[0]
        probe = layer_range("probe_layer", [cfg.probe_layer if cfg.probe_layer is not None else inject - 1], n)[0]
        if probe >= inject:
            raise ValueError(f"probe_layer {probe} must come before inject_layer {inject} (the trigger is read first)")
        state: dict = {"ids": None, "memory": None, "fire": None, "after": None}
        self._stats.extra.update(triggered=0, positions=0, inject_layer=inject, probe_layer=probe)
        self._stats.compares_logits = False  # the memory enters the FFN: the plain logits are never computed

        def grab_ids(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            state["ids"] = ids
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            if ids is None:
                return
            visual = (ids == info.image_token_id).long()
            if cache is None or cache.get_seq_length() == 0 or state["after"] is None:  # [B, T]: after the image
                state["after"] = (visual.flip(-1).cumsum(-1).flip(-1) == 0) & (visual.cumsum(-1) > 0)
            else:
                state["after"] = torch.ones_like(ids, dtype=torch.bool)

        def grab_memory(module, args, kwargs):  # the language model's input embeddings, images merged in
            embeds = kwargs.get("inputs_embeds")
            ids = state["ids"]
            if embeds is None or ids is None or ids.shape != embeds.shape[:2]:
                return
            visual = ids == info.image_token_id
            if bool(visual.any()):
                if not bool((visual.sum(1) == visual.sum(1)[0]).all()):
                    raise ValueError("MemVR: rows with different numbers of image tokens in one batch")
                state["memory"] = embeds[visual].view(ids.shape[0], -1, embeds.shape[-1]).detach()  # [B, Nv, d]

        def positions(T: int) -> torch.Tensor:
            """[B, T] bool: the positions this forward may retrace."""
            if cfg.rows == "generated":
                where = torch.zeros(state["after"].shape[0], T, dtype=torch.bool)
                where[:, -1] = True
                return where
            return state["after"][:, -T:].cpu()

        def trigger(module, args, output):
            h = output[0] if isinstance(output, tuple) else output  # [B, T, d]
            with torch.no_grad():
                logp = info.lm_head(info.final_norm(h)).float().log_softmax(-1)  # [B, T, V]
                entropy = -(logp.exp() * logp).sum(-1) / math.log(logp.shape[-1])  # [B, T]
            state["fire"] = (entropy > cfg.threshold) & positions(h.shape[1]).to(entropy.device)

        def retrace(module, args, output):
            fire, memory = state["fire"], state["memory"]
            self._stats.forwards += 1
            self._stats.rows += output.shape[0]
            self._stats.extra["positions"] += output.shape[0]
            if cfg.alpha == 0 or fire is None or memory is None or not bool(fire.any()):
                return output
            x = args[0]  # [B, T, d]: the FFN's input
            z = memory.to(x.dtype)
            attn = torch.softmax((x @ z.transpose(1, 2)).float() / math.sqrt(x.shape[-1]), -1)  # [B, T, Nv]
            delta = attn.to(z.dtype) @ z  # [B, T, d]
            out = torch.where(fire[..., None], output + cfg.alpha * delta, output)
            self._stats.extra["triggered"] += int(fire.sum())
            self._stats.acted += 1
            return out

        handles = [model.register_forward_pre_hook(grab_ids, with_kwargs=True),
                   info.language_model.register_forward_pre_hook(grab_memory, with_kwargs=True),
                   info.layers[probe].register_forward_hook(trigger),
                   info.ffn(inject).register_forward_hook(retrace)]
        for handle in handles:
            stack.callback(handle.remove)
