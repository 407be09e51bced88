"""The model's forwards during OPERA's search: several prompts' beams in one cache (``_Beams``), a candidate's forward
undone (``_CacheMark``) and the last layer's attention read (``_AttentionTap``)."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ...models.arch import arch_info
from .rows import _Row


class _CacheMark:
    """A cache's state, put back after a forward that must leave no trace (a candidate's). Every cache layer's
    attributes are kept by reference: attention layers (full and sliding window) allocate new key / value tensors on
    each update, so a reference is the state. Recurrent layers (Qwen3.5's Gated DeltaNet: conv and recurrent states)
    update theirs in place and no crop undoes that, so those tensors are also cloned and copied back: exact."""

    _IN_PLACE = ("conv_states", "recurrent_states")  # dicts of tensors a linear-attention layer updates in place

    def __init__(self, cache):
        self.layers = []
        for layer in cache.layers:
            attrs = {k: dict(v) if isinstance(v, dict) else v for k, v in vars(layer).items()}
            clones = [(t, t.clone()) for name in self._IN_PLACE if isinstance(attrs.get(name), dict)
                      for t in attrs[name].values() if isinstance(t, torch.Tensor)]
            self.layers.append((layer, attrs, clones))

    def restore(self) -> None:
        for layer, attrs, clones in self.layers:
            vars(layer).update({k: dict(v) if isinstance(v, dict) else v for k, v in attrs.items()})
            for tensor, saved in clones:
                tensor.copy_(saved)


class _AttentionTap:
    """Eager attention in the language model (the original implementation restored on exit) and the last decoder
    layer's attention probabilities of the latest forward (``self.probs`` [K, H, q, kv])."""

    def __init__(self, model):
        info = arch_info(model)
        self.config = info.language_model.config
        self.attn = getattr(info.layers[-1], info.spec.attention)  # the table row's softmax-attention module
        self.probs = None

    def __enter__(self):
        self.saved = self.config._attn_implementation
        self.config._attn_implementation = "eager"
        self.handle = self.attn.register_forward_hook(self._hook)
        return self

    def _hook(self, module, args, output):
        self.probs = output[1]

    def __exit__(self, *exc):
        self.handle.remove()
        self.config._attn_implementation = self.saved


def _repeatable(cache) -> bool:
    """Whether every layer of ``cache`` holds plain key / value tensors that ``batch_repeat_interleave`` repeats (full
    and sliding-window attention); a recurrent layer's states (Qwen3.5's Gated DeltaNet) are not, so there each
    candidate gets its own forward."""
    return all(isinstance(layer, DynamicLayer) for layer in cache.layers)


def _stackable(cache) -> bool:
    """Whether several prompts' beams can share ``cache``: every layer plain full-attention keys / values, which can
    be left-padded to a common length and masked (a sliding window keeps only its last tokens, a recurrent layer
    has no positions to mask)."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _together(model) -> bool:
    """Whether a batch's prompts can decode together on ``model``: its cache can be stacked (``_stackable``) and
    its forward takes the positions (each prompt's own, whatever its padding)."""
    return (_stackable(DynamicCache(config=model.config))
            and "position_ids" in inspect.signature(model.forward).parameters)


def _pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``t`` zero-padded on the left of ``dim`` to ``width``."""
    if t.shape[dim] == width:
        return t
    shape = list(t.shape)
    shape[dim] = width - t.shape[dim]
    return torch.cat([t.new_zeros(shape), t], dim)


class _Beams:
    """The model's forwards for the prompts being decoded: their beams in one cache (prompt ``b``'s beams are rows
    ``b * K`` to ``b * K + K - 1``), each prompt's keys / values left-padded to the longest with the 2-D attention
    mask [rows, keys] saying which are real, and each row's last position (``last``: [rows, 1], or [n, rows, 1] for
    M-RoPE), so a row attends to what it attends to alone, at its own positions. A prompt's prefill and a rollback's
    rebuild run on that prompt alone (its images only) and are spliced in."""

    def __init__(self, model, k: int, st: dict):
        self.model, self.k, self.st = model, k, st
        self.explicit = "position_ids" in inspect.signature(model.forward).parameters
        self.cache = self.mask = self.last = None

    def forward(self, kw: dict, cache) -> torch.Tensor:
        self.st["forwards"] += 1
        out = self.model(**kw, cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()  # [rows, V]

    def prefill(self, row: _Row, ids: torch.Tensor):
        """``ids`` [K, L] (the prompt first) from an empty cache: (logits [K, V], cache, mask, last). Positions as
        Hugging Face's generate gives them (M-RoPE's from the image grids)."""
        cache = DynamicCache(config=self.model.config)
        kw = {**row.prefill_kwargs(ids), "attention_mask": torch.ones_like(ids)}
        last = None
        if self.explicit:
            pos = self.model._prepare_position_ids_for_generation(ids, {k: v for k, v in kw.items() if k != "input_ids"})
            kw["position_ids"], last = pos, pos[..., -1:]
        return self.forward(kw, cache), cache, kw["attention_mask"], last

    def run(self, ids: torch.Tensor, cache, mask: torch.Tensor, last):
        """``ids`` [rows, q] after what ``cache`` holds: (logits [rows, V], the mask and last positions with them)."""
        mask = torch.cat([mask, mask.new_ones(ids.shape)], -1)
        kw = {"input_ids": ids, "attention_mask": mask}
        if last is not None:
            kw["position_ids"] = last + torch.arange(1, ids.shape[1] + 1, device=ids.device)
            last = kw["position_ids"][..., -1:]
        return self.forward(kw, cache), mask, last

    def rebuild(self, row: _Row, ids: torch.Tensor, visual_ids: torch.Tensor):
        """U:3497-3535: a prompt's cache from scratch (all of ``ids`` [K, L] but the last token, then the last):
        (logits [K, V], cache, mask, last). A generated id equal to an image placeholder is a text token (the release
        embeds the generated ids; HF's processors would read it as an image): the prompt, then the rest."""
        P = row.length
        if bool(torch.isin(ids[:, P:-1], visual_ids).any()):
            _, cache, mask, last = self.prefill(row, ids[:, :P])
            if ids.shape[1] - 1 > P:
                _, mask, last = self.run(ids[:, P:-1], cache, mask, last)
        else:
            _, cache, mask, last = self.prefill(row, ids[:, :-1])
        logits, mask, last = self.run(ids[:, -1:], cache, mask, last)
        return logits, cache, mask, last

    def stack(self, parts: list) -> None:
        """The prompts' (cache, mask, last), in order, as the one batch."""
        if len(parts) == 1:
            self.cache, self.mask, self.last = parts[0]
            return
        width = max(mask.shape[1] for _, mask, _ in parts)
        self.cache = DynamicCache(config=self.model.config)
        for i, layer in enumerate(self.cache.layers):
            layer.update(torch.cat([_pad_left(c.layers[i].keys, width, 2) for c, _, _ in parts]),
                         torch.cat([_pad_left(c.layers[i].values, width, 2) for c, _, _ in parts]))
        self.mask = torch.cat([_pad_left(mask, width, 1) for _, mask, _ in parts])
        self.last = None if parts[0][2] is None else torch.cat([last for _, _, last in parts], -2)

    def splice(self, b: int, part) -> None:
        """Prompt ``b``'s beams replaced by ``part`` (a rebuild's cache, mask, last)."""
        cache, mask, last = part
        if self.mask.shape[0] == self.k:
            self.cache, self.mask, self.last = part
            return
        rows = slice(b * self.k, (b + 1) * self.k)
        width = self.mask.shape[1]  # a rebuild holds a prefix of what the prompt's rows hold: never wider

        def put(whole, own, dim):
            return torch.cat([whole[: rows.start], _pad_left(own, width, dim), whole[rows.stop:]])

        for layer, own in zip(self.cache.layers, cache.layers):
            layer.keys, layer.values = put(layer.keys, own.keys, 2), put(layer.values, own.values, 2)
        self.mask = put(self.mask, mask, 1)
        if last is not None:
            self.last = torch.cat([self.last[..., : rows.start, :], last, self.last[..., rows.stop:, :]], -2)

    def select(self, index: torch.Tensor) -> None:
        """Keep the rows ``index`` (each prompt's beams reordered, finished prompts dropped), and drop the key
        columns that are padding in every row left."""
        self.cache.reorder_cache(index)
        self.mask = self.mask[index]
        if self.last is not None:
            self.last = self.last.index_select(-2, index)
        unused = int(self.mask.eq(0).all(0).long().cumprod(0).sum())  # leading columns no row attends to
        if unused and _stackable(self.cache):
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, unused:], layer.values[:, :, unused:]
            self.mask = self.mask[:, unused:]

    def pads(self) -> list[int]:
        """Each prompt's padding columns on the left of the cache."""
        return self.mask[:: self.k].eq(0).sum(-1).tolist()

    def feed(self, ids: torch.Tensor) -> torch.Tensor:
        """Every row's fed token ``ids`` [rows, 1] appended: the logits [rows, V]."""
        logits, self.mask, self.last = self.run(ids, self.cache, self.mask, self.last)
        return logits

    def peek(self, ids: torch.Tensor, m: int) -> None:
        """A forward of ``ids`` [rows * m, 1] (row ``r``'s ``m`` candidates at rows ``r * m ..``) on the cache
        repeated ``m`` times; the caller restores the cache."""
        if m > 1:
            self.cache.batch_repeat_interleave(m)
        last = None if self.last is None else self.last.repeat_interleave(m, dim=-2)
        self.run(ids, self.cache, self.mask.repeat_interleave(m, 0), last)
