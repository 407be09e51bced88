"""Attach PVM blocks beside the FFN of chosen decoder layers of a Hugging Face VLM, and remove them.

Blocks live in ``model.pvm`` (a ``ModuleDict`` keyed by layer index), so every PVM parameter is named
``pvm.<layer>.*`` and no base weight is renamed; they are kept in fp32 (master weights) under a bf16 / fp16
backbone unless ``PVMConfig.master_dtype="model"``. Forward hooks add each block's update to its layer's FFN
output; the released block's query is the input of the layer's post-attention norm (the residual stream after
self-attention: a pre-hook keeps it), our earlier branch's (``keepsight.pvm.readings``) the FFN's own input.

The visual memory V (the rows of ``inputs_embeds`` at image / video positions) is captured on a sequence's first
forward by a pre-hook on the language model. It lives with the generation's state, not on the model: a forward
that returns a KV cache carries V, its mask and each block's projection of V (computed once per sequence) on that
cache object, and the cached decode steps read them from the cache they are given. Rows of a left-padded batch
keep their own V; beam search keeps the rows of one example together, so the rows it reorders share their V.
Without a cache (training, ``use_cache=False``) every forward is a new sequence.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..models.arch import arch_info, check_method, starts_sequence
from .block import PVMMemoryBlock, visual_masks
from .config import PVMConfig
from .readings import PVMBranch

PREFIX = "pvm."
MEMORY = "_keepsight_pvm_memory"  # the attribute of a generation's KV cache that holds its visual memory


@dataclass
class Memory:
    """One sequence batch's visual memory."""

    visual: torch.Tensor  # [B, M, d] visual embeddings (padded per row)
    visual_mask: torch.Tensor  # [B, M] bool
    projected: dict = field(default_factory=dict)  # layer key -> block.project_visual(visual), inference only
    masks: dict = field(default_factory=dict)  # dtype -> visual_masks(visual_mask, dtype), inference only


@dataclass
class _State:
    config: PVMConfig
    layers: list[int]
    visual_ids: tuple[int, ...]
    memory: Memory | None = None  # the last forward's visual memory (from its cache, or captured)
    text_mask: torch.Tensor | None = None  # [B, T_in] positions of the current forward that may receive PVM
    text_all: bool | None = None  # whether text_mask is all true (read once per inference forward; None: not yet)
    input_visual: torch.Tensor | None = None  # [B, T_in] visual positions of the current forward
    queries: dict = field(default_factory=dict)  # layer key -> the released block's query of the current forward
    enabled: bool = True
    suffix_from: int | None = None  # layers from here may run on the last positions only (Gemma 4's KV-shared ones)
    record_norms: bool = False  # when True, the FFN hooks store norms and retrieval statistics per layer
    norms: dict = field(default_factory=dict)  # layer key -> (sum ||pvm||, sum ||ffn||) at text positions
    retrieval: dict = field(default_factory=dict)  # layer key -> summed retrieval statistics (see retrieval_stats)
    hooks: list = field(default_factory=list)
    id_tensors: dict = field(default_factory=dict)  # device -> visual_ids as a tensor (made once, not every forward)

    def visual_id_tensor(self, device) -> torch.Tensor:
        ids = self.id_tensors.get(device)
        if ids is None:
            ids = self.id_tensors[device] = torch.tensor(self.visual_ids, device=device)
        return ids


def _state(model: nn.Module) -> _State:
    st = getattr(model, "_keepsight_pvm", None)
    if st is None:
        raise ValueError(f"{type(model).__name__} has no PVM attached (use attach_pvm first)")
    return st


def build_block(text_config, config: PVMConfig) -> nn.Module:
    """One PVM block for a backbone whose text config is ``text_config``: the released block, or the branch of our
    earlier reading for its ``BranchConfig``."""
    if config.variant == "released":
        return PVMMemoryBlock(text_config, config)
    return PVMBranch(text_config.hidden_size, config)


def attach_pvm(model: nn.Module, config: PVMConfig | None = None) -> nn.Module:
    """Add PVM blocks to ``model`` in place (returns it). The gate starts at 0: outputs are unchanged."""
    if getattr(model, "_keepsight_pvm", None) is not None:
        raise ValueError("this model already carries PVM blocks (a released-layout PVM checkpoint, or an adapter "
                         "attached before): give its base model instead, or, from Python, detach_pvm first")
    if config is not None and not isinstance(config, PVMConfig):
        raise ValueError(f"config must be a PVMConfig (or None for the defaults), got {type(config).__name__}")
    config = config or PVMConfig()
    info = arch_info(model)
    check_method(model, "pvm")
    layers = config.resolve_layers(len(info.layers))
    ref = info.lm_head.weight
    dtype = torch.float32 if config.master_dtype == "float32" else ref.dtype
    model.pvm = nn.ModuleDict({str(i): build_block(info.layer_config(i), config) for i in layers}).to(
        ref.device, dtype)
    # Gemma 4 runs its KV-shared layers (the last num_kv_shared_layers) on the last logits_to_keep positions only at
    # prefill (what generate asks for): their FFN sees a suffix of the positions PVM tracks
    shared = getattr(info.language_model.config, "num_kv_shared_layers", 0) or 0
    st = _State(config=config, layers=layers, visual_ids=info.visual_token_ids,
                suffix_from=len(info.layers) - shared if shared else None)
    model._keepsight_pvm = st
    st.hooks.append(model.register_forward_pre_hook(_top_pre_hook, with_kwargs=True))
    st.hooks.append(model.register_forward_hook(_top_hook))
    st.hooks.append(info.language_model.register_forward_pre_hook(_make_lm_pre_hook(model), with_kwargs=True))
    for i in layers:
        # the query: the residual stream after self-attention (released) or the FFN's input (branch)
        source = info.pvm_query(i) if config.variant == "released" else info.ffn(i)
        st.hooks.append(source.register_forward_pre_hook(_make_query_hook(model, str(i))))
        st.hooks.append(info.pvm_update(i).register_forward_hook(_make_ffn_hook(model, str(i))))
    return model


def pvm_memory(cache) -> Memory | None:
    """The visual memory a generation's KV cache carries (None when PVM captured none on it)."""
    return getattr(cache, MEMORY, None)


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
def gate_report(model: nn.Module, batches) -> dict:
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
        g = branch.gate.detach().float()  # the branch's lambda, the released block's gate_alpha
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
    st.input_visual = torch.isin(input_ids, st.visual_id_tensor(input_ids.device))  # [B, T_in]
    st.queries = {}
    if starts_sequence(cache):
        st.memory = None  # a new sequence: the language model's pre-hook captures V
    else:
        st.memory = pvm_memory(cache)
        if st.memory is None:
            raise RuntimeError("PVM: a cached decode step on a cache whose prefill ran without PVM attached")
        if st.memory.visual.shape[0] != input_ids.shape[0]:
            raise RuntimeError(f"PVM: batch size changed from {st.memory.visual.shape[0]} to {input_ids.shape[0]} "
                               "mid-sequence")
    st.text_mask = ~st.input_visual if st.config.silence_visual else torch.ones_like(st.input_visual)
    st.text_all = None


def _top_hook(model, args, output):
    """After the forward: the returned KV cache carries the sequence's visual memory (the decode steps read it from
    there; what the model keeps is only the last forward's, for a backward pass that recomputes layers)."""
    st = model._keepsight_pvm
    cache = getattr(output, "past_key_values", None)
    if cache is not None and st.memory is not None and pvm_memory(cache) is None:
        setattr(cache, MEMORY, st.memory)
    return output


def _make_lm_pre_hook(model):
    def hook(lm, args, kwargs):
        st = model._keepsight_pvm
        if st.memory is not None:
            return
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise RuntimeError("PVM: the language model was called without inputs_embeds; unsupported call path")
        vis = st.input_visual  # [B, T]
        if vis is None or vis.shape != embeds.shape[:2]:
            raise RuntimeError(f"PVM: {None if vis is None else tuple(vis.shape)} token ids but inputs_embeds "
                               f"{tuple(embeds.shape[:2])}")
        counts = vis.sum(1)  # [B]
        m = max(int(counts.max()), 1)
        visual = embeds.new_zeros(embeds.shape[0], m, embeds.shape[-1])  # [B, M, d]
        mask = torch.zeros(embeds.shape[0], m, dtype=torch.bool, device=embeds.device)
        for b in range(embeds.shape[0]):
            n = int(counts[b])
            visual[b, :n] = embeds[b, vis[b]]
            mask[b, :n] = True
        st.memory = Memory(visual, mask)

    return hook


def _make_query_hook(model, key: str):
    def hook(norm, args):
        model._keepsight_pvm.queries[key] = args[0]  # [B, T, d]

    return hook


def _make_ffn_hook(model, key: str):
    def hook(mlp, args, output):
        st = model._keepsight_pvm
        if not st.enabled:
            return output
        query = st.queries.pop(key)  # [B, T, d]
        text_mask, mem = st.text_mask, st.memory
        if text_mask is None or mem is None:
            raise RuntimeError("PVM: the FFN ran outside a forward of the model PVM is attached to")
        if text_mask.shape != query.shape[:2]:
            suffix = (st.suffix_from is not None and int(key) >= st.suffix_from
                      and text_mask.shape[0] == query.shape[0] and query.shape[1] < text_mask.shape[1])
            if not suffix:
                raise RuntimeError(f"PVM: FFN input {tuple(query.shape[:2])} but {tuple(text_mask.shape)} tracked "
                                   "tokens")
            text_mask = text_mask[:, -query.shape[1]:]  # a KV-shared layer's positions: the last ones
        block = model.pvm[key]
        projected, extra_kwargs, given = None, {}, text_mask
        if st.config.cache_visual and not torch.is_grad_enabled():  # inference: the visual side once per sequence
            projected = mem.projected.get(key)
            if projected is None:
                projected = mem.projected[key] = block.project_visual(mem.visual)
            if isinstance(block, PVMMemoryBlock):  # its mask-derived bias and rows, once per request and dtype
                dtype = block.text_reducer.weight.dtype
                masks = mem.masks.get(dtype)
                if masks is None:
                    masks = mem.masks[dtype] = visual_masks(mem.visual_mask, dtype, drop_trivial=True)
                extra_kwargs["masks"] = masks
                if st.text_all is None:  # once per forward: every position may receive PVM (decoding: the usual)
                    st.text_all = bool(st.text_mask.all())
                if st.text_all:
                    given = None  # no multiply by ones (the same bits)
        extra, weights = block(query, mem.visual, mem.visual_mask, given, projected, return_weights=True,
                               **extra_kwargs)
        if st.record_norms:
            sel = text_mask.bool()
            pv, ff = st.norms.get(key, (0.0, 0.0))
            st.norms[key] = (pv + float(extra[sel].float().norm(dim=-1).sum()),
                             ff + float(output[sel].float().norm(dim=-1).sum()))
            stats = retrieval_stats(weights, mem.visual_mask, text_mask)
            acc = st.retrieval.setdefault(key, dict.fromkeys(stats, 0.0))
            for k, v in stats.items():
                acc[k] += v
        return output + extra

    return hook
