"""Our earlier readings of the MPS / MRS paper, written before its authors' code was public (the paper gives no
formula for either): kept for the diffusion experiment's sweeps, which set them beside the released methods, and for
their tests, outside the method registry (the command line, lmms-eval and the support matrix offer the released
methods only). Each is a ``keepsight.methods.Method`` entry that ``keepsight.inference.Decoders`` applies like a
registered one: ``Decoders([(MPS_PROJECTION, {"lam": 0.5})], family="diffusion")``.

``ProjectionMPS`` (``MPS_PROJECTION``). Fit (once per model): a prior embedding ``e [d]`` (``prior="vocab_mean"``: the
mean input-embedding row of the real vocabulary, special tokens excluded; ``"topk"``: the mean embedding of the
``n_prior_tokens`` most frequent tokens when ``token_frequencies`` are given, else of the tokens the model ranks
highest for a lone mask token) goes through the text decoder as a length-1 sequence (position 0, so RoPE is the
identity); ``h_l [d]`` is the output of decoder layer l (before the final norm), l = 1..L; ``mu = mean_l h_l``; the
top-k right singular vectors of ``[h_l - mu]_l`` (an ``[L, d]`` matrix) form ``U [d, k]``. ``prior="random"`` (the
paper's ablation): U is an orthonormalised Gaussian ``[d, k]`` and mu = 0. Components beyond the rank of the centred
matrix (at most L - 1) are arbitrary completions; a warning says so. Apply: a forward hook on each chosen decoder
layer (default the final one, before the final norm) replaces ``h [B, T, d]`` by ``h - lam * U U^T h``
(``center=True``: ``h - lam * U U^T (h - mu)``) at the still-masked slots. ``lam = 0`` is bit-identical.

``RoPEGains`` (``MRS_GAINS``): RoPE's frequency pairs reweighted with gains ``g_i = 1 + beta * s(tau_i)`` that grow
toward the low frequencies (``keepsight.ops.rope.rope_gains``), on the segments ``MonotonicRoPEScaling`` reads:

- ``mode="amplitude"``: the attention-logit contribution of pair i is multiplied by g_i: a forward hook on the text
  model's rotary module scales its ``(cos, sin) [B, T, D]`` output for pair i (dims i and i + D/2) by ``sqrt(g_i)``;
  q and k are both rotated with those, so q.k of pair i gets g_i (between a scaled and an unscaled token sqrt(g_i)).
- ``mode="frequency"``: ``inv_freq_i / g_i`` (the rotary module's ``inv_freq`` buffer is swapped).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ..checks import number
from ..methods import Method
from ..models.arch import check_layers, decoder_stack
from ..ops.rope import rope_gains, scaled_inv_freq
from .config import MPSConfig, MRSConfig
from .mps import MaskPriorSuppression, lone_mask_logits, lone_states, special_token_ids
from .mrs import MonotonicRoPEScaling
from .sampler import resolve_mask_token_id

PRIORS = ("vocab_mean", "topk", "random")
MODES = ("amplitude", "frequency")


@dataclass
class ProjectionMPSConfig(MPSConfig):
    layers: str | list[int] = "final"  # decoder layers whose output is suppressed ("final" or indices)
    prior: str = "vocab_mean"  # prior direction: vocab_mean | topk | random (the paper's ablation)
    center: bool = False  # subtract the layer mean before projecting
    n_prior_tokens: int = 100  # prior="topk": tokens averaged
    seed: int = 0  # prior="random": the Gaussian basis

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.prior, str) or self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {PRIORS}, got {self.prior!r}")
        if isinstance(self.layers, str):
            if self.layers != "final":
                raise ValueError(f"layers must be 'final' or a non-empty list of layer indices, got {self.layers!r}")
        else:
            try:
                self.layers = [number("layers", i, integer=True) for i in self.layers]
            except TypeError:
                raise ValueError(f"layers must be 'final' or a list of layer indices, got {self.layers!r}") from None
            if not self.layers:
                raise ValueError("layers must be 'final' or a non-empty list of layer indices, got []")
        if not isinstance(self.center, bool):
            raise ValueError(f"center must be true or false, got {self.center!r}")
        self.n_prior_tokens = number("n_prior_tokens", self.n_prior_tokens, low=1, integer=True)
        self.seed = number("seed", self.seed, low=0, integer=True)


def real_vocab_ids(tokenizer, vocab_rows: int) -> torch.Tensor:
    """Ids of ordinary tokens: below ``min(len(tokenizer), vocab_rows)``, special tokens excluded."""
    n = min(len(tokenizer), vocab_rows)
    special = special_token_ids(tokenizer)
    ids = [i for i in range(n) if i not in special]
    if not ids:
        raise ValueError("the tokenizer has no ordinary (non-special) tokens")
    return torch.tensor(ids)


def layer_states(model: torch.nn.Module, embedding: torch.Tensor) -> torch.Tensor:
    """Outputs of every decoder layer for ``embedding [d]`` fed alone at position 0: ``[L, d]`` float32."""
    return lone_states(model, embedding, decoder_stack(model).layers)


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


class ProjectionMPS(MaskPriorSuppression):
    """MPS as our earlier reading: ``lam`` of the prior subspace's component removed from the chosen layers'
    outputs (the module docstring)."""

    config_class = ProjectionMPSConfig

    def __init__(self, config: ProjectionMPSConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        self.prior_tokens: torch.Tensor | None = None  # ids averaged into the prior embedding

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

    def _fit_key(self) -> list:
        return ["projection", self.k, self.prior, self.n_prior_tokens, self.seed]

    def _fit_basis(self, model, tokenizer, token_frequencies=None) -> None:
        d = decoder_stack(model).config.hidden_size
        if self.prior == "random":
            g = torch.Generator().manual_seed(self.seed)
            self.U = torch.linalg.qr(torch.randn(d, self.k, generator=g, dtype=torch.float64))[0].float()
            self.mu = torch.zeros(d)
        else:
            states = layer_states(model, self.prior_embedding(model, tokenizer, token_frequencies))  # [L, d]
            self.U, self.mu = pca_basis(states, self.k)

    def targets(self, stack) -> list[torch.nn.Module]:
        n = len(stack.layers)
        return [stack.layers[i] for i in ([n - 1] if self.layers == "final" else check_layers(self.layers, n))]

    def suppress(self, h: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        """``h [B, T, d]`` less ``lam`` of its subspace component where ``where [B, T]``."""
        U, mu = self.U.to(h.device), self.mu.to(h.device)  # [d, k], [d]
        hf = h.float()
        coef = ((hf - mu) if self.center else hf) @ U  # [B, T, k]
        new = (hf - self.lam * (coef @ U.T)).to(h.dtype)  # [B, T, d]
        return torch.where(where[..., None].to(h.device), new, h)


@dataclass
class RoPEGainsConfig(MRSConfig):
    mode: str = "amplitude"  # "amplitude" (each pair's logit part times g_i) | "frequency" (inv_freq_i / g_i)

    def __post_init__(self) -> None:
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        super().__post_init__()


class RoPEGains(MonotonicRoPEScaling):
    """MRS as our earlier readings: gains on each frequency pair's logit part or on its frequency."""

    config_class = RoPEGainsConfig

    @property
    def scales_rotary_output(self) -> bool:
        return self.config.mode == "amplitude"

    def gains(self, head_dim: int) -> torch.Tensor:
        """Per pair ``[head_dim / 2]`` (float64): the gains ``g``."""
        return rope_gains(head_dim, self.beta, self.eta, self.tau0, self.schedule)

    def scaled_inv_freq(self, inv_freq: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
        return scaled_inv_freq(inv_freq, gains)


def _fit(obj, model, tokenizer):
    obj.fit(model, tokenizer)


MPS_PROJECTION = Method(name="mps_projection", stage="decode", family="diffusion", config=ProjectionMPSConfig,
                        build=ProjectionMPS, prepare=_fit, needs="the model's mask token")
MRS_GAINS = Method(name="mrs_gains", stage="decode", family="diffusion", config=RoPEGainsConfig, build=RoPEGains,
                   needs="a RoPE text model",
                   enter=lambda obj, model, prompt_len: obj.apply(model, gen_start=prompt_len))
READINGS = {m.name: m for m in (MPS_PROJECTION, MRS_GAINS)}
