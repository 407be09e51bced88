"""Visual attention mass Omega_V and text-to-vision ratio TVR, per decoder layer and head, per step.

For the last query position of every forward call (the prefill's last token, then each generated
token), with scores s_j = q . k_j * scaling over the valid (non-padding) keys j:

    log Z_V = logsumexp_{j visual} s_j,   log Z_T = logsumexp_{j text} s_j
    Omega_V = Z_V / (Z_V + Z_T) = sigmoid(log Z_V - log Z_T),   TVR = Z_T / Z_V = exp(log Z_T - log Z_V)

computed in fp32 log space from the scores; no attention matrix is stored (only log Z_V - log Z_T, a
[B, H] tensor per layer and step). The probe runs as an attention function registered with
transformers' ``AttentionInterface`` (with the matching SDPA mask function in
``AttentionMaskInterface``): it calls the regular SDPA attention, then records. Only the language
model's decoder layers use it, never the vision tower.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..models.arch import arch_info, check_layers, starts_sequence

PROBE_ATTENTION = "keepsight_probe"
_ACTIVE: list[VisualAttentionProbe] = []  # the probe currently recording (innermost last)


def _probe_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                 **kwargs)
    if _ACTIVE:
        _ACTIVE[-1]._record(module, query, key, scaling)
    return out


def _register() -> None:
    AttentionInterface.register(PROBE_ATTENTION, _probe_attention)
    AttentionMaskInterface.register(PROBE_ATTENTION, sdpa_mask)


class VisualAttentionProbe:
    """Context manager recording Omega_V / TVR of ``layers`` (default all) during forward / generate.

    ``log_ratio``: list over steps of [L, B, H] fp32 tensors of log Z_V - log Z_T (steps are forward
    calls: step 0 is the prefill's last position, then one per generated token). ``omega_v()`` and
    ``tvr()`` stack them as [steps, L, B, H].

    Example::

        with VisualAttentionProbe(model) as probe:
            model.generate(**inputs, max_new_tokens=64)
        omega = probe.omega_v()  # [65, L, B, H]
    """

    def __init__(self, model: nn.Module, layers=None):
        self.model = model
        self.info = arch_info(model)
        attention = self.info.attention_layers()
        self.layers = attention if layers is None else check_layers(layers, len(self.info.layers))
        other = sorted(set(self.layers) - set(attention))
        if other:
            raise ValueError(f"decoder layer(s) {other} of this {self.info.model_type} model have no softmax attention "
                             f"(a hybrid stack); the probe reads layers {attention}")
        self._slot = {layer: i for i, layer in enumerate(self.layers)}
        self.log_ratio: list[torch.Tensor] = []
        self._step: list[torch.Tensor | None] = []
        self._visual: torch.Tensor | None = None  # [B, T] bool: keys that are image tokens
        self._valid: torch.Tensor | None = None  # [B, T] bool: keys that are not padding
        self._hook = None
        self._saved_impl = None

    # ------------------------------------------------------------------ context
    def __enter__(self) -> VisualAttentionProbe:
        if any(p.model is self.model for p in _ACTIVE):
            raise ValueError("a VisualAttentionProbe is already recording this model; nested probes on one model would "
                             "miss steps (read every layer you need from one probe)")
        _register()
        cfg = self.info.language_model.config
        self._saved_impl = cfg._attn_implementation
        cfg._attn_implementation = PROBE_ATTENTION
        self._hook = self.model.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        self._flush()
        self.info.language_model.config._attn_implementation = self._saved_impl
        if self._hook is not None:
            self._hook.remove()
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    # ------------------------------------------------------------------ bookkeeping
    def _before_forward(self, module, args, kwargs):
        self._flush()
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            raise ValueError("VisualAttentionProbe needs input_ids (to find the image tokens), got inputs_embeds")
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # "cache" in transformers >= 5.2x
        new_sequence = starts_sequence(cache)
        visual = input_ids == self.info.image_token_id  # [B, T_in]
        if new_sequence:
            if not bool(visual.any(1).all()):
                rows = (~visual.any(1)).nonzero().flatten().tolist()
                raise ValueError(f"no image tokens (id {self.info.image_token_id}) in the prompt of row(s) {rows}; "
                                 "the probe measures attention on visual tokens")
            self._visual = visual
        else:
            self._visual = torch.cat([self._visual, visual], dim=1)
        mask = kwargs.get("attention_mask")
        self._valid = mask.bool() if mask is not None else torch.ones_like(self._visual)
        if self._valid.shape != self._visual.shape:
            raise ValueError(f"attention_mask covers {self._valid.shape[1]} tokens but the probe has seen "
                             f"{self._visual.shape[1]}; use the probe from the start of the sequence")
        self._step = [None] * len(self.layers)

    def _flush(self) -> None:
        if self._step and all(t is not None for t in self._step):
            self.log_ratio.append(torch.stack(self._step))  # [L, B, H]
        self._step = []

    @torch.no_grad()
    def _record(self, module, query: torch.Tensor, key: torch.Tensor, scaling) -> None:
        layer = getattr(module, "layer_idx", None)
        if layer not in self._slot or not self._step:
            return
        # query [B, H, Tq, D], key [B, Hkv, Tk, D] (RoPE applied, GQA not yet expanded)
        q = query[:, :, -1].float()  # [B, H, D]
        b, h, d = q.shape
        k = key.float()  # [B, Hkv, Tk, D]
        kv = k.shape[1]
        scale = scaling if scaling is not None else d**-0.5
        # grouped heads without copying the keys: [B, Hkv, rep, D] x [B, Hkv, Tk, D] -> [B, H, Tk]
        scores = torch.einsum("bgrd,bgtd->bgrt", q.view(b, kv, h // kv, d), k).reshape(b, h, -1) * scale
        if scores.shape[-1] != self._visual.shape[1]:
            raise RuntimeError(f"layer {layer}: {scores.shape[-1]} keys but {self._visual.shape[1]} tracked tokens")
        window = getattr(module, "sliding_window", None)
        if window and scores.shape[-1] > window:  # the layer sees only its window; the mass over all keys would lie
            raise ValueError(f"layer {layer} attends within a sliding window of {window} tokens but the sequence holds "
                             f"{scores.shape[-1]}; probe global layers only or a shorter sequence")
        neg = torch.finfo(scores.dtype).min
        vis = (self._visual & self._valid)[:, None, :]  # [B, 1, Tk]
        txt = (~self._visual & self._valid)[:, None, :]
        log_zv = torch.logsumexp(scores.masked_fill(~vis, neg), dim=-1)  # [B, H]
        log_zt = torch.logsumexp(scores.masked_fill(~txt, neg), dim=-1)
        self._step[self._slot[layer]] = log_zv - log_zt

    # ------------------------------------------------------------------ results
    def _stacked(self) -> torch.Tensor:
        self._flush()
        if not self.log_ratio:
            raise RuntimeError("the probe recorded nothing: run a forward pass or generate() inside it")
        return torch.stack(self.log_ratio)  # [steps, L, B, H]

    def omega_v(self) -> torch.Tensor:
        """[steps, L, B, H] share of softmax mass on visual keys at each step's last query position."""
        return torch.sigmoid(self._stacked())

    def tvr(self) -> torch.Tensor:
        """[steps, L, B, H] text-to-vision ratio Z_T / Z_V."""
        return torch.exp(-self._stacked())
