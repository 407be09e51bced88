"""OPERA (Huang et al., CVPR 2024, "OPERA: Alleviating Hallucination in Multi-Modal Large Language Models via
Over-Trust Penalty and Retrospection-Allocation"), written from the authors' released code: github.com/shikiw/OPERA
(commit 61426ef), ``transformers-4.29.2/src/transformers/generation/utils.py``, method ``opera_beam_search``
(lines 3116-3674, "U:" below) and the ``generate`` branch that calls it (U:1619-1665).

OPERA is a beam search (``num_beams`` 5). At every step, for each beam:

1. The ``N = num_attn_candidates`` tokens with the largest raw next-token logits are the candidates (U:3371).
2. One extra forward per candidate (the candidate appended, U:3382-3411) gives its attention row in the **last**
   decoder layer, reduced over heads by a **max**. With the rows of the tokens generated so far (kept from earlier
   steps, reordered with their beams) this is a matrix ``A [rows, keys]``; every row is normalised over all keys
   (U:3415) and the response block ``A[r:, r:]`` is kept (``r`` = the first generated position, U:3420).
3. Over-trust score per response column ``j`` (U:3423-3428), with ``s`` the candidate's row:
   ``phi_j = 1e-7 * prod_{i=j..s} (scale_factor * A[i, j])``, stored in a **float16** buffer as the release does
   (so it saturates to +inf above 65504 and an inf penalty bans the candidate).
4. Penalty (U:3440): for the first 10 response tokens ``-sum(A[s, image columns])`` (a bonus for attention on the
   image), afterwards ``max_j phi_j``. Candidate logits ``-= penalty_weights * penalty`` (U:3449); every other token
   gets -999 (U:3555-3557). Then ``log_softmax`` + beam scores, top ``2 * num_beams``, and the beam scorer of
   transformers 4.29.2 (``BeamSearchScorer``, length_penalty 1, early_stopping False: ``_BeamScorer`` below).
5. Retrospection-allocation (U:3458-3553): the mode over candidates of each beam's argmax column is appended to the
   beam slot's history; ``loc`` = the mode of those over beams. When in *every* beam slot ``loc`` appears more than
   ``threshold`` times and ``loc >= 10``, the search rolls back to position ``p = loc + 1`` (``loc`` once ``p`` has
   been rolled back to ``N`` times, no rollback once both have), restores the beams, scores and scorer of the step
   that chose token ``p``, rebuilds the KV cache from scratch, and re-chooses token ``p`` from the full-vocabulary
   logits (shifted so their minimum is -999) with every (parent beam, token) pair chosen there before set to -999.

Where the release has quirks they are kept (each is marked "release:" in the code): the float16 score buffer; the
history of locations is kept per beam *slot* (never reordered with the beams); the restored beam scorer is the
stored object itself, so a second rollback to the same position sees hypotheses the first retry added; the first
10 steps' locations count; loc ties are broken by ``torch.mode``. Deliberate differences: ``penalty_weights = 0``
skips the penalty instead of computing ``0 * inf = nan`` (the release poisons the beam scores there), and the logits
are float32 (as transformers 5's beam search; the release's fp16 LLaVA-1.5 ran this arithmetic in fp16). A rollback
rebuilds the cache as released (one forward over the prompt and the generated ids but the last, then the last),
except where a generated id equals an image placeholder id: HF's VLMs would read it as an image there, so the
prompt (with its images) and the generated ids (as text) go in two forwards, equal to the release up to float32
rounding.

In keepsight the method replaces ``model.generate`` inside ``apply``: the usual Hugging Face call (``input_ids``,
``attention_mask``, the image inputs and per-token inputs the architecture table names, e.g. Qwen-VL's
``image_grid_thw`` / ``mm_token_type_ids``, ``max_new_tokens``, ...)
returns ``[B, P + new]`` ids like HF's decoder-only generate. **The beam count is the config's ``num_beams``,
whatever the caller passes** (OPERA is a beam search; the paper's 5 by default). The batch's prompts decode
together (``_Beams``): each prompt's left padding is stripped and its own images split off as the architecture table's
``image_layout`` says (``_split_rows``); each is prefilled alone, then their beams share one cache, each prompt's keys
left-padded to the longest and masked, at its own positions (as Hugging Face's generate computes them), so a step
is one forward for every prompt's fed tokens and one for every prompt's candidates. A prompt's rollback rebuilds its
cache alone and splices it in; a prompt that ends leaves the batch. A row's tokens equal its tokens decoded alone
(the tests). Where the cache cannot be stacked (a sliding window: Gemma 3 / 4; a recurrent layer: Qwen3.5) each
prompt decodes alone. The candidate forward holds the cache ``min(N, CANDIDATES_PER_FORWARD)`` times over for the
whole batch: a smaller batch is the memory knob. A candidate's forward is undone exactly (``_CacheMark``: attention
layers by reference, recurrent layers' in-place states from a copy), so hybrid stacks (Qwen3.5) and sliding
windows run. The language model runs with eager attention
during the search (the release's transformers 4.29.2 LLaMA has nothing else; it also gives the last layer's
attention probabilities), the original implementation is restored afterwards. ``OPERAConfig.off()`` (penalty 0, no
rollback, every token a candidate) is plain beam search and simply calls the model's own ``generate(num_beams=...)``;
``OPERAConfig.efficient()`` is the README's faster setting (threshold 25, one candidate). The 4.29.2 scorer divides a
finished beam's score by its ``input_ids`` length, prompt included: ``scored_prompt`` says which prompt length that
is (default: the released LLaVA-1.5 path's, each image one token).

    from keepsight.baselines.opera import OPERA, OPERAConfig
    opera = OPERA()                        # the paper's settings: 5 beams, N 5, scale 50, threshold 15, weight 1
    with opera.apply(model):
        ids = model.generate(**inputs, max_new_tokens=64)
    print(opera.stats())                   # steps, candidate forwards, rollbacks, ...

``stats()``: ``forwards`` (every model forward OPERA ran), ``rows``, ``acted`` = ``steps`` (beam steps), and
``candidate_forwards`` (candidates scored, up to ``CANDIDATES_PER_FORWARD`` in a forward), ``rollbacks``,
``rollback_forwards`` (the cache rebuilds), ``banned_candidates`` (candidate scores an infinite over-trust penalty set
to -inf), ``delegated_rows`` (rows the model's own beam search ran, off).
"""

from __future__ import annotations

import copy
import functools
import inspect
from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..checks import number
from ..models.arch import arch_info, rope_state_kept
from .base import Baseline

WINDOW = 512  # U:3134 ``window_size``: sizes the history buffers; generate() never forwards it (U:1648-1665)
FIRST = 10  # U:3440 ``cur_response_lens <= 10``: image-attention bonus; U:3460 ``rollback_loc < 10``: no rollback
FLOOR = -999.0  # U:3543-3552 / U:3556: the floor of rejected and non-candidate tokens
# candidates scored in one forward (the beams' cache repeated for each): the release runs one forward per candidate;
# a row of the batch computes what it computes alone, so the tokens are the release's (the parity fixtures); every
# token a candidate (num_attn_candidates None) goes in forwards of this many
CANDIDATES_PER_FORWARD = 8
SCORED_PROMPT = ("llava", "embeds", "full")
COUNTERS = ("forwards", "steps", "candidate_forwards", "rollbacks", "rollback_forwards", "banned_candidates")
GENERATE_OPTIONS = {"max_new_tokens", "min_new_tokens", "do_sample", "num_beams", "pad_token_id", "eos_token_id",
                    "bos_token_id", "generation_config", "use_cache", "output_attentions", "temperature", "top_p",
                    "top_k", "length_penalty", "early_stopping", "num_return_sequences", "return_dict_in_generate",
                    "max_length"}


@dataclass
class OPERAConfig:
    # a beam search (it refuses sampling; its off setting is the model's own beam search, not greedy decoding): the
    # registry's generic tests do not fit it, these do
    TESTED_BY: ClassVar[str] = "tests/baselines/test_opera.py"
    num_beams: int = 5  # beams (README TL;DR and pope_eval.py / chair_eval.py ``--beam 5``; U:1515-1516 needs > 1)
    scale_factor: float = 50.0  # sigma of the over-trust score (U:1159 generate default; pope_eval.py:73; README: 50)
    threshold: int | None = 15  # rollback when loc appears > threshold times in every beam (U:1160; pope_eval.py:74;
    #                              README: 15); None: never roll back
    num_attn_candidates: int | None = 5  # N, candidates per beam (U:1161; pope_eval.py:75; README: 5); None: all tokens
    penalty_weights: float = 1.0  # alpha (U:1162; pope_eval.py:76; README: 1)
    scored_prompt: str = "llava"  # prompt length the 4.29.2 beam scorer's length normalisation counts (it divides a
    #   finished beam's score by len(input_ids), prompt included): "llava" = the prompt with each image as one token
    #   (the released LLaVA-1.5 path: input_ids hold one IMAGE_TOKEN_INDEX per image, llava.py:206-210), "embeds" = 1
    #   (the released inputs_embeds path of MiniGPT-4 / InstructBLIP: one BOS placeholder), "full" = every token

    def __post_init__(self) -> None:
        self.num_beams = number("num_beams", self.num_beams, low=2, integer=True)
        self.scale_factor = number("scale_factor", self.scale_factor, low=0.0)
        if self.threshold is not None:
            self.threshold = number("threshold", self.threshold, low=0, integer=True)
        if self.num_attn_candidates is not None:
            self.num_attn_candidates = number("num_attn_candidates", self.num_attn_candidates, low=1, integer=True)
        self.penalty_weights = number("penalty_weights", self.penalty_weights, low=0.0)
        if self.scored_prompt not in SCORED_PROMPT:
            raise ValueError(f"scored_prompt must be one of {SCORED_PROMPT}, got {self.scored_prompt!r}")

    @classmethod
    def efficient(cls, **settings) -> OPERAConfig:
        """The README's "more efficient version" (README.md:76-91): threshold 25, one candidate, the rest as the paper.
        With one candidate the log-softmax over it is 0 for every beam, so this is greedy decoding on beam 0 plus
        rollbacks (at most one per position)."""
        return cls(**{"threshold": 25, "num_attn_candidates": 1, **settings})

    @classmethod
    def off(cls, **settings) -> OPERAConfig:
        """No penalty, no rollback, every token a candidate: plain beam search (the model's own generate)."""
        return cls(**{"penalty_weights": 0.0, "threshold": None, "num_attn_candidates": None, **settings})

    @property
    def disabled(self) -> bool:
        return self.penalty_weights == 0 and self.threshold is None and self.num_attn_candidates is None


# ----------------------------------------------------------------------------- the beam scorer of transformers 4.29.2


class _Hypotheses:
    """transformers 4.29.2 ``BeamHypotheses`` (generation/beam_search.py:861-936) for one row. ``hyp`` holds the
    generated ids only; its length for the normalisation is ``prefix + len(hyp)`` (see ``scored_prompt``)."""

    def __init__(self, num_beams: int, length_penalty: float, early_stopping, max_length: int, prefix: int):
        self.num_beams, self.length_penalty, self.early_stopping = num_beams, length_penalty, early_stopping
        self.max_length, self.prefix = max_length, prefix
        self.beams: list[tuple[float, torch.Tensor]] = []
        self.worst_score = 1e9

    def __len__(self) -> int:
        return len(self.beams)

    def add(self, hyp: torch.Tensor, sum_logprobs: float) -> None:
        score = sum_logprobs / ((self.prefix + hyp.shape[-1]) ** self.length_penalty)
        if len(self) < self.num_beams or score > self.worst_score:
            self.beams.append((score, hyp))
            if len(self) > self.num_beams:
                ranked = sorted([(s, idx) for idx, (s, _) in enumerate(self.beams)])
                del self.beams[ranked[0][1]]
                self.worst_score = ranked[1][0]
            else:
                self.worst_score = min(score, self.worst_score)

    def is_done(self, best_sum_logprobs: float, cur_len: int) -> bool:
        if len(self) < self.num_beams:
            return False
        if self.early_stopping is True:
            return True
        if self.early_stopping is False or self.length_penalty <= 0.0:
            return self.worst_score >= best_sum_logprobs / cur_len ** self.length_penalty
        return self.worst_score >= best_sum_logprobs / self.max_length ** self.length_penalty  # "never"


class _BeamScorer:
    """transformers 4.29.2 ``BeamSearchScorer`` (generation/beam_search.py:119-413) for one row (batch size 1, one
    returned sequence). transformers 5 removed the class; its vectorised beam search normalises by the generated
    length (eos included) where 4.29.2 divides by the whole ``input_ids`` length (eos excluded)."""

    def __init__(self, num_beams: int, length_penalty: float, early_stopping, max_length: int, prefix: int):
        self.num_beams = num_beams
        self.hyps = _Hypotheses(num_beams, length_penalty, early_stopping, max_length, prefix)
        self.done = False

    def process(self, generated: torch.Tensor, next_scores: torch.Tensor, next_tokens: torch.Tensor,
                next_indices: torch.Tensor, pad_token_id: int, eos: list[int]):
        """``generated`` [K, t]: the beams' generated ids; ``next_*`` [2K]: the top continuations, best first.
        Returns the next beams' (scores, tokens, parent indices), each [K] (beam_search.py:208-297)."""
        k = self.num_beams
        cur_len = self.hyps.prefix + generated.shape[-1] + 1
        scores = torch.zeros(k, dtype=next_scores.dtype)
        tokens = torch.zeros(k, dtype=next_tokens.dtype)
        indices = torch.zeros(k, dtype=next_indices.dtype)
        if self.done:
            return scores, tokens.fill_(pad_token_id), indices
        beam = 0
        for rank, (token, score, index) in enumerate(zip(next_tokens, next_scores, next_indices)):
            if int(token) in eos:
                if rank >= k:  # an eos below the top num_beams is not a hypothesis
                    continue
                self.hyps.add(generated[index].clone(), score.item())
            else:
                scores[beam], tokens[beam], indices[beam] = score, token, index
                beam += 1
            if beam == k:
                break
        if beam < k:
            raise ValueError(f"At most {k} tokens in {next_tokens} can be equal to eos_token_id {eos}")
        self.done = self.done or self.hyps.is_done(next_scores.max().item(), cur_len)
        return scores, tokens, indices

    def finalize(self, generated: torch.Tensor, beam_scores: torch.Tensor, max_new_tokens: int, eos: list[int]):
        """The best hypothesis's generated ids (an eos appended when it ended early) and its score
        (beam_search.py:299-374)."""
        if not self.done:
            for b in range(self.num_beams):
                self.hyps.add(generated[b], beam_scores[b].item())
        score, best = sorted(self.hyps.beams, key=lambda x: x[0]).pop()
        if best.shape[-1] < max_new_tokens and eos:  # sent_max_len = min(len + 1, max_length)
            best = torch.cat([best, best.new_tensor([eos[0]])])
        return best, torch.tensor(score, dtype=torch.float32).item()  # 4.29.2 keeps best_scores in float32


# ----------------------------------------------------------------------------- one row


def _images_in_row(spec, images: dict, ids: torch.Tensor, image_token_id: int) -> int:
    """How many images one prompt row holds (``ids`` [P]): an entry of its image inputs each, an image's tiles one
    run of image tokens (InternVL), a real (not all-zero) sub-image each where the inputs are batched by row
    (Idefics3 / SmolVLM: their tiles and the global image)."""
    if not images:
        return 0
    if spec.image_layout == "grid":
        return int(images["image_grid_thw"].shape[0])
    if spec.image_layout == "tiles":
        return len(_runs(ids, image_token_id))
    if spec.image_layout == "rows":
        pixels = images["pixel_values"]
        return int(pixels.flatten(2).ne(0).any(-1).sum())
    return int(images["pixel_values"].shape[0])


class _Row:
    """One prompt (no padding) and its image inputs; builds the forward arguments of ``K`` copies of a sequence that
    starts with the prompt."""

    def __init__(self, model, inputs: dict, info):
        image_token_id = info.image_token_id
        self.model = model
        self.ids = inputs["input_ids"]  # [1, P]
        self.tokens = {k: inputs[k] for k in info.spec.token_inputs if inputs.get(k) is not None}  # each [1, P]
        self.images = {k: inputs[k] for k in info.spec.image_inputs if inputs.get(k) is not None}
        pos = (self.ids[0] == image_token_id).nonzero().flatten()
        if pos.numel() == 0:
            raise ValueError(f"OPERA needs image tokens (id {image_token_id}) in every prompt: its penalty reads the "
                             "attention on the image")
        # U:3432 sums image_start .. image_end inclusive (key_position, llava.py:206-210): first to last image token
        self.image_start, self.image_end = int(pos[0]), int(pos[-1])
        self.length = self.ids.shape[1]
        self.n_images = _images_in_row(info.spec, self.images, self.ids[0], image_token_id)
        self.n_image_tokens = int(pos.numel())

    def scored_prefix(self, how: str) -> int:
        if how == "embeds":
            return 1
        if how == "full":
            return self.length
        return self.length - self.n_image_tokens + self.n_images  # "llava": each image one token

    def prefill_kwargs(self, ids: torch.Tensor) -> dict:
        """Forward arguments for ``ids`` [K, L] (L >= P, the prompt first) from an empty cache."""
        k = ids.shape[0]
        kw = {"input_ids": ids}
        for key, value in self.images.items():
            kw[key] = value.repeat(k, *([1] * (value.dim() - 1)))  # each copy's images in order, as HF's expansion
        for key, value in self.tokens.items():  # the prompt's own, zeros over what follows it
            padded = torch.zeros(k, ids.shape[1], dtype=value.dtype, device=value.device)
            padded[:, : self.length] = value
            kw[key] = padded
        return kw


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


def _replay(rows: list, k: int, prompt: int, dtype, device) -> torch.Tensor:
    """The response rows of the release's ``attn_previous`` after the logged steps: each step pads a zero key column,
    reorders the rows with the beams and appends the fed token's row (U:3348-3357). [K, 1, t, P + t]."""
    out = torch.zeros(k, 1, 0, prompt, dtype=dtype, device=device)
    for beam_idx, row in rows:
        out = torch.cat([out, torch.zeros_like(out).sum(-1, keepdim=True)], -1)[beam_idx]
        out = torch.cat([out, row], -2)
    return out


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
        width = max(self.mask.shape[1], mask.shape[1])

        def put(whole, own, dim):
            whole = _pad_left(whole, width, dim)
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


class _Search:
    """One prompt's beam search: the release's state (U:3300-3334) and its step, around forwards that ``_Beams``
    runs for every prompt at once."""

    def __init__(self, row: _Row, cfg: OPERAConfig, max_new_tokens: int, length_penalty: float, early_stopping,
                 dtype, trace: list | None):
        k, P = cfg.num_beams, row.length
        device = row.ids.device
        self.row, self.cfg, self.k, self.P, self.dtype, self.trace = row, cfg, k, P, dtype, trace
        self.max_new_tokens = max_new_tokens
        self.ids = row.ids.expand(k, P).clone()  # [K, P + t] the running beams (U:1645 expands the prompt)
        prefix = row.scored_prefix(cfg.scored_prompt)
        self.scorer = _BeamScorer(k, length_penalty, early_stopping, prefix + max_new_tokens, prefix)
        self.beam_scores = torch.zeros(k, device=device)  # U:3300-3302: beam 0 live, the others at -1e9
        self.beam_scores[1:] = -1e9
        self.history_states: list[dict] = []  # U:3306-3313
        self.history_locs: list[torch.Tensor] = []
        self.beam_next_tokens = self.beam_idx = None
        self.max_rollback_time = torch.zeros(WINDOW)
        self.reject_gather: list = [[] for _ in range(WINDOW)]
        self.rows_log: list = []  # (beam_idx, fed token's attention row) per step t >= 1: replays attn_previous
        self.attn_prev = torch.zeros(k, 1, 0, P, dtype=dtype, device=device)  # response rows of attn_previous
        self.t = 0  # generated tokens (the release's cur_len minus its prompt)
        self.done = False

    def begin(self, logits: torch.Tensor, fed_row: torch.Tensor | None) -> torch.Tensor:
        """A step's start: the fed token's logits [K, V] and its last-layer row [K, 1, 1, P + t] (None at the first
        step, the prefill). Returns the candidates [K, N] (U:3371: top-N raw logits per beam)."""
        self.state = {"ids": self.ids.clone(), "scorer": copy.deepcopy(self.scorer), "t": self.t}  # U:3330-3334
        if fed_row is not None:  # U:3348-3357: pad a zero key column, reorder rows with the beams, append the row
            prev = torch.cat([self.attn_prev, torch.zeros_like(self.attn_prev).sum(-1, keepdim=True)], -1)
            self.attn_prev = torch.cat([prev[self.beam_idx], fed_row], -2)
            self.rows_log.append((self.beam_idx, fed_row))
        self.logits = logits
        vocab = logits.shape[-1]
        n = vocab if self.cfg.num_attn_candidates is None else self.cfg.num_attn_candidates
        if n > vocab:
            raise ValueError(f"num_attn_candidates {n} exceeds the vocabulary ({vocab} tokens)")
        self.cand_scores, self.cand_tokens = torch.topk(logits, n, dim=-1, largest=True, sorted=True)
        self.state.update(candidate_tokens=self.cand_tokens.clone(), beam_scores=self.beam_scores.clone(),
                          beam_next_tokens=None if self.beam_next_tokens is None else self.beam_next_tokens.clone(),
                          beam_idx=None if self.beam_idx is None else self.beam_idx.clone())
        return self.cand_tokens

    def step(self, cand_rows: torch.Tensor, rebuild, eos: list[int], pad: int, min_new_tokens: int,
             st: dict) -> torch.Tensor:
        """The rest of the step, from the candidates' last-layer rows [K, N, 1, P + t + 1] (U:3382-3411). ``rebuild``
        (ids [K, L] -> logits [K, V]) rebuilds this prompt's cache for a rollback. Returns the parent beams [K] the
        cache is reordered by."""
        cfg, k, P = self.cfg, self.k, self.P
        n = self.cand_tokens.shape[1]
        st["candidate_forwards"] += n
        padded = torch.cat([self.attn_prev, torch.zeros_like(self.attn_prev).sum(-1, keepdim=True)], -1)
        # [K, N, t + 1, P + t + 1]: response rows, every key
        attn_last = torch.cat([padded.expand(k, n, *padded.shape[2:]), cand_rows], -2)
        attn_last = attn_last / attn_last.sum(-1, keepdim=True)  # U:3415: rows normalised over all keys
        attn_local = attn_last[..., P:]  # U:3420: the response block [r:, r:], [K, N, t + 1, t + 1]
        attn_local = cfg.scale_factor * attn_local  # U:3423
        # U:3424-3428 (release: a float16 buffer; phi saturates to inf above 65504)
        local_scores = torch.zeros(attn_local.shape[:2] + attn_local.shape[-1:], dtype=torch.float16,
                                   device=attn_local.device)  # [K, N, t + 1]
        for j in range(attn_local.shape[-1]):
            local_scores[..., j] = (1e-7 * attn_local[..., j:, j].prod(-1)).to(torch.float32)
        cur_response_lens = attn_local.shape[-1]  # t + 1
        attn_i = attn_last[:, :, -1, self.row.image_start: self.row.image_end + 1].sum(-1)  # U:3432 [K, N]
        rollback_scores, rollback_locs = local_scores.max(-1)  # U:3436 [K, N]
        rollback_loc = rollback_locs.mode().values.mode().values  # U:3437-3438: mode over N, then beams
        penalty = -attn_i if cur_response_lens <= FIRST else rollback_scores  # U:3440
        self.history_locs.append(rollback_locs.mode().values[:, None])  # U:3443-3447 (release: per beam slot)
        gathers = torch.cat(self.history_locs, -1)  # [K, steps]
        cand_scores, cand_tokens = self.cand_scores, self.cand_tokens
        if cfg.penalty_weights != 0:  # U:3449 (weight 0: no term; the release computes 0 * inf = nan)
            cand_scores = cand_scores - cfg.penalty_weights * penalty
        st["banned_candidates"] += int(torch.isneginf(cand_scores).sum())
        state = self.state
        state["candidate_token_scores"] = cand_scores.clone()
        if len(self.history_states) >= WINDOW:  # U:3453-3455
            self.history_states.pop(0)
        self.history_states.append(state)

        logits, vocab = self.logits, self.logits.shape[-1]
        next_logits = None
        if (cfg.threshold is not None and all(int((g == rollback_loc).long().sum()) > cfg.threshold
                                              for g in gathers) and int(rollback_loc) >= FIRST):  # U:3459-3460
            p = int(rollback_loc) + 1  # U:3463-3472: the token after loc, else loc, each at most N times
            ok = p < WINDOW  # release: max_rollback_time[p] raises IndexError (caught: no rollback)
            if ok and self.max_rollback_time[p] >= n:
                p -= 1
                ok = bool(self.max_rollback_time[p] < n)
            if ok:
                self.max_rollback_time[p] += 1
                if cur_response_lens - p > WINDOW + 1:  # U:3473-3474
                    p = max(1, cur_response_lens - WINDOW - 1)
                for j in range(cur_response_lens - p - 2):  # U:3478-3481 (release: clears the list's tail)
                    self.history_states.pop(-1)
                    self.history_locs.pop(-1)
                    self.reject_gather[-(j + 1)] = []
                back, after = self.history_states[-2], self.history_states[-1]  # U:3484-3495
                self.ids, self.scorer, self.t = back["ids"], back["scorer"], back["t"]  # release: the stored scorer
                self.rows_log = self.rows_log[: self.t]
                self.attn_prev = _replay(self.rows_log, k, P, self.dtype, self.attn_prev.device)
                cand_scores, cand_tokens = back["candidate_token_scores"], back["candidate_tokens"]
                self.beam_scores = back["beam_scores"]
                self.beam_next_tokens, self.beam_idx = after["beam_next_tokens"], after["beam_idx"]
                before = st["forwards"]
                logits = rebuild(self.ids)  # U:3497-3535: the cache rebuilt from scratch
                st["rollbacks"] += 1
                st["rollback_forwards"] += st["forwards"] - before
                self.history_states.pop(-1)  # U:3537-3541
                self.history_locs.pop(-1)
                if p + 1 < WINDOW:  # release: reject_token_pos_gather[512] raises (caught: the except path)
                    self.reject_gather[p + 1] = []
                    # U:3543-3552: full-vocab logits, min shifted to -999, earlier choices at p set to -999
                    next_logits = logits - (999.0 + logits.min(-1, keepdim=True).values)
                    flat = next_logits.reshape(1, k * vocab)
                    reject = (self.beam_idx * vocab + self.beam_next_tokens).view(1, k)
                    if len(self.reject_gather[p]) > 0:
                        reject = torch.cat([self.reject_gather[p], reject], -1)
                    self.reject_gather[p] = reject
                    next_logits = flat.scatter(-1, reject, FLOOR).view(k, vocab)
        if next_logits is None:  # U:3555-3557: only the (penalised) candidates, -999 elsewhere
            next_logits = torch.full_like(logits, FLOOR).scatter(-1, cand_tokens, cand_scores)

        # U:3561-3625: the 4.29.2 beam step
        scores = torch.log_softmax(next_logits, dim=-1)  # [K, V]
        if self.t < min_new_tokens and eos:  # MinNewTokensLengthLogitsProcessor (4.29.2 applies it here)
            scores[:, eos] = -float("inf")
        scores = scores + self.beam_scores[:, None]
        top_scores, top = torch.topk(scores.view(1, k * vocab), 2 * k, dim=1, largest=True, sorted=True)
        next_indices = torch.div(top, vocab, rounding_mode="floor")[0]
        next_tokens = (top % vocab)[0]
        beam_scores, beam_next_tokens, beam_idx = self.scorer.process(self.ids[:, P:], top_scores[0].cpu(),
                                                                      next_tokens.cpu(), next_indices.cpu(), pad,
                                                                      eos)
        device = self.ids.device
        self.beam_scores = beam_scores.to(device)
        self.beam_next_tokens, self.beam_idx = beam_next_tokens.to(device), beam_idx.to(device)
        self.ids = torch.cat([self.ids[self.beam_idx], self.beam_next_tokens[:, None]], -1)
        st["steps"] += 1
        if self.trace is not None:
            self.trace.append({"t": self.t, "tokens": self.beam_next_tokens.tolist(), "beams": self.beam_idx.tolist(),
                               "scores": self.beam_scores.tolist(), "loc": int(rollback_loc)})
        self.t += 1
        self.done = self.scorer.done or self.t >= self.max_new_tokens
        return self.beam_idx

    def finalize(self, eos: list[int]) -> tuple[torch.Tensor, float]:
        best, score = self.scorer.finalize(self.ids[:, self.P:], self.beam_scores.cpu(), self.max_new_tokens, eos)
        return best.to(self.ids.device), score


@torch.no_grad()
def _decode(model, prompts: list[dict], max_new_tokens: int, cfg: OPERAConfig, *, eos: list[int], pad: int,
            min_new_tokens: int, length_penalty: float, early_stopping, st: dict,
            traces: list | None = None) -> list[tuple[torch.Tensor, float]]:
    """OPERA's beam search on ``prompts`` (each one row's inputs without padding) decoded together: every step one
    forward for all their fed tokens and one for all their candidates (up to ``CANDIDATES_PER_FORWARD`` each), each
    prompt's rollbacks on its own. Returns each prompt's (generated ids, score)."""
    info = arch_info(model)
    rows = [_Row(model, inputs, info) for inputs in prompts]
    k = cfg.num_beams
    visual_ids = torch.tensor(info.visual_token_ids or (info.image_token_id,), device=rows[0].ids.device)
    dtype = info.lm_head.weight.dtype  # the language model's: its attention probabilities come in it
    with rope_state_kept(model), _AttentionTap(model) as tap:
        beams = _Beams(model, k, st)
        searches = [_Search(row, cfg, max_new_tokens, length_penalty, early_stopping, dtype,
                            None if traces is None else traces[b]) for b, row in enumerate(rows)]
        results: list = [None] * len(rows)
        active = list(range(len(rows)))  # prompts still decoding, in the cache's order
        parts = [beams.prefill(row, search.ids) for row, search in zip(rows, searches)]
        beams.stack([part[1:] for part in parts])
        logits = [part[0] for part in parts]
        fed = [None] * len(rows)
        while active:
            pads = beams.pads()
            cands = [searches[b].begin(logits[i], fed[i]) for i, b in enumerate(active)]
            # U:3382-3411: each candidate appended to the step's cache; its last-layer row (max over heads). The
            # release runs one forward per candidate; here up to CANDIDATES_PER_FORWARD of each beam's go in one
            # forward, the cache repeated for each (row r * m + c: beam row r, candidate c), where every cache
            # layer can be repeated (else one forward each)
            n = cands[0].shape[1]
            mark = _CacheMark(beams.cache)  # the release's cache is a tuple the candidate forward never extends
            chunk = CANDIDATES_PER_FORWARD if _repeatable(beams.cache) else 1
            cand_rows: list = [[] for _ in active]
            for c in range(0, n, chunk):
                m = min(chunk, n - c)
                beams.peek(torch.cat([cand[:, c: c + m].reshape(k * m, 1) for cand in cands]), m)
                mark.restore()
                probs = tap.probs.max(1, keepdim=True).values  # [rows * m, 1, 1, keys]
                for i in range(len(active)):
                    cand_rows[i].append(probs[i * k * m: (i + 1) * k * m, ..., pads[i]:].reshape(k, m, 1, -1))
            index, still = [], []
            for i, b in enumerate(active):

                def rebuild(ids, i=i, b=b):
                    out, *part = beams.rebuild(rows[b], ids, visual_ids)
                    beams.splice(i, part)
                    return out

                beam_idx = searches[b].step(torch.cat(cand_rows[i], 1), rebuild, eos, pad, min_new_tokens, st)
                if searches[b].done:
                    results[b] = searches[b].finalize(eos)
                else:
                    index.append(i * k + beam_idx)
                    still.append(b)
            active = still
            if not active:
                break
            beams.select(torch.cat(index))
            ids = torch.cat([searches[b].ids[:, -1:] for b in active])  # [rows, 1] the fed tokens
            out = beams.feed(ids)
            probs = tap.probs.max(1, keepdim=True).values  # [rows, 1, 1, keys]
            pads = beams.pads()
            logits = [out[i * k: (i + 1) * k] for i in range(len(active))]
            fed = [probs[i * k: (i + 1) * k, ..., pads[i]:] for i in range(len(active))]
    return results


def opera_beam_search(model, inputs: dict, max_new_tokens: int, config: OPERAConfig | None = None, *,
                      eos_token_id: list[int] | int | None = None, pad_token_id: int | None = None,
                      min_new_tokens: int = 0, length_penalty: float = 1.0, early_stopping=False,
                      stats: dict | None = None, trace: list | None = None) -> tuple[torch.Tensor, float]:
    """OPERA's beam search on one prompt (``inputs``: ``input_ids`` [1, P] without padding, the image inputs,
    the per-token inputs the table names, e.g. ``mm_token_type_ids`` for Qwen-VL). Returns the generated ids [new]
    (an eos appended when the best beam ended early, as 4.29.2's ``finalize``) and the best beam's normalised score.
    ``stats`` (a dict of counters) and ``trace`` (a list: one dict per beam step) are filled when given."""
    if isinstance(eos_token_id, int):
        eos_token_id = [eos_token_id]
    eos = list(eos_token_id or [])
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    st = stats if stats is not None else {}
    for key in COUNTERS:
        st.setdefault(key, 0)
    (result,) = _decode(model, [inputs], max_new_tokens, config or OPERAConfig(), eos=eos, pad=pad,
                        min_new_tokens=min_new_tokens, length_penalty=length_penalty, early_stopping=early_stopping,
                        st=st, traces=None if trace is None else [trace])
    return result


# ----------------------------------------------------------------------------- batches


_PER_ROW = ("batch_num_images",)  # image inputs with one entry per prompt row (LLaVA-OneVision's images per row)


def _runs(ids: torch.Tensor, token: int) -> list[int]:
    """Lengths of the runs of ``token`` in ``ids`` [T], in order."""
    hit = (ids == token).int()
    edges = torch.diff(hit, prepend=hit.new_zeros(1), append=hit.new_zeros(1))  # +1 where a run starts, -1 after it
    return (edges.eq(-1).nonzero().flatten() - edges.eq(1).nonzero().flatten()).tolist()


def _per_image(model, spec, images: dict, runs: list[int]) -> tuple[list[int], list[int]]:
    """(image tokens, pixel_values entries) of each image of the batch, in order, as the table row's ``image_layout``
    says; ``runs`` are the prompts' runs of image tokens, row after row."""
    pixels = images["pixel_values"]
    n = pixels.shape[0]
    if spec.image_layout == "grid":  # image i has prod(grid_i) patch rows and prod(grid_i) / merge^2 tokens
        merge = getattr(model.config.vision_config, "spatial_merge_size", 2)
        patches = [int(g.prod()) for g in images["image_grid_thw"]]
        return [p // merge ** 2 for p in patches], patches
    if spec.image_layout == "per_image":  # every image gives the same number of tokens
        total = sum(runs)
        if total % n:
            raise ValueError(f"{total} image tokens do not split over {n} images")
        return [total // n] * n, [1] * n
    if spec.image_layout == "sizes":  # Pixtral: a token per (patch * merge)^2 pixels of the image's own size
        step = model.config.vision_config.patch_size * getattr(model.config, "spatial_merge_size", 1)
        return [int(h) // step * (int(w) // step) for h, w in images["image_sizes"].tolist()], [1] * n
    if spec.image_layout == "tiles":  # one run per image, the same tokens per tile
        if sum(runs) % n:
            raise ValueError(f"{sum(runs)} image tokens do not split over {n} tiles")
        per_tile = sum(runs) // n
        if any(r % per_tile for r in runs):
            raise ValueError(f"runs of image tokens {runs} are not whole tiles of {per_tile} tokens")
        return runs, [r // per_tile for r in runs]
    if spec.image_layout == "runs":  # one run per image
        if len(runs) != n:
            raise ValueError(f"{n} images given but the prompts hold {len(runs)} runs of image tokens: {spec.kind} "
                             "writes each image as one run, so OPERA splits the batch by them (images written "
                             "next to each other, with no token between, cannot be told apart)")
        return runs, [1] * n
    raise ValueError(f"OPERA cannot split {spec.kind}'s {spec.image_layout!r} image inputs by row")


def _split_rows(model, kwargs: dict, info) -> list[dict]:
    """Each row's inputs without its padding: ``input_ids`` and the per-token inputs where ``attention_mask`` is 1,
    and the row's own images, split as the table row's ``image_layout`` says: by prompt row where the inputs are
    batched so (``rows``), else consumed in order (a row holds as many images as its image tokens need)."""
    spec = info.spec
    ids = kwargs["input_ids"]
    mask = kwargs.get("attention_mask")
    mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    rows = []
    for b in range(ids.shape[0]):
        keep = mask[b]
        row = {"input_ids": ids[b][keep][None]}
        for key in spec.token_inputs:
            if kwargs.get(key) is not None:
                row[key] = kwargs[key][b][keep][None]
        rows.append(row)
    images = {k: kwargs[k] for k in spec.image_inputs if kwargs.get(k) is not None}
    if not images or spec.image_layout == "rows":  # [B, ...] each: a row's slice is its images
        for b, row in enumerate(rows):
            row.update({k: v[b: b + 1] for k, v in images.items()})
        return rows
    row_runs = [_runs(row["input_ids"][0], info.image_token_id) for row in rows]
    per_image, patches = _per_image(model, spec, images, [r for runs in row_runs for r in runs])
    img = patch = 0
    for b, row in enumerate(rows):
        first_img, first_patch, need = img, patch, sum(row_runs[b])
        while need > 0:
            if img >= len(per_image):
                raise ValueError(f"row {b}: more image tokens than the images given")
            need -= per_image[img]
            patch += patches[img]
            img += 1
        if need != 0:
            raise ValueError(f"row {b}: its image tokens do not match whole images")
        for key, value in images.items():  # pixel rows by entry, per-row inputs by row, the rest by image
            if key in _PER_ROW:
                if int(value[b]) != img - first_img:
                    raise ValueError(f"row {b}: {key} says {int(value[b])} images, its image tokens hold "
                                     f"{img - first_img}")
                row[key] = value[b: b + 1]
            else:
                row[key] = value[first_patch:patch] if key == "pixel_values" else value[first_img:img]
    if img != len(per_image):
        raise ValueError(f"{len(per_image)} images given but the prompts hold image tokens for {img}")
    return rows


class OPERA(Baseline):
    name = "opera"

    def __init__(self, config: OPERAConfig | None = None, **settings):
        super().__init__(config or OPERAConfig(**settings))

    def _install(self, model, stack) -> None:
        cfg = self.config
        info = arch_info(model)
        original = model.generate  # the class's bound method
        self._stats.compares_logits = False  # OPERA re-ranks beams: there is no single "logits before" per step
        counters = {"steps": 0, "candidate_forwards": 0, "rollbacks": 0, "rollback_forwards": 0,
                    "banned_candidates": 0, "delegated_rows": 0}
        self._stats.extra.update(counters)

        @functools.wraps(original)
        def generate(*args, **kwargs):
            if args:
                if len(args) > 1 or "input_ids" in kwargs or "inputs" in kwargs:
                    raise ValueError("OPERA's generate takes the inputs as keyword arguments (input_ids=...)")
                kwargs["input_ids"] = args[0]
            if "inputs" in kwargs:
                kwargs["input_ids"] = kwargs.pop("inputs")
            if kwargs.get("input_ids") is None:
                raise ValueError("OPERA's generate needs input_ids")
            opts = {k: kwargs.pop(k) for k in list(kwargs) if k in GENERATE_OPTIONS}
            if cfg.disabled:  # plain beam search: the model's own
                self._stats.rows += kwargs["input_ids"].shape[0]
                self._stats.extra["delegated_rows"] += kwargs["input_ids"].shape[0]
                return original(**kwargs, **{**opts, "num_beams": cfg.num_beams, "do_sample": False})
            return self._generate(model, info, kwargs, opts)

        model.generate = generate  # an instance attribute: the class's method comes back on exit
        stack.callback(lambda: model.__dict__.pop("generate", None))

    def _generate(self, model, info, kwargs: dict, opts: dict) -> torch.Tensor:
        unknown = sorted(k for k in kwargs if k not in ("input_ids", "attention_mask", *info.spec.token_inputs,
                                                        *info.spec.image_inputs))
        if unknown:
            raise ValueError(f"OPERA's generate does not take {unknown}")
        gc = copy.deepcopy(opts.pop("generation_config", None) or model.generation_config)
        for key in ("max_new_tokens", "min_new_tokens", "pad_token_id", "eos_token_id", "length_penalty",
                    "early_stopping", "num_return_sequences", "return_dict_in_generate", "do_sample", "max_length"):
            if key in opts and opts[key] is not None:
                setattr(gc, key, opts[key])
        if gc.do_sample:
            raise ValueError("OPERA is a beam search: do_sample must be False")
        if (gc.num_return_sequences or 1) != 1 or gc.return_dict_in_generate:
            raise ValueError("OPERA's generate returns one sequence per row as a tensor (num_return_sequences=1, "
                             "return_dict_in_generate=False)")
        ids = kwargs["input_ids"]
        if gc.max_new_tokens is not None:
            max_new = int(gc.max_new_tokens)
        else:
            max_new = int(gc.max_length) - ids.shape[1]  # HF: max_length counts the (padded) prompt
        if max_new < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new}")
        eos = gc.eos_token_id
        eos = [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]
        pad = gc.pad_token_id if gc.pad_token_id is not None else (eos[0] if eos else 0)
        counters = dict.fromkeys(COUNTERS, 0)
        rows = _split_rows(model, kwargs, info)
        outs = []
        for group in [rows] if _together(model) else [[row] for row in rows]:
            outs += [new for new, _ in _decode(model, group, max_new, self.config, eos=eos, pad=pad,
                                               min_new_tokens=int(gc.min_new_tokens or 0),
                                               length_penalty=1.0 if gc.length_penalty is None
                                               else float(gc.length_penalty),
                                               early_stopping=gc.early_stopping or False, st=counters)]
        self._stats.rows += len(outs)
        self._stats.forwards += counters.pop("forwards")
        self._stats.acted += counters["steps"]
        for key, value in counters.items():
            self._stats.extra[key] += value
        width = max(o.shape[0] for o in outs)
        out = torch.full((ids.shape[0], ids.shape[1] + width), pad, dtype=ids.dtype, device=ids.device)
        out[:, : ids.shape[1]] = ids
        for b, new in enumerate(outs):
            out[b, ids.shape[1]: ids.shape[1] + new.shape[0]] = new
        return out


__all__ = ["OPERA", "OPERAConfig", "opera_beam_search"]
