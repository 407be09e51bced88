"""Mask Prior Suppression (MPS): remove part of the mask prior from the hidden states of still-masked slots.

As released (github.com/hong-sujung/MPD-PAC, ``init_prior_lastlayer_subspace_from_32layers`` and the update in
``generate_with_embeds``; ``variant="released"``, the default):

- fit, once per model: the mean of *every* input-embedding row goes through the model as a one-token sequence
  (position 0); its hidden states after decoder layers 1 .. L-1 and the final norm's output (transformers'
  ``hidden_states[1:]``: L rows) are stacked, ``mu`` is their mean, ``V_k [d, k]`` the top-k right singular vectors
  of the centred stack (k clamped to the rank bound min(L, d)), and ``u [k] = normalize((h_L - mu) V_k)`` with
  ``h_L`` the last (final-normed) row;
- apply, at every forward, on the final norm's output (the LM head's input) at still-masked slots:
  ``z = (h - mu) V_k``, ``a = lam * clamp(cos(z, u), 0, 1)`` (``cos = z.u / (|z| + 1e-6)``), and
  ``h <- h - a * (z.u) V_k u``: a cosine-gated removal of one direction inside the subspace. The logits follow from
  the new h. ``lam = 0`` leaves every logit bit-identical.

Our earlier reading, ``variant="projection"``. Fit (once per model): a prior embedding ``e [d]`` (``prior="vocab_mean"``: mean input-embedding row of
the real vocabulary, special tokens excluded; ``"topk"``: mean embedding of the ``n_prior_tokens`` most
frequent tokens when ``token_frequencies`` are given, else of the tokens the model ranks highest for a
lone mask token) goes through the text decoder as a length-1 sequence (position 0, so RoPE is the
identity); ``h_l [d]`` is the output of decoder layer l (before the final norm), l = 1..L;
``mu = mean_l h_l``; the top-k right singular vectors of ``[h_l - mu]_l`` (an ``[L, d]`` matrix) form
``U [d, k]``. ``prior="random"`` (the paper's ablation): U is an orthonormalised Gaussian ``[d, k]`` and
mu = 0. Components beyond the rank of the centred matrix (at most L - 1) are arbitrary completions; a
warning says so.

Apply (our reading; the paper gives no formula): a forward hook on each chosen decoder layer (default
the final one, before the final norm) replaces ``h [B, T, d]`` by ``h - lam * U U^T h`` (``center=True``:
``h - lam * U U^T (h - mu)``) at the positions that hold the mask token in the ``input_ids`` of that
forward (read by a pre-hook on the model given to ``apply``), or at ``mask_positions`` (``[B, T]`` bool or
a callable ``input_ids -> [B, T]``). Other positions are untouched; ``lam = 0`` is bit-identical.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..methods import register_method
from ..models.arch import check_layers, decoder_stack
from .config import PRIORS, MPSConfig  # noqa: F401  (PRIORS: the prior-direction names, re-exported)
from .sampler import resolve_mask_token_id


def special_token_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


def real_vocab_ids(tokenizer, vocab_rows: int) -> torch.Tensor:
    """Ids of ordinary tokens: below ``min(len(tokenizer), vocab_rows)``, special tokens excluded."""
    n = min(len(tokenizer), vocab_rows)
    special = special_token_ids(tokenizer)
    ids = [i for i in range(n) if i not in special]
    if not ids:
        raise ValueError("the tokenizer has no ordinary (non-special) tokens")
    return torch.tensor(ids)


@torch.no_grad()
def layer_states(model: torch.nn.Module, embedding: torch.Tensor) -> torch.Tensor:
    """Outputs of every decoder layer for ``embedding [d]`` fed alone at position 0: ``[L, d]`` float32."""
    stack = decoder_stack(model)
    p = next(stack.parameters())
    collected: list[torch.Tensor] = []

    def keep(module, args, out):
        collected.append((out[0] if isinstance(out, tuple) else out)[0, 0])  # [d]

    handles = [layer.register_forward_hook(keep) for layer in stack.layers]
    try:
        stack(inputs_embeds=embedding.to(p.device, p.dtype)[None, None], use_cache=False)  # [1, 1, d]
    finally:
        for h in handles:
            h.remove()
    return torch.stack(collected).float()  # [L, d]


@torch.no_grad()
def released_states(model: torch.nn.Module, embedding: torch.Tensor) -> torch.Tensor:
    """``[L, d]`` float32: for ``embedding [d]`` fed alone at position 0, the outputs of decoder layers 1 .. L-1 and
    the final norm's output (transformers' ``hidden_states[1:]``, what the released MPS stacks)."""
    stack = decoder_stack(model)
    p = next(stack.parameters())
    collected: list[torch.Tensor] = []

    def keep(module, args, out):
        collected.append((out[0] if isinstance(out, tuple) else out)[0, 0])  # [d]

    handles = [layer.register_forward_hook(keep) for layer in stack.layers[:-1]]
    handles.append(stack.norm.register_forward_hook(keep))
    try:
        stack(inputs_embeds=embedding.to(p.device, p.dtype)[None, None], use_cache=False)  # [1, 1, d]
    finally:
        for h in handles:
            h.remove()
    return torch.stack(collected).float()  # [L, d]


def prior_cosine(hidden: torch.Tensor, U: torch.Tensor, mu: torch.Tensor | None = None) -> torch.Tensor:
    """``||U U^T h|| / ||h||`` per vector (``h - mu`` when mu is given): ``[..., d] -> [...]``."""
    h = hidden.float() - (mu.float().to(hidden.device) if mu is not None else 0.0)
    proj = (h @ U.to(h.device)) @ U.to(h.device).T  # [..., d]
    return proj.norm(dim=-1) / h.norm(dim=-1).clamp_min(1e-12)


class MaskPriorSuppression:
    """See the module docstring. ``fit`` then ``with mps.apply(model): ...``."""

    def __init__(self, config: MPSConfig | None = None, *, cache_dir: str | Path | None = None, **settings):
        """``config`` (default ``MPSConfig()``, the paper's settings) with ``settings`` (its fields) overriding;
        ``cache_dir``: where fitted subspaces are kept, keyed by a model fingerprint."""
        base = config if config is not None else MPSConfig()
        try:
            self.config = dataclasses.replace(base, **settings)
        except TypeError as e:
            raise ValueError(f"MaskPriorSuppression: {e}") from None
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.U: torch.Tensor | None = None  # [d, k]
        self.mu: torch.Tensor | None = None  # [d]
        self.u: torch.Tensor | None = None  # [k] the released variant's direction inside the subspace
        self.mask_token_id: int | None = None
        self.prior_tokens: torch.Tensor | None = None  # ids averaged into the prior embedding

    def __getattr__(self, name: str):  # the settings read as attributes: mps.k, mps.lam, ...
        config = self.__dict__.get("config")
        if config is not None and name in {f.name for f in dataclasses.fields(config)}:
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    # ------------------------------------------------------------------ fitting

    def prior_embedding(self, model, tokenizer, token_frequencies=None) -> torch.Tensor:
        """The prior embedding ``[d]`` (float32) for ``vocab_mean`` / ``topk``."""
        emb = decoder_stack(model).embed_tokens.weight.detach().float()  # [V, d]
        ids = real_vocab_ids(tokenizer, emb.shape[0])
        if self.prior == "topk":
            if token_frequencies is not None:
                score = torch.as_tensor(token_frequencies, dtype=torch.float64).flatten()[ids]
            else:  # the tokens the model ranks highest for a lone, uncontextualised mask token
                mask_id = self.mask_token_id
                if mask_id is None:
                    mask_id = resolve_mask_token_id(model, tokenizer)
                score = lone_mask_logits(model, mask_id)[ids].double()
            ids = ids[score.topk(min(self.n_prior_tokens, len(ids))).indices]
        self.prior_tokens = ids
        return emb[ids].mean(0)

    def _fingerprint(self, model, tokenizer) -> str:
        """Hash of the fit settings, the model config and a strided sample of every weight (not all bytes)."""
        stack = decoder_stack(model)
        h = hashlib.sha256()
        h.update(json.dumps([self.variant, self.k, self.prior, self.n_prior_tokens, self.seed, len(tokenizer),
                             sorted(special_token_ids(tokenizer))]).encode())
        h.update(stack.config.to_json_string().encode())
        for name, p in stack.named_parameters():
            flat = p.detach().flatten()
            sample = flat[:: max(1, flat.numel() // 4096)].float().cpu()
            h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
            h.update(sample.numpy().tobytes())
        return h.hexdigest()[:24]

    def fit(self, model, tokenizer, token_frequencies=None) -> MaskPriorSuppression:
        """Compute (or load from ``cache_dir``) the prior subspace ``U [d, k]``, ``mu [d]`` (and, released, ``u``)."""
        stack = decoder_stack(model)
        d = stack.config.hidden_size
        if self.k > d:
            raise ValueError(f"k = {self.k} exceeds the model width d = {d}")
        self.mask_token_id = resolve_mask_token_id(model, tokenizer)
        self._layer_indices(len(stack.layers))  # validate early
        path = None
        if self.cache_dir is not None:
            path = self.cache_dir / f"mps-{self._fingerprint(model, tokenizer)}.safetensors"
            if path.exists():
                saved = load_file(str(path))
                self.U, self.mu, self.u = saved["U"], saved["mu"], saved.get("u")
                return self
        if self.variant == "released":
            emb = stack.embed_tokens.weight.detach()  # [V, d]: every row, as released
            self.U, self.mu, self.u = released_basis(released_states(model, emb.mean(0)), self.k)
        elif self.prior == "random":
            g = torch.Generator().manual_seed(self.seed)
            self.U = torch.linalg.qr(torch.randn(d, self.k, generator=g, dtype=torch.float64))[0].float()
            self.mu = torch.zeros(d)
        else:
            states = layer_states(model, self.prior_embedding(model, tokenizer, token_frequencies))  # [L, d]
            self.U, self.mu = pca_basis(states, self.k)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tensors = {"U": self.U.contiguous(), "mu": self.mu.contiguous()}
            if self.u is not None:
                tensors["u"] = self.u.contiguous()
            save_file(tensors, str(tmp))
            tmp.replace(path)
        return self

    # ------------------------------------------------------------------ applying

    def _layer_indices(self, n_layers: int) -> list[int]:
        if self.layers == "final":
            return [n_layers - 1]
        return check_layers(self.layers, n_layers)

    def suppress(self, h: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        """``h [B, T, d]`` with the prior suppressed where ``where [B, T]`` (released: the cosine-gated removal of
        ``(z.u) V_k u``; projection: ``lam`` of the subspace component)."""
        if self.variant == "released":
            return self._suppress_released(h, where)
        U, mu = self.U.to(h.device), self.mu.to(h.device)  # [d, k], [d]
        hf = h.float()
        coef = ((hf - mu) if self.center else hf) @ U  # [B, T, k]
        new = (hf - self.lam * (coef @ U.T)).to(h.dtype)  # [B, T, d]
        return torch.where(where[..., None].to(h.device), new, h)

    def released_gate(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The released update's terms for ``h [B, T, d]``: ``z.u`` and the gate ``clamp(cos(z, u), 0, 1)``, each
        ``[B, T]`` (``z = (h - mu) V_k``)."""
        V, mu, u = self.U.to(h.device), self.mu.to(h.device), self.u.to(h.device)  # [d, k], [d], [k]
        z = (h.float() - mu) @ V  # [B, T, k]
        along = z @ u  # [B, T]: z.u
        return along, (along / (z.norm(dim=-1) + 1e-6)).clamp(0.0, 1.0)

    def _suppress_released(self, h: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        along, cos = self.released_gate(h)  # [B, T] each
        direction = self.U.to(h.device) @ self.u.to(h.device)  # [d]: V_k u
        new = (h.float() - (self.lam * cos * along)[..., None] * direction).to(h.dtype)  # [B, T, d]
        return torch.where(where[..., None].to(h.device), new, h)

    @contextmanager
    def apply(self, model: torch.nn.Module,
              mask_positions: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None = None):
        """Hooks live inside the ``with`` block only. Mask positions: see the module docstring."""
        if self.U is None:
            raise ValueError("call fit(model, tokenizer) before apply")
        stack = decoder_stack(model)
        state: dict = {"ids": None}
        handles = []

        def grab(module, args, kwargs):
            ids = kwargs.get("input_ids")
            state["ids"] = ids if ids is not None else (args[0] if args else None)

        def where_now(T: int) -> torch.Tensor:
            if isinstance(mask_positions, torch.Tensor):
                return mask_positions.bool()
            ids = state["ids"]
            if ids is None:
                raise RuntimeError("MPS needs input_ids on the model's forward to find mask tokens "
                                   "(got inputs_embeds only); pass mask_positions=")
            where = mask_positions(ids) if callable(mask_positions) else ids == self.mask_token_id
            if where.shape[-1] != T:
                raise RuntimeError(f"mask positions cover {where.shape[-1]} tokens but the layer sees {T}")
            return where.bool()

        def hook(module, args, out):
            h = out[0] if isinstance(out, tuple) else out  # [B, T, d]
            new = self.suppress(h, where_now(h.shape[1]))
            return (new, *out[1:]) if isinstance(out, tuple) else new

        try:
            if not isinstance(mask_positions, torch.Tensor):
                handles.append(model.register_forward_pre_hook(grab, with_kwargs=True))
            if self.variant == "released":  # the final norm's output: the LM head's input
                handles.append(stack.norm.register_forward_hook(hook))
            else:
                for i in self._layer_indices(len(stack.layers)):
                    handles.append(stack.layers[i].register_forward_hook(hook))
            yield self
        finally:
            for h in handles:
                h.remove()


def released_basis(states: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The released fit from ``states [L, d]`` (``released_states``): ``V_k [d, k']`` (k' = min(k, L, d): the
    release clamps k to the rows of its SVD), ``mu [d]``, ``u [k']``."""
    mu = states.mean(0)  # [d]
    _, _, Vh = torch.linalg.svd(states - mu, full_matrices=False)  # [min(L, d), d], fp32 as released
    V = Vh[: min(int(k), Vh.shape[0])].T.contiguous()  # [d, k']
    u = torch.nn.functional.normalize((states[-1] - mu) @ V, dim=-1)  # [k']
    return V, mu, u


def pca_basis(states: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``states [L, d]`` -> (``U [d, k]`` top-k principal directions of the centred rows, ``mu [d]``)."""
    L, d = states.shape
    if k > d:
        raise ValueError(f"k = {k} exceeds the model width d = {d}")
    mu = states.mean(0)  # [d]
    centred = (states - mu).double()  # [L, d]
    _, _, Vh = torch.linalg.svd(centred, full_matrices=k > min(L, d))  # Vh [min(L,d) | d, d]
    rank = int(torch.linalg.matrix_rank(centred))
    if k > rank:
        warnings.warn(f"k = {k} exceeds the rank {rank} of the centred layer states ({L} layers); "
                      "the extra directions are arbitrary", stacklevel=2)
    return Vh[:k].T.float().contiguous(), mu  # [d, k], [d]


@torch.no_grad()
def lone_mask_logits(model: torch.nn.Module, mask_token_id: int) -> torch.Tensor:
    """Logits ``[V]`` of the uncontextualised mask token (fed alone at position 0) - the mask prior."""
    stack = decoder_stack(model)
    p = next(stack.parameters())
    ids = torch.tensor([[mask_token_id]], device=p.device)
    hidden = stack(input_ids=ids, use_cache=False).last_hidden_state  # [1, 1, d], after the final norm
    return model.get_output_embeddings()(hidden)[0, 0].float()


def lone_mask_top_tokens(model, tokenizer, k: int = 10) -> list[tuple[str, float]]:
    """Diagnostic: the top-k tokens (and probabilities) predicted for a lone mask token."""
    probs = lone_mask_logits(model, resolve_mask_token_id(model, tokenizer)).softmax(-1)
    top = probs.topk(k)
    return [(tokenizer.convert_ids_to_tokens(int(i)), float(v)) for v, i in zip(top.values, top.indices)]


register_method("mps", MPSConfig, MaskPriorSuppression, family="diffusion", needs="the model's mask token",
                prepare=lambda obj, model, tokenizer: obj.fit(model, tokenizer))
