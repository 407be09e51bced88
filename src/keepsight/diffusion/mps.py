"""Mask Prior Suppression (MPS): remove part of the mask prior from the hidden states of still-masked slots.

As released (github.com/hong-sujung/MPD-PAC, ``init_prior_lastlayer_subspace_from_32layers`` and the update in
``generate_with_embeds``):

- fit, once per model: the mean of *every* input-embedding row goes through the model as a one-token sequence
  (position 0); its hidden states after decoder layers 1 .. L-1 and the final norm's output (transformers'
  ``hidden_states[1:]``: L rows) are stacked, ``mu`` is their mean, ``V_k [d, k]`` the top-k right singular vectors
  of the centred stack (k clamped to the rank bound min(L, d)), and ``u [k] = normalize((h_L - mu) V_k)`` with
  ``h_L`` the last (final-normed) row;
- apply, at every forward, on the final norm's output (the LM head's input) at still-masked slots:
  ``z = (h - mu) V_k``, ``a = lam * clamp(cos(z, u), 0, 1)`` (``cos = z.u / (|z| + 1e-6)``), and
  ``h <- h - a * (z.u) V_k u``: a cosine-gated removal of one direction inside the subspace. The logits follow from
  the new h. ``lam = 0`` leaves every logit bit-identical.

Our earlier reading of the paper (a projection of the chosen layers' outputs onto a prior subspace) is
``keepsight.diffusion.readings.ProjectionMPS``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..methods import register_method
from ..models.arch import decoder_stack
from .config import MPSConfig
from .sampler import resolve_mask_token_id


def special_token_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


@torch.no_grad()
def lone_states(model: torch.nn.Module, embedding: torch.Tensor, modules) -> torch.Tensor:
    """``[len(modules), d]`` float32: the outputs of ``modules`` (of the text stack, in order) for ``embedding [d]``
    fed alone at position 0."""
    stack = decoder_stack(model)
    p = next(stack.parameters())
    collected: list[torch.Tensor] = []

    def keep(module, args, out):
        collected.append((out[0] if isinstance(out, tuple) else out)[0, 0])  # [d]

    handles = [m.register_forward_hook(keep) for m in modules]
    try:
        stack(inputs_embeds=embedding.to(p.device, p.dtype)[None, None], use_cache=False)  # [1, 1, d]
    finally:
        for h in handles:
            h.remove()
    return torch.stack(collected).float()


def released_states(model: torch.nn.Module, embedding: torch.Tensor) -> torch.Tensor:
    """``[L, d]`` float32: for ``embedding [d]`` fed alone at position 0, the outputs of decoder layers 1 .. L-1 and
    the final norm's output (transformers' ``hidden_states[1:]``, what the released MPS stacks)."""
    stack = decoder_stack(model)
    return lone_states(model, embedding, [*stack.layers[:-1], stack.norm])


def prior_cosine(hidden: torch.Tensor, U: torch.Tensor, mu: torch.Tensor | None = None) -> torch.Tensor:
    """``||U U^T h|| / ||h||`` per vector (``h - mu`` when mu is given): ``[..., d] -> [...]``."""
    h = hidden.float() - (mu.float().to(hidden.device) if mu is not None else 0.0)
    proj = (h @ U.to(h.device)) @ U.to(h.device).T  # [..., d]
    return proj.norm(dim=-1) / h.norm(dim=-1).clamp_min(1e-12)


class MaskPriorSuppression:
    """See the module docstring. ``fit`` then ``with mps.apply(model): ...``."""

    config_class = MPSConfig

    def __init__(self, config: MPSConfig | None = None, *, cache_dir: str | Path | None = None, **settings):
        """``config`` (default ``MPSConfig()``, the paper's settings) with ``settings`` (its fields) overriding;
        ``cache_dir``: where fitted subspaces are kept, keyed by a model fingerprint."""
        base = config if config is not None else self.config_class()
        try:
            self.config = dataclasses.replace(base, **settings)
        except TypeError as e:
            raise ValueError(f"MaskPriorSuppression: {e}") from None
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.U: torch.Tensor | None = None  # [d, k]: V_k
        self.mu: torch.Tensor | None = None  # [d]
        self.u: torch.Tensor | None = None  # [k]: the direction inside the subspace
        self.mask_token_id: int | None = None

    def __getattr__(self, name: str):  # the settings read as attributes: mps.k, mps.lam, ...
        config = self.__dict__.get("config")
        if config is not None and name in {f.name for f in dataclasses.fields(config)}:
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    # ------------------------------------------------------------------ fitting

    def _fit_key(self) -> list:
        """What the fit depends on besides the model and tokenizer (a cached fit's name)."""
        return ["released", self.k]

    def _fingerprint(self, model, tokenizer) -> str:
        """Hash of the fit settings, the model config and a strided sample of every weight (not all bytes)."""
        stack = decoder_stack(model)
        h = hashlib.sha256()
        h.update(json.dumps([*self._fit_key(), len(tokenizer), sorted(special_token_ids(tokenizer))]).encode())
        h.update(stack.config.to_json_string().encode())
        for name, p in stack.named_parameters():
            flat = p.detach().flatten()
            sample = flat[:: max(1, flat.numel() // 4096)].float().cpu()
            h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
            h.update(sample.numpy().tobytes())
        return h.hexdigest()[:24]

    def fit(self, model, tokenizer, token_frequencies=None) -> MaskPriorSuppression:
        """Compute (or load from ``cache_dir``) the prior subspace ``U [d, k]``, ``mu [d]`` and ``u``."""
        stack = decoder_stack(model)
        d = stack.config.hidden_size
        if self.k > d:
            raise ValueError(f"k = {self.k} exceeds the model width d = {d}")
        self.mask_token_id = resolve_mask_token_id(model, tokenizer)
        self.targets(stack)  # validate early
        path = None
        if self.cache_dir is not None:
            path = self.cache_dir / f"mps-{self._fingerprint(model, tokenizer)}.safetensors"
            if path.exists():
                saved = load_file(str(path))
                self.U, self.mu, self.u = saved["U"], saved["mu"], saved.get("u")
                return self
        self._fit_basis(model, tokenizer, token_frequencies)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tensors = {"U": self.U.contiguous(), "mu": self.mu.contiguous()}
            if self.u is not None:
                tensors["u"] = self.u.contiguous()
            save_file(tensors, str(tmp))
            tmp.replace(path)
        return self

    def _fit_basis(self, model, tokenizer, token_frequencies=None) -> None:
        """The released fit: the mean of every input-embedding row through the model, ``released_basis``."""
        emb = decoder_stack(model).embed_tokens.weight.detach()  # [V, d]: every row, as released
        self.U, self.mu, self.u = released_basis(released_states(model, emb.mean(0)), self.k)

    # ------------------------------------------------------------------ applying

    def targets(self, stack) -> list[torch.nn.Module]:
        """The modules whose output ``apply`` suppresses: the final norm (its output is the LM head's input)."""
        return [stack.norm]

    def released_gate(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The released update's terms for ``h [B, T, d]``: ``z.u`` and the gate ``clamp(cos(z, u), 0, 1)``, each
        ``[B, T]`` (``z = (h - mu) V_k``)."""
        V, mu, u = self.U.to(h.device), self.mu.to(h.device), self.u.to(h.device)  # [d, k], [d], [k]
        z = (h.float() - mu) @ V  # [B, T, k]
        along = z @ u  # [B, T]: z.u
        return along, (along / (z.norm(dim=-1) + 1e-6)).clamp(0.0, 1.0)

    def suppress(self, h: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        """``h [B, T, d]`` with the cosine-gated removal of ``(z.u) V_k u`` where ``where [B, T]``."""
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
            handles += [module.register_forward_hook(hook) for module in self.targets(stack)]
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
