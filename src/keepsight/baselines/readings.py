"""Our earlier readings of the baselines' papers, written before we read their authors' code: kept for the experiments
that set them beside the released methods and for their tests, outside the method registry (the command line,
lmms-eval and the support matrix offer the released methods only). Each is a ``keepsight.methods.Method`` entry that
``keepsight.inference.Decoders`` applies like a registered one: ``Decoders([(VCD_LINEAR, {})])``.

- ``VCD_LINEAR``: VCD with the linear DDPM noise schedule (betas 1e-4 .. 0.02: abar_500 = 0.078, near-pure noise)
  in place of the release's sigmoid one (abar_500 = 0.745).
- ``MEMVR_SOFTMAX``: MemVR as one fixed layer pair: where the full-vocabulary entropy / ln V of the probe layer's
  LogitLens exceeds ``threshold``, the inject layer's FFN adds ``alpha * softmax(x Z^T / sqrt(d)) Z`` (Z the image
  tokens as they enter the language model), at the generating position (``rows="generated"``) or at every position
  after the image (``"after_image"``).
- ``pai_paper_alpha``: PAI at alpha 0.5, our reading of the paper for LLaVA-1.5 (the released commands run 0.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..checks import layer_indices, number
from ..methods import Method
from ..models.arch import arch_info, starts_sequence
from .base import Baseline
from .pai import PAIConfig
from .vcd import VCD, VCDConfig

LINEAR_BETAS = (1e-4, 0.02)  # DDPM's linear schedule


def linear_alpha_bar(step: int, diffusion_steps: int = 1000) -> float:
    """prod_{s <= step} (1 - beta_s) of the linear DDPM schedule beta_s in [1e-4, 0.02] (float64)."""
    betas = torch.linspace(*LINEAR_BETAS, diffusion_steps, dtype=torch.float64)
    return float(torch.cumprod(1 - betas, 0)[step])


class LinearScheduleVCD(VCD):
    """VCD whose distorted image follows the linear DDPM schedule."""

    name = "vcd_linear"

    def alpha_bar(self) -> float:
        return linear_alpha_bar(self.config.noise_step, self.config.diffusion_steps)


@dataclass
class MemVRSoftmaxConfig:
    threshold: float = 0.75  # full-vocabulary entropy / ln V of the probe layer's LogitLens that triggers
    alpha: float = 0.1  # memory strength
    inject_layer: int | None = None  # None: the middle layer
    probe_layer: int | None = None  # None: the layer before inject_layer
    rows: str = "generated"  # "generated" (the last position of each forward) | "after_image"

    def __post_init__(self) -> None:
        if self.rows not in ("generated", "after_image"):
            raise ValueError(f"rows must be 'generated' or 'after_image', got {self.rows!r}")
        self.threshold = number("threshold", self.threshold, low=0.0)
        self.alpha = number("alpha", self.alpha, low=0.0)


class MemVRSoftmax(Baseline):
    name = "memvr_softmax"

    def __init__(self, config: MemVRSoftmaxConfig | None = None, **settings):
        super().__init__(config or MemVRSoftmaxConfig(**settings))

    def _install(self, model, stack) -> None:
        info = arch_info(model)
        n = len(info.layers)
        cfg = self.config
        inject = layer_indices("inject_layer", [cfg.inject_layer if cfg.inject_layer is not None else n // 2], n)[0]
        probe = layer_indices("probe_layer", [cfg.probe_layer if cfg.probe_layer is not None else inject - 1], n)[0]
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
            if starts_sequence(cache) or state["after"] is None:  # [B, T]: after the image
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


def pai_paper_alpha(**settings) -> PAIConfig:
    """PAI at alpha 0.5 (our reading of the paper for LLaVA-1.5; not in the released commands)."""
    return PAIConfig(**{"alpha": 0.5, **settings})


VCD_LINEAR = Method(name="vcd_linear", stage="decode", family="autoregressive", config=VCDConfig,
                    build=LinearScheduleVCD, needs="nothing (a noised copy of the image is made)")
MEMVR_SOFTMAX = Method(name="memvr_softmax", stage="decode", family="autoregressive", config=MemVRSoftmaxConfig,
                       build=MemVRSoftmax, needs="nothing")
READINGS = {m.name: m for m in (VCD_LINEAR, MEMVR_SOFTMAX)}
