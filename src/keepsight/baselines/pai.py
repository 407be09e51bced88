"""PAI (Liu et al. 2024, "Paying More Attention to Image: A Training-Free Method for Alleviating Hallucination in
LVLMs") as its authors released it (github LALBJ/PAI: ``attention.py`` ``llama_new_forward``, ``CFG.py`` ``CFGLogits``,
``chair_eval.py`` / ``pope_eval.py`` for the defaults).

1. Image attention amplified: in decoder layers 2 .. L-1 (``range(start_layer=2, end_layer=32)`` for the 32 layers
   of LLaVA-1.5), the attention logits of the last query of each forward (the prompt's last position at the
   prefill, then each new token) on the image keys become ``a + alpha * |a|``, after the causal mask is added (and
   clamped to the dtype's minimum) and before the softmax; alpha = 0.2 (the README's commands and the argparse
   default).
2. Image-centric logit refinement on log-probabilities: ``g * log p(y | v, x) - (g - 1) * log p(y | x)`` with
   g = 1.1 (the README; written here as ``gamma = g - 1 = 0.1`` so that gamma = 0 is the plain model), the text-only
   stream being the same prompt with its image tokens removed, its own KV cache and positions; then the
   plausibility cut the release hard-codes: tokens with ``p(y | v, x) < 0.1 * max p(y | v, x)`` get -inf
   (``beta = 0.1``). The result is in log space, as the release returns it.
3. With the refinement on, the release does not amplify the prefill's forward (its layers carry ``use_cfg=True``
   until the first call of the logits processor, which comes after the prefill): the first token's conditional
   logits are the unmodified model's. ``amplify_prefill=None`` does the same (amplified at the prefill only when
   gamma = 0); True / False force it.

Which queries are amplified (``rows``): "generated" (default, the release): the last query of every forward, so a
cached generation's keys carry the amplification of the step that made them and a full forward over the same
tokens differs; "after_image": every query after the image's last token, a fixed function of the sequence.

The amplification runs as an attention function registered with transformers' ``AttentionInterface``, set on the
language model's config inside ``apply`` only. Differences from the release, kept on purpose: it is batched (each
row its own image positions and padding) and handles grouped-query attention (the release's forward has neither);
the release's beam search never reorders its text-only cache (greedy, what its scripts run, is unaffected).
``alpha = 0`` and ``gamma = 0``, ``beta = 0`` give the plain model's generations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from ..checks import layer_indices, number
from ..methods import register_method
from ..models.arch import arch_info, rope_state_kept, starts_sequence
from .base import Baseline

PAI_ATTENTION = "keepsight_pai"
_ACTIVE: list[PAI] = []


@dataclass
class PAIConfig:
    # the settings at which the method must leave greedy and sampled decoding unchanged (ZERO) and must act (STRONG):
    # the registry's tests run every registered method at both on every family
    ZERO: ClassVar[dict] = {"alpha": 0.0, "gamma": 0.0, "beta": 0.0}
    STRONG: ClassVar[dict] = {"alpha": 0.5, "gamma": 0.5}
    alpha: float = 0.2  # image attention amplification (README commands, chair_eval.py / pope_eval.py --alpha: 0.2)
    gamma: float = 0.1  # text-only subtraction, g - 1 (README --gamma 1.1; model_loader.py init_cfg_processor: 1.1)
    layers: list[int] | None = None  # amplified decoder layers (None: 2 .. L-1, the scripts' start 2 / end 32)
    beta: float = 0.1  # plausibility cut on the conditional probabilities (CFG.py: a hard-coded 0.1)
    drop_token_ids: list[int] = field(default_factory=list)  # more ids to drop from the text-only prompt
    rows: str = "generated"  # amplified queries: "generated" (attention.py: the last row) | "after_image"
    amplify_prefill: bool | None = None  # None: as released (only when gamma = 0: use_cfg skips the prefill)

    def __post_init__(self) -> None:
        if self.rows not in ("generated", "after_image"):
            raise ValueError(f"rows must be 'generated' or 'after_image', got {self.rows!r}")
        if self.amplify_prefill not in (None, True, False):
            raise ValueError(f"amplify_prefill must be None, True or False, got {self.amplify_prefill!r}")
        self.alpha = number("alpha", self.alpha, low=0.0)
        self.gamma = number("gamma", self.gamma, low=0.0)
        self.beta = number("beta", self.beta, low=0.0, high=1.0)


def _pai_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    pai = _ACTIVE[-1] if _ACTIVE else None
    layer = getattr(module, "layer_idx", None)
    if (pai is None or pai.text_stream or layer not in pai.layers or pai.config.alpha == 0 or pai.visual is None
            or not pai.amplify_now):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    # query [B, H, Tq, D], key / value [B, Hkv, Tk, D]
    b, h, tq, d = query.shape
    rep = h // key.shape[1]
    k = key.repeat_interleave(rep, dim=1)
    v = value.repeat_interleave(rep, dim=1)
    scale = scaling if scaling is not None else d ** -0.5
    scores = (query @ k.transpose(-1, -2)).float() * scale  # [B, H, Tq, Tk]
    # the mask first, clamped to the dtype's minimum (attention.py lines 67-73), then the amplification
    if attention_mask is not None:
        scores = scores + attention_mask[..., : scores.shape[-1]].float()
    elif tq > 1:  # no mask given: causal over the new queries
        tk = scores.shape[-1]
        causal = torch.ones(tq, tk, dtype=torch.bool, device=scores.device).tril(tk - tq)
        scores = scores.masked_fill(~causal, float("-inf"))
    scores = scores.clamp(min=torch.finfo(scores.dtype).min)
    visual = pai.visual[:, None, :].to(scores.device)  # [B, 1, Tk]
    if visual.shape[-1] != scores.shape[-1]:
        raise RuntimeError(f"layer {layer}: {scores.shape[-1]} keys but {visual.shape[-1]} tracked tokens")
    if pai.config.rows == "generated":
        last = scores[:, :, -1]  # [B, H, Tk]: the generating position
        scores[:, :, -1] = torch.where(visual, last + pai.config.alpha * last.abs(), last)
    else:  # every query after the image: positions tk - tq .. tk - 1 against the last image column
        cols = torch.arange(scores.shape[-1], device=scores.device)
        last_image = torch.where(pai.visual.to(scores.device), cols, -1).max(-1).values  # [B]
        q_pos = cols[scores.shape[-1] - tq:]  # [Tq]
        rows = (q_pos[None] > last_image[:, None])[:, None, :, None]  # [B, 1, Tq, 1]
        scores = torch.where(rows & visual[:, :, None, :], scores + pai.config.alpha * scores.abs(), scores)
    weights = scores.softmax(-1).to(query.dtype)
    out = (weights @ v).transpose(1, 2).contiguous()  # [B, Tq, H, D]
    return out, weights


def _register() -> None:
    AttentionInterface.register(PAI_ATTENTION, _pai_attention)
    AttentionMaskInterface.register(PAI_ATTENTION, eager_mask)


class PAI(Baseline):
    name = "pai"

    def __init__(self, config: PAIConfig | None = None, **settings):
        super().__init__(config or PAIConfig(**settings))
        self.layers: set[int] = set()
        self.visual: torch.Tensor | None = None  # [B, T] image-token keys of the main stream
        self.text_stream = False
        self.amplify_now = True  # False during a prefill the release leaves alone (amplify_prefill)
        self._text: dict = {}

    def _install(self, model, stack) -> None:
        info = arch_info(model)
        n = len(info.layers)
        self.layers = set(layer_indices("layers", self.config.layers if self.config.layers is not None
                                      else range(min(2, n - 1), n), n))
        vocab = model.get_input_embeddings().num_embeddings
        outside = sorted(i for i in self.config.drop_token_ids if not 0 <= int(i) < vocab)
        if outside:
            raise ValueError(f"pai: drop_token_ids {outside} are outside the model's vocabulary ({vocab} tokens): "
                             "they would drop nothing")
        drop = {info.image_token_id, *self.config.drop_token_ids}
        for name in info.spec.image_markers:  # the tokens the row names around each image (Qwen-VL's vision start / end)
            value = getattr(model.config, name, None)
            if isinstance(value, int):
                drop.add(value)
        self._drop = torch.tensor(sorted(drop))
        if self.config.alpha > 0:
            _register()
            cfg = info.language_model.config
            saved = cfg._attn_implementation
            cfg._attn_implementation = PAI_ATTENTION
            stack.callback(setattr, cfg, "_attn_implementation", saved)
            _ACTIVE.append(self)
            stack.callback(_ACTIVE.remove, self)

            def track(module, args, kwargs):
                if self.text_stream:
                    return
                ids = kwargs.get("input_ids", args[0] if args else None)
                if ids is None:
                    raise ValueError("PAI needs input_ids (to find the image tokens), got inputs_embeds")
                cache = kwargs.get("cache", kwargs.get("past_key_values"))
                visual = ids == info.image_token_id
                if self.config.gamma == 0 and self.config.beta == 0:  # no logits hook counts the forwards
                    self._stats.forwards += 1
                    self._stats.acted += 1
                    self._stats.rows += ids.shape[0]
                new = starts_sequence(cache) or self.visual is None
                self.visual = visual if new else torch.cat([self.visual, visual.to(self.visual.device)], 1)
                prefill_amplified = (self.config.gamma == 0 if self.config.amplify_prefill is None
                                     else self.config.amplify_prefill)
                self.amplify_now = prefill_amplified or not new

            handle = model.register_forward_pre_hook(track, with_kwargs=True)
            stack.callback(handle.remove)
        if self.config.gamma > 0 or self.config.beta > 0:
            self._logits_hook(model, stack, lambda kw, logits, prefill: self._refine(model, kw, logits, prefill),
                              skip=lambda: self.text_stream)

    def _text_only(self, model, kwargs, prefill: bool) -> torch.Tensor:
        """The text-only stream's next-token logits [B, V] for this step (its own cache and positions)."""
        ids = kwargs["input_ids"]
        am = kwargs.get("attention_mask")
        am = torch.ones_like(ids) if am is None else am
        if prefill:
            keep = ~torch.isin(ids, self._drop.to(ids.device)) & am.bool()  # [B, T]
            rows = [ids[r][keep[r]] for r in range(ids.shape[0])]
            width = max(len(r) for r in rows)
            pad = model.config.get_text_config().pad_token_id or 0
            new_ids = ids.new_full((len(rows), width), pad)
            new_am = torch.zeros_like(new_ids)
            for r, row in enumerate(rows):  # left padding, as generation uses
                new_ids[r, width - len(row):], new_am[r, width - len(row):] = row, 1
            self._text = {"am": new_am, "cache": DynamicCache(config=model.config)}
            step_ids = new_ids
        else:
            self._text["am"] = torch.cat([self._text["am"], torch.ones_like(ids)], 1)
            step_ids = ids
        am_t = self._text["am"]
        pos = (am_t.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1]:]
        self.text_stream = True
        try:
            with rope_state_kept(model):
                out = model(input_ids=step_ids, attention_mask=am_t, position_ids=pos, cache=self._text["cache"],
                            use_cache=True)
        finally:
            self.text_stream = False
        return out.logits[:, -1]

    def _refine(self, model, kwargs, logits: torch.Tensor, prefill: bool) -> torch.Tensor:
        """CFG.py lines 29-57: on log-probabilities, ``(1 + gamma) log p_c - gamma log p_u``, then the cut on
        ``log p_c < log(beta) + max log p_c``; the last position's row is replaced, in log space."""
        g = self.config.gamma
        cond = logits[:, -1].log_softmax(-1)  # [B, V]
        refined = cond
        if g > 0:
            uncond = self._text_only(model, kwargs, prefill).to(cond.dtype).log_softmax(-1)
            refined = (1 + g) * cond - g * uncond
        if self.config.beta > 0:
            cutoff = torch.log(torch.tensor(self.config.beta, dtype=cond.dtype)) + cond.max(-1, keepdim=True).values
            refined = refined.masked_fill(cond < cutoff, float("-inf"))
        out = logits.clone()
        out[:, -1] = refined
        return out


register_method("pai", PAIConfig, PAI, family="autoregressive", needs="nothing")
