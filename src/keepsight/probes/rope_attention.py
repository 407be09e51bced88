"""Where generation slots of a masked-diffusion model attend, by relative distance and RoPE frequency band
(the analysis behind Monotonic RoPE Scaling; the paper's Fig. 3 and 7b).

``RoPEAttentionProbe`` hooks the self-attention modules of the decoder stack and, at every forward (one per
sampler step), recomputes the attention of the *generation slots* (columns >= ``gen_start``) from the
module's own q/k projections and the ``(cos, sin)`` it is given - so it sees whatever MRS, NTK or YaRN
did to the rotary embedding - without touching the model's output. Per layer it accumulates:

Queries are the still-masked generation slots by default (``queries="masked"``: the slots whose tokens
the step predicts) or every generation slot (``queries="all"``, committed ones included).

- attention mass per step from the query slots to four key kinds: ``visual`` (image tokens), ``mask``
  (still-masked slots other than the query itself), ``generated`` (committed slots, not the query) and
  ``prompt`` (other prompt tokens), plus ``self`` (the slot itself; the five sum to 1), averaged over
  slots, heads and rows;
- a distance profile for ``visual`` and ``mask`` keys: the mean attention weight one key of that kind gets
  from a query slot at relative distance ``|i - j|`` (column distance; bin b holds distances
  ``b * bin_width + 1 .. (b + 1) * bin_width``), and each RoPE frequency band's share of the summed
  absolute band logits ``|q_band . k_band| * scaling`` at that distance. The D/2 rotary pairs are split
  into ``n_bands`` equal bands, band 0 holding the highest frequencies (pair 0); the logit
  ``q.k * scaling`` is the sum of the bands' signed parts exactly.

Models: bidirectional LLaMA-style attention (Llada, LLaDA-V) - q/k from ``q_proj`` / ``k_proj``, RoPE, no
q/k norms. Causal attention or attention with ``q_norm`` / ``k_norm`` (Qwen3) is refused: the recomputed
weights would not be the model's.

Column distance equals RoPE distance when ``position_ids`` are ``0..T-1`` (the sampler's default).
Attention is recomputed in fp32 for the generation rows only: ``[B, H, G, T]`` per layer and forward.
"""

from __future__ import annotations

import torch

from ..models.arch import check_layers, decoder_stack
from ..ops.rope import apply_rotary

KINDS = ("visual", "mask", "generated", "prompt", "self")
PROFILE_KINDS = ("visual", "mask")


class RoPEAttentionProbe:
    """``with RoPEAttentionProbe(model, gen_start=P, mask_token_id=m) as probe: generate(...)``; then
    ``probe.result()``. ``model`` is a LLaDA-V-style VLM (or a bare Llada LM) called with ``input_ids``
    (and an optional ``[B, T]`` padding ``attention_mask``) at every forward."""

    def __init__(self, model: torch.nn.Module, *, gen_start: int, mask_token_id: int,
                 image_token_id: int | None = None, layers: list[int] | None = None, n_bands: int = 3,
                 bin_width: int = 8, queries: str = "masked"):
        stack = decoder_stack(model)
        n_layers = len(stack.layers)
        self.layers = check_layers(layers, n_layers)
        attn = stack.layers[0].self_attn
        for name in ("q_proj", "k_proj", "head_dim", "scaling"):
            if not hasattr(attn, name):
                raise TypeError(f"{type(attn).__name__} has no {name!r}: RoPEAttentionProbe needs LLaMA-style attention")
        if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
            raise TypeError(f"{type(attn).__name__} normalises q / k before RoPE; RoPEAttentionProbe recomputes "
                            "LLaMA-style q / k only")
        if getattr(attn, "is_causal", False):
            raise TypeError(f"{type(attn).__name__} is causal; RoPEAttentionProbe measures bidirectional "
                            "(masked-diffusion) attention")
        if queries not in ("masked", "all"):
            raise ValueError(f"queries must be 'masked' or 'all', got {queries!r}")
        half = attn.head_dim // 2
        if not 1 <= n_bands <= half:
            raise ValueError(f"n_bands must be in [1, {half}] (rotary pairs per head), got {n_bands}")
        if bin_width < 1:
            raise ValueError(f"bin_width must be >= 1, got {bin_width}")
        if gen_start < 1:
            raise ValueError(f"gen_start must be >= 1 (a prompt precedes the generation slots), got {gen_start}")
        if image_token_id is None:
            cfg = getattr(model, "config", None)
            image_token_id = getattr(cfg, "image_token_id", getattr(cfg, "image_token_index", None))
        self.model, self.stack = model, stack
        self.gen_start, self.mask_token_id, self.image_token_id = gen_start, mask_token_id, image_token_id
        self.n_bands, self.bin_width, self.half, self.queries = n_bands, bin_width, half, queries
        # band of each rotary pair: [D/2] -> 0 (highest frequencies) .. n_bands - 1 (lowest)
        self.pair_band = torch.arange(half) * n_bands // half
        self._handles: list = []
        self.reset()

    def reset(self) -> None:
        self.steps: list[torch.Tensor] = []  # per forward: [L, 5] mass per key kind (KINDS)
        self._step: torch.Tensor | None = None
        self._ids: torch.Tensor | None = None
        self._pad: torch.Tensor | None = None
        L = len(self.layers)
        self._prob = dict.fromkeys(PROFILE_KINDS)  # kind -> [L, bins] summed attention weight
        self._count = dict.fromkeys(PROFILE_KINDS)  # kind -> [L, bins] number of (row, head, query, key)
        self._band = dict.fromkeys(PROFILE_KINDS)  # kind -> [L, n_bands, bins] summed |band logit|
        self._L = L

    # ------------------------------------------------------------------ hooks

    def __enter__(self):
        self.reset()
        self._handles.append(self.model.register_forward_pre_hook(self._grab, with_kwargs=True))
        self._handles.append(self.model.register_forward_hook(self._close_step))
        for slot, li in enumerate(self.layers):
            attn = self.stack.layers[li].self_attn
            self._handles.append(attn.register_forward_pre_hook(self._make_hook(slot), with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return False

    def _grab(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise RuntimeError("RoPEAttentionProbe needs input_ids on the model's forward (got inputs_embeds only)")
        if ids.shape[1] <= self.gen_start:
            raise ValueError(f"gen_start {self.gen_start} is not inside a sequence of {ids.shape[1]} tokens")
        mask = kwargs.get("attention_mask")
        self._ids = ids
        self._pad = None if mask is None or mask.dim() != 2 else mask.bool()
        self._step = torch.zeros(self._L, len(KINDS), dtype=torch.float64)

    def _close_step(self, module, args, output):
        if self._step is not None:
            self.steps.append(self._step)
        self._step, self._ids, self._pad = None, None, None

    def _make_hook(self, slot: int):
        def hook(module, args, kwargs):
            if self._step is None:  # a forward that did not enter through ``model`` (e.g. the stack alone)
                return
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            cos, sin = kwargs["position_embeddings"]
            with torch.no_grad():
                self._record(slot, module, hidden, cos, sin)

        return hook

    # ------------------------------------------------------------------ accumulation

    def _record(self, slot: int, attn, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        B, T, _ = hidden.shape
        D, P = attn.head_dim, self.gen_start
        q = attn.q_proj(hidden).view(B, T, -1, D).transpose(1, 2).float()  # [B, H, T, D]
        k = attn.k_proj(hidden).view(B, T, -1, D).transpose(1, 2).float()  # [B, Hkv, T, D]
        q, k = apply_rotary(q, cos.float(), sin.float()), apply_rotary(k, cos.float(), sin.float())
        q = q[:, :, P:]  # [B, H, G, D]: generation slots only
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # [B, H, T, D] (GQA)
        G = T - P
        logits = q @ k.transpose(-1, -2) * attn.scaling  # [B, H, G, T]
        valid = torch.ones(B, T, dtype=torch.bool, device=hidden.device) if self._pad is None else self._pad
        logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
        prob = logits.softmax(-1)  # [B, H, G, T]

        ids = self._ids.to(hidden.device)
        col = torch.arange(T, device=hidden.device)
        qcol = col[P:]  # [G]
        not_self = qcol[:, None] != col[None, :]  # [G, T]
        gen_key = (col >= P)[None, :]  # [1, T]
        visual = ids == self.image_token_id if self.image_token_id is not None else torch.zeros_like(ids, dtype=torch.bool)
        is_mask = (ids == self.mask_token_id) & gen_key  # [B, T]
        kinds = {
            "visual": visual[:, None, :] & valid[:, None, :],
            "mask": is_mask[:, None, :] & not_self[None],
            "generated": (gen_key & ~is_mask & valid)[:, None, :] & not_self[None],
            "prompt": (~gen_key & ~visual & valid)[:, None, :].expand(B, 1, T),
            "self": ~not_self[None],
        }  # kind -> [B, G|1, T] key selection per query row
        qvalid = valid[:, P:]  # [B, G] query slots
        if self.queries == "masked":
            qvalid = qvalid & is_mask[:, P:]
        n_q = qvalid.sum() * prob.shape[1]  # (row, query) pairs x heads
        if n_q == 0:  # nothing left to predict in this forward
            self._step[slot] = float("nan")
            return
        for j, kind in enumerate(KINDS):
            w = (kinds[kind] & qvalid[:, :, None]).float()  # [B, G, T]
            self._step[slot, j] = float((prob * w[:, None]).sum() / n_q)

        dist = (qcol[:, None] - col[None, :]).abs()  # [G, T]
        n_bins = (T - 1) // self.bin_width + 1
        bins = ((dist - 1).clamp(min=0) // self.bin_width).flatten()  # [G*T]
        band_dims = torch.cat([self.pair_band, self.pair_band]).to(hidden.device)  # [D] band of each dim
        band_logits = torch.stack([  # [n_bands, B, H, G, T]
            (q * (band_dims == b)) @ k.transpose(-1, -2) * attn.scaling for b in range(self.n_bands)])
        for kind in PROFILE_KINDS:
            w = (kinds[kind] & qvalid[:, :, None]).expand(B, G, T).float()  # [B, G, T]
            heads = prob.shape[1]
            sums = {
                "prob": (prob * w[:, None]).sum((0, 1)).flatten(),  # [G*T]
                "count": (w.sum(0) * heads).flatten(),
            }
            band = (band_logits.abs() * w[None, :, None]).sum((1, 2)).flatten(1)  # [n_bands, G*T]
            # accumulate on the CPU in float64 (inputs may live on a GPU, where float64 may not exist)
            idx = bins.cpu()
            prob_b = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, idx, sums["prob"].cpu().double())
            count_b = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, idx, sums["count"].cpu().double())
            band_b = torch.zeros(self.n_bands, n_bins, dtype=torch.float64).index_add_(1, idx, band.cpu().double())
            self._prob[kind] = _grow_add(self._prob[kind], prob_b, slot, self._L)
            self._count[kind] = _grow_add(self._count[kind], count_b, slot, self._L)
            self._band[kind] = _grow_add(self._band[kind], band_b, slot, self._L)

    # ------------------------------------------------------------------ results

    def result(self) -> dict:
        """Plain lists (JSON-ready). ``mass_per_step[kind]``: per forward, the mean over layers of the
        attention mass the query slots give that key kind. ``profile[kind]``: per distance bin (``bins``
        holds each bin's first distance) the mean attention weight per key (``attention``, mean over
        layers), the number of (row, head, query, key) samples, and ``band_share`` - each band's share of
        the summed |logit contribution| (band 0 = highest frequencies). ``per_layer`` keeps the same
        per layer."""
        if not self.steps:
            raise RuntimeError("RoPEAttentionProbe saw no forward pass")
        steps = torch.stack(self.steps)  # [S, L, 5]
        out = {"layers": self.layers, "n_bands": self.n_bands, "bin_width": self.bin_width,
               "gen_start": self.gen_start, "queries": self.queries, "n_forwards": len(self.steps),
               # a forward with no query slot left records NaN: None per step, skipped in the mean
               "mass_per_step": {k: [None if v != v else v for v in steps[:, :, j].mean(1).tolist()]
                                 for j, k in enumerate(KINDS)},
               "mass": {k: float(steps[:, :, j].nanmean()) for j, k in enumerate(KINDS)},
               "profile": {}, "per_layer": {}}
        for kind in PROFILE_KINDS:
            count, prob, band = self._count[kind], self._prob[kind], self._band[kind]  # [L, n], [L, n], [L, nb, n]
            if count is None:
                continue
            keep = count.sum(0) > 0  # bins with samples
            first = (torch.arange(count.shape[1]) * self.bin_width + 1)[keep]
            mean_prob = prob / count.clamp(min=1)  # [L, n]
            band_tot = band.sum(1, keepdim=True).clamp(min=1e-30)
            share = band / band_tot  # [L, nb, n]
            pooled_share = band.sum(0) / band.sum((0, 1)).clamp(min=1e-30)  # [nb, n]
            out["profile"][kind] = {
                "bins": first.tolist(),
                "attention": mean_prob.mean(0)[keep].tolist(),
                "samples": count.sum(0)[keep].tolist(),
                "band_share": pooled_share[:, keep].tolist(),
                "band_share_all": (band.sum((0, 2)) / band.sum().clamp(min=1e-30)).tolist(),
            }
            out["per_layer"][kind] = {"attention": mean_prob[:, keep].tolist(), "band_share": share[:, :, keep].tolist()}
        return out


def _grow_add(acc: torch.Tensor | None, new: torch.Tensor, slot: int, n_layers: int) -> torch.Tensor:
    """Add ``new [..., n]`` into ``acc[slot] [L, ..., m]``, widening the bin axis when n > m."""
    if acc is None:
        acc = torch.zeros(n_layers, *new.shape, dtype=torch.float64)
    if new.shape[-1] > acc.shape[-1]:
        pad = torch.zeros(*acc.shape[:-1], new.shape[-1] - acc.shape[-1], dtype=torch.float64)
        acc = torch.cat([acc, pad], dim=-1)
    acc[slot, ..., : new.shape[-1]] += new
    return acc
