"""MemVR (Zou et al. 2025, "Look Twice Before You Answer: Memory-Space Visual Retracing for Hallucination
Mitigation in Multimodal Large Language Models") as its authors released it (github 1zhou-Wang/MemVR ``memvr.py``:
the replaced ``LlamaModel.forward``, lines 157-257, and ``LlamaMLP.forward``, lines 83-90; defaults from the README
and every ``eval_scripts/llava/*.sh``).

Per forward (the prefill, then each decoding step), after every decoder layer l the LogitLens of its output at the
last position (the final norm and the LM head) gives the next-token logits; their uncertainty is the entropy of the
softmax over the top 10 logits divided by ln 10. The first layer with ``start_layer < l < end_layer`` (5 and 16 for
32 layers; scaled to other depths: floor(5 L / 32), ceil(16 L / 32)) whose uncertainty exceeds ``threshold`` (0.75)
triggers, once per forward; layer l + 1's FFN then reads the visual memory Z (the image tokens as they enter the
language model: the projector / merger output) over every position of the forward:

    A = (x Z^T) Z,   A' = A * mean|FFN(x)| / mean|A|,   FFN'(x) = (1 - r) FFN(x) + r A'

with x the FFN's input and r = ``ratio`` (0.12: MME, MM-Vet and the CHAIR script as run). The release's two scales
of Z (mean |W_up| / mean |Z|, mean |W_down| / mean |Z|) cancel in A'. ``threshold`` >= 1 (never exceeded) or
``ratio = 0`` is the plain model, bit for bit.

Batched, unlike the release (batch size 1; its decision sums the entropy over the batch and its means run over the
whole tensor): each row decides for itself and its means run over its own real (unpadded) positions, so a row gives
the same result alone or in a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..checks import number
from ..methods import register_method
from ..models.arch import arch_info, starts_sequence
from .base import Baseline


@dataclass
class MemVRConfig:
    # the settings at which the method must leave greedy and sampled decoding unchanged (ZERO) and must act (STRONG):
    # the registry's tests run every registered method at both on every family
    ZERO: ClassVar[dict] = {"threshold": 2.0}
    STRONG: ClassVar[dict] = {"threshold": 0.0, "ratio": 0.5}
    threshold: float = 0.75  # top-10 entropy / ln 10 that triggers (README, eval scripts: 0.75; >= 1: never)
    ratio: float = 0.12  # r of (1 - r) FFN + r A' (mme.sh, mmvet.sh; the CHAIR loader hard-codes 0.12)
    start_layer: int | None = None  # probed layers: start < l < end (scripts: 5, 16 of 32; None: scaled to the depth)
    end_layer: int | None = None

    def __post_init__(self) -> None:
        self.threshold = number("threshold", self.threshold, low=0.0)
        self.ratio = number("ratio", self.ratio, low=0.0, high=1.0)
        for name in ("start_layer", "end_layer"):
            if getattr(self, name) is not None:
                setattr(self, name, number(name, getattr(self, name), low=0, integer=True))
        if self.start_layer is not None and self.end_layer is not None and self.end_layer <= self.start_layer + 1:
            raise ValueError(f"start_layer {self.start_layer} and end_layer {self.end_layer} leave no layer to probe "
                             "(start < l < end): MemVR would never act")


def default_window(n_layers: int) -> tuple[int, int]:
    """The released (start, end) = (5, 16) of a 32-layer model, scaled to ``n_layers``."""
    return (5 * n_layers) // 32, -(-16 * n_layers // 32)


def top10_uncertainty(logits: torch.Tensor) -> torch.Tensor:
    """memvr.py lines 213-215: the entropy of the softmax over the 10 largest logits, / ln 10. [B, V] -> [B]."""
    top = logits.float().topk(min(10, logits.shape[-1]), -1).values
    p = top.softmax(-1)
    return -(p * p.log()).sum(-1) / math.log(10)


class MemVR(Baseline):
    name = "memvr"

    def __init__(self, config: MemVRConfig | None = None, **settings):
        super().__init__(config or MemVRConfig(**settings))

    def _install(self, model, stack) -> None:
        info = arch_info(model)
        n = len(info.layers)
        cfg = self.config
        start, end = default_window(n)
        start = start if cfg.start_layer is None else cfg.start_layer
        end = end if cfg.end_layer is None else cfg.end_layer
        if end > n:
            raise ValueError(f"end_layer {end} is out of range for a model with {n} decoder layers")
        probed = [i for i in range(start + 1, end) if i + 1 < n]  # start < l < end, with a layer after it
        if not probed:
            raise ValueError(f"memvr: start_layer {start} and end_layer {end} leave no layer to probe on a model with "
                             f"{n} decoder layers (start < l < end, with a layer after it): it would never act")
        # memory: per row the image tokens' input embeddings [Nv_r, d]; real: [B, T_total] the unpadded positions
        state: dict = {"ids": None, "memory": None, "real": None, "inject": None}
        self._stats.extra.update(triggered=0, layers={}, window=[start, end])
        self._stats.compares_logits = False  # the memory enters the FFN: the plain logits are never computed

        def begin(module, args, kwargs):  # every forward of the model: its ids, padding, and a fresh decision
            ids = kwargs.get("input_ids", args[0] if args else None)
            state["ids"] = ids
            am = kwargs.get("attention_mask")
            state["real"] = am.bool() if am is not None and am.dim() == 2 else None
            B = (ids if ids is not None else kwargs["inputs_embeds"]).shape[0]
            state["inject"] = torch.full((B,), -1, dtype=torch.long)  # [B]: the layer whose FFN retraces
            self._stats.forwards += 1
            self._stats.rows += B
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            if starts_sequence(cache):
                state["memory"] = None  # a new sequence: its memory comes with its image

        def grab_memory(module, args, kwargs):  # the language model's input embeddings, images merged in
            embeds, ids = kwargs.get("inputs_embeds"), state["ids"]
            if embeds is None or ids is None or ids.shape != embeds.shape[:2]:
                return
            visual = ids == info.image_token_id  # [B, T]
            if bool(visual.any()):
                state["memory"] = [embeds[r][visual[r]].detach() for r in range(ids.shape[0])]  # [Nv_r, d] each

        def probe(layer: int):
            def hook(module, args, output):
                if cfg.ratio == 0 or state["memory"] is None:
                    return
                h = output[0] if isinstance(output, tuple) else output  # [B, T, d]
                with torch.no_grad():
                    u = top10_uncertainty(info.lm_head(info.final_norm(h[:, -1])))  # [B]
                fire = (u > cfg.threshold).cpu() & (state["inject"] < 0)
                state["inject"][fire] = layer + 1
            return hook

        def retrace(layer: int):
            def hook(module, args, output):
                rows = (state["inject"] == layer).nonzero().flatten().tolist()
                if not rows:
                    return output
                x = args[0]  # [B, T, d]: the FFN's input (post-attention norm)
                out = output.clone()
                T = x.shape[1]
                for r in rows:
                    z = state["memory"][r].to(x.dtype)  # [Nv, d]
                    if z.numel() == 0:
                        continue
                    real = (state["real"][r, -T:].to(x.device) if state["real"] is not None
                            else torch.ones(T, dtype=torch.bool, device=x.device))  # [T]
                    a = (x[r] @ z.T) @ z  # [T, d]
                    scale = output[r][real].abs().mean() / a[real].abs().mean()
                    out[r] = output[r] * (1 - cfg.ratio) + (scale * a) * cfg.ratio
                    self._stats.extra["layers"][layer] = self._stats.extra["layers"].get(layer, 0) + 1
                self._stats.extra["triggered"] += len(rows)
                self._stats.acted += 1
                return out
            return hook

        handles = [model.register_forward_pre_hook(begin, with_kwargs=True),
                   info.language_model.register_forward_pre_hook(grab_memory, with_kwargs=True)]
        handles += [info.layers[i].register_forward_hook(probe(i)) for i in probed]
        handles += [info.ffn(i + 1).register_forward_hook(retrace(i + 1)) for i in probed]
        for handle in handles:
            stack.callback(handle.remove)


register_method("memvr", MemVRConfig, MemVR, family="autoregressive", needs="nothing")
