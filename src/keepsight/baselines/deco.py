"""DeCo (Wang et al. 2024, "MLLM Can See? Dynamic Correction Decoding for Hallucination Mitigation"), written from
the paper's description: an early layer often still ranks the visually right token higher than the final layer;
DeCo picks, among the final layer's candidate tokens, the early layer most confident about one of them and adds its
logits to the final ones:

    C = top-p(top-k(softmax(l_N)))            the final layer's candidates
    l* = argmax_{l in layers} max_{y in C} softmax(l_l)(y),   c = that maximum
    logits(y) = l_N(y) + alpha * c * l_{l*}(y) for y in C, -inf elsewhere

with l_l the LogitLens logits (final norm + lm_head) of layer l at the generating position. Defaults for
LLaVA-1.5 (32 layers): alpha = 0.6, early layers "20 .. 28" in the paper's indexing of ``hidden_states`` (entry i is
the output of decoder layer i - 1, entry 0 the embeddings), i.e. the outputs of decoder layers 19 .. 27 here,
scaled to a model's depth as the fractions 0.625 .. 0.875 of its layers, one shallower; candidates top-k 20 and
top-p 0.9. The authors' code was not found in a public repository (the settings come from the issue review of
it and the paper); there is no parity fixture. ``alpha = 0`` is the plain model, bit for bit (the candidate cut
applies only when alpha > 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..checks import layer_indices, number
from ..methods import register_method
from ..models.arch import arch_info
from .base import Baseline


@dataclass
class DeCoConfig:
    # the settings at which the method must leave greedy and sampled decoding unchanged (ZERO) and must act (STRONG):
    # the registry's tests run every registered method at both on every family
    ZERO: ClassVar[dict] = {"alpha": 0.0}
    STRONG: ClassVar[dict] = {"alpha": 0.6}
    alpha: float = 0.6  # paper: 0.6
    layers: list[int] | None = None  # decoder layers (None: outputs of 19 .. 27 of 32 = hidden_states[20 .. 28])
    top_k: int = 20  # candidates (reference: 20)
    top_p: float = 0.9

    def __post_init__(self) -> None:
        self.alpha = number("alpha", self.alpha, low=0.0)
        self.top_k = number("top_k", self.top_k, low=1, integer=True)
        self.top_p = number("top_p", self.top_p, low=0.0, high=1.0)


def default_layers(n_layers: int) -> list[int]:
    """The early layers: ``hidden_states[20 .. 28]`` of LLaVA-1.5's 32 layers, the outputs of decoder layers
    19 .. 27, as fractions of any depth."""
    lo, hi = max(0, int(0.625 * n_layers) - 1), max(0, min(n_layers - 1, int(0.875 * n_layers)) - 1)
    return list(range(lo, max(lo, hi) + 1))


def candidates(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[B, V] bool: the top-k tokens, cut to the smallest prefix whose probability reaches top_p (at least one)."""
    probs = logits.float().softmax(-1)
    top, idx = probs.topk(min(top_k, probs.shape[-1]), -1)  # [B, k]
    before = top.cumsum(-1) - top  # mass of the better-ranked tokens
    keep = before < top_p
    keep[:, 0] = True
    out = torch.zeros_like(probs, dtype=torch.bool)
    return out.scatter(-1, idx, keep)


class DeCo(Baseline):
    name = "deco"

    def __init__(self, config: DeCoConfig | None = None, **settings):
        super().__init__(config or DeCoConfig(**settings))

    def _install(self, model, stack) -> None:
        info = arch_info(model)
        n = len(info.layers)
        self.layers = layer_indices("layers", self.config.layers if self.config.layers is not None else
                                  default_layers(n), n)
        hidden: dict[int, torch.Tensor] = {}
        self._stats.extra["layer_choices"] = {}

        def keep(i):
            def hook(module, args, output):
                hidden[i] = (output[0] if isinstance(output, tuple) else output)[:, -1].detach()  # [B, d]
            return hook

        for i in sorted(set(self.layers)):
            handle = info.layers[i].register_forward_hook(keep(i))
            stack.callback(handle.remove)

        def combine(kwargs, logits, prefill):
            if self.config.alpha == 0:
                return logits
            final = logits[:, -1]  # [B, V]
            cand = candidates(final, self.config.top_k, self.config.top_p)
            best_conf = torch.full(final.shape[:1], -1.0, device=final.device)
            best = torch.zeros_like(final)
            choice = torch.zeros(final.shape[0], dtype=torch.long)
            for i in self.layers:
                early = info.lm_head(info.final_norm(hidden[i])).to(final.dtype)  # [B, V]
                conf = early.float().softmax(-1).masked_fill(~cand, 0.0).max(-1).values  # [B]
                better = conf > best_conf
                best = torch.where(better[:, None], early, best)
                best_conf = torch.where(better, conf, best_conf)
                choice = torch.where(better.cpu(), torch.full_like(choice, i), choice)
            for c in choice.tolist():
                self._stats.extra["layer_choices"][c] = self._stats.extra["layer_choices"].get(c, 0) + 1
            refined = (final + self.config.alpha * best_conf[:, None].to(final.dtype) * best).masked_fill(
                ~cand, float("-inf"))
            out = logits.clone()
            out[:, -1] = refined
            return out

        self._logits_hook(model, stack, combine)


register_method("deco", DeCoConfig, DeCo, family="autoregressive", needs="nothing")
