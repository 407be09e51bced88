"""Attach PVM branches beside the FFN of chosen decoder layers of a Hugging Face VLM, and remove them.

Branches live in ``model.pvm`` (a ``ModuleDict`` keyed by layer index), so every PVM parameter is named
``pvm.<layer>.*`` and no base weight is renamed. Forward hooks add the branch output to the FFN output;
a pre-hook on the language model captures the visual embeddings V on the prefill forward (the rows of
``inputs_embeds`` at image-token positions) and keeps them for every cached decode step, because
transformers drops image inputs after the prefill. In inference (no autograd) each branch projects V once
per sequence (``PVMBranch.project_visual``) and reuses the projection on every decode step; a new sequence
drops it with the old V. In training every forward is a new sequence, so nothing is kept across forwards.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..models.arch import arch_info
from .config import PVMConfig
from .module import PVMBranch

PREFIX = "pvm."


@dataclass
class _State:
    config: PVMConfig
    layers: list[int]
    image_token_id: int
    visual: torch.Tensor | None = None  # [B, M, d] visual embeddings of the current sequence
    visual_mask: torch.Tensor | None = None  # [B, M] bool
    text_mask: torch.Tensor | None = None  # [B, T_in] positions of the current forward that may receive PVM
    input_visual: torch.Tensor | None = None  # [B, T_in] image-token positions of the current forward
    enabled: bool = True
    record_norms: bool = False  # when True, the FFN hooks store norms and retrieval statistics per layer
    norms: dict = field(default_factory=dict)  # layer key -> (sum ||pvm||, sum ||ffn||) at text positions
    retrieval: dict = field(default_factory=dict)  # layer key -> summed retrieval statistics (see retrieval_stats)
    projected: dict = field(default_factory=dict)  # layer key -> PVMBranch.project_visual(visual), inference only
    hooks: list = field(default_factory=list)


def _state(model: nn.Module) -> _State:
    st = getattr(model, "_keepsight_pvm", None)
    if st is None:
        raise ValueError(f"{type(model).__name__} has no PVM attached (use attach_pvm first)")
    return st


def attach_pvm(model: nn.Module, config: PVMConfig | None = None) -> nn.Module:
    """Add PVM branches to ``model`` in place (returns it). The gate starts at 0: outputs are unchanged."""
    if getattr(model, "_keepsight_pvm", None) is not None:
        raise ValueError("PVM is already attached to this model; detach_pvm first")
    config = config or PVMConfig()
    info = arch_info(model)
    layers = config.resolve_layers(len(info.layers))
    hidden = info.language_model.config.hidden_size
    ref = info.lm_head.weight
    model.pvm = nn.ModuleDict({str(i): PVMBranch(hidden, config) for i in layers}).to(ref.device, ref.dtype)
    st = _State(config=config, layers=layers, image_token_id=info.image_token_id)
    model._keepsight_pvm = st
    st.hooks.append(model.register_forward_pre_hook(_top_pre_hook, with_kwargs=True))
    st.hooks.append(info.language_model.register_forward_pre_hook(_make_lm_pre_hook(model), with_kwargs=True))
    for i in layers:
        mlp = info.ffn(i)
        st.hooks.append(mlp.register_forward_hook(_make_ffn_hook(model, str(i))))
    return model


def detach_pvm(model: nn.Module) -> nn.Module:
    """Remove every hook and branch: the model is the base model again."""
    st = _state(model)
    for h in st.hooks:
        h.remove()
    del model.pvm
    model._keepsight_pvm = None
    return model


@contextmanager
def pvm_disabled(model: nn.Module):
    """Run the base model: PVM branches add nothing inside this block (V is still captured)."""
    st = _state(model)
    old, st.enabled = st.enabled, False
    try:
        yield model
    finally:
        st.enabled = old


def pvm_parameters(model: nn.Module):
    """Only the PVM parameters (all named ``pvm.*``)."""
    _state(model)
    return (p for n, p in model.named_parameters() if n.startswith(PREFIX))


@torch.no_grad()
def pvm_report(model: nn.Module, batches) -> dict:
    """Per PVM layer, over ``batches`` (model-input dicts): is the branch contributing, and is it looking things
    up? The gate, mean ||PVM output|| / ||FFN output|| at text positions, the retrieval's mean entropy against
    its maximum ln M (equal: a uniform mean-pool of V) and its query dependence (mean total-variation distance
    between the retrieval distributions of two text positions: 0 = every position retrieves the same)."""
    st = _state(model)
    st.norms, st.retrieval, st.record_norms = {}, {}, True
    try:
        for batch in batches:
            model(**batch)
    finally:
        st.record_norms = False
    out = {}
    for key, branch in model.pvm.items():
        pv, ff = st.norms.get(key, (0.0, 0.0))
        g = branch.gate.detach().float()
        r = st.retrieval.get(key, {})
        n, rows = r.get("positions", 0), r.get("rows", 0)
        out[key] = {"gate_mean": float(g.mean()), "gate_abs_max": float(g.abs().max()),
                    "relative_norm": pv / ff if ff else None,
                    "entropy": r["entropy"] / n if n else None, "max_entropy": r["max_entropy"] / n if n else None,
                    "query_tv": r["query_tv"] / rows if rows else None}
    st.retrieval = {}
    return out


@torch.no_grad()
def retrieval_stats(weights: torch.Tensor, visual_mask: torch.Tensor, text_mask: torch.Tensor,
                    max_positions: int = 128) -> dict:
    """What a branch's retrieval looks at. weights [B, h, T, M] (softmax over the M visual tokens),
    visual_mask [B, M], text_mask [B, T]. Sums over text positions and heads of the entropy and of ln M (its
    maximum, a uniform mean-pool), and over (row, head) of the query dependence: the mean total-variation
    distance between the retrieval distributions of two text positions (0 = every position retrieves the
    same; at most ``max_positions`` positions of a row, evenly spaced, enter the pairs)."""
    w = weights.float()
    out = {"entropy": 0.0, "max_entropy": 0.0, "positions": 0, "query_tv": 0.0, "rows": 0}
    for b in range(w.shape[0]):
        m = int(visual_mask[b].sum())
        pos = text_mask[b].bool().nonzero().flatten()
        if m == 0 or len(pos) == 0:
            continue
        p = w[b][:, pos][..., visual_mask[b]]  # [h, n, m]
        ent = -(p * p.clamp_min(1e-30).log()).sum(-1)  # [h, n]
        out["entropy"] += float(ent.sum())
        out["max_entropy"] += float(ent.numel()) * float(torch.log(torch.tensor(float(m))))
        out["positions"] += ent.numel()
        if len(pos) > 1:
            sel = torch.linspace(0, len(pos) - 1, min(len(pos), max_positions)).long()
            q = p[:, sel]  # [h, n', m]
            tv = 0.5 * torch.cdist(q, q, p=1)  # [h, n', n']
            n = q.shape[1]
            out["query_tv"] += float(tv.sum((1, 2)).div(n * (n - 1)).sum())
            out["rows"] += q.shape[0]
    return out


def pvm_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    _state(model)
    return {n: p.detach() for n, p in model.named_parameters() if n.startswith(PREFIX)}


# ----------------------------------------------------------------------------- hooks


def _top_pre_hook(model, args, kwargs):
    st = model._keepsight_pvm
    input_ids = kwargs.get("input_ids", args[0] if args else None)
    if input_ids is None:
        raise ValueError("PVM needs input_ids to find the image tokens (got inputs_embeds only)")
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    st.input_visual = input_ids == st.image_token_id  # [B, T_in]
    if cache is None or cache.get_seq_length() == 0:
        st.visual = None  # new sequence: the language model's pre-hook captures V
    elif st.visual is None:
        raise RuntimeError("PVM: a cached decode step without a captured prefill; run the prefill with PVM attached")
    elif st.visual.shape[0] != input_ids.shape[0]:
        raise RuntimeError(f"PVM: batch size changed from {st.visual.shape[0]} to {input_ids.shape[0]} mid-sequence")
    st.text_mask = ~st.input_visual if st.config.silence_visual else torch.ones_like(st.input_visual)


def _make_lm_pre_hook(model):
    def hook(lm, args, kwargs):
        st = model._keepsight_pvm
        if st.visual is not None:
            return
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise RuntimeError("PVM: the language model was called without inputs_embeds; unsupported call path")
        vis = st.input_visual  # [B, T]
        if vis.shape != embeds.shape[:2]:
            raise RuntimeError(f"PVM: {tuple(vis.shape)} token ids but inputs_embeds {tuple(embeds.shape[:2])}")
        counts = vis.sum(1)  # [B]
        m = max(int(counts.max()), 1)
        visual = embeds.new_zeros(embeds.shape[0], m, embeds.shape[-1])  # [B, M, d]
        mask = torch.zeros(embeds.shape[0], m, dtype=torch.bool, device=embeds.device)
        for b in range(embeds.shape[0]):
            n = int(counts[b])
            visual[b, :n] = embeds[b, vis[b]]
            mask[b, :n] = True
        st.visual, st.visual_mask = visual, mask
        st.projected = {}  # the projections of the previous sequence's V go with it

    return hook


def _make_ffn_hook(model, key: str):
    def hook(mlp, args, output):
        st = model._keepsight_pvm
        if not st.enabled:
            return output
        x = args[0]  # [B, T, d]: the post-attention-normed hidden state entering the FFN
        text_mask = st.text_mask
        if text_mask.shape != x.shape[:2]:
            raise RuntimeError(f"PVM: FFN input {tuple(x.shape[:2])} but {tuple(text_mask.shape)} tracked tokens")
        branch = model.pvm[key]
        projected = None
        if not torch.is_grad_enabled():  # inference: W_down V (and the keys) once per sequence and layer
            projected = st.projected.get(key)
            if projected is None:
                projected = st.projected[key] = branch.project_visual(st.visual)
        extra, weights = branch(x, st.visual, st.visual_mask, text_mask, projected, return_weights=True)
        if st.record_norms:
            sel = text_mask.bool()
            pv, ff = st.norms.get(key, (0.0, 0.0))
            st.norms[key] = (pv + float(extra[sel].norm(dim=-1).sum()), ff + float(output[sel].norm(dim=-1).sum()))
            stats = retrieval_stats(weights, st.visual_mask, text_mask)
            acc = st.retrieval.setdefault(key, dict.fromkeys(stats, 0.0))
            for k, v in stats.items():
                acc[k] += v
        return output + extra

    return hook
