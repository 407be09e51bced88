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

The package: ``config`` (``OPERAConfig``), ``scorer`` (4.29.2's beam scorer), ``rows`` (a batch split into its
prompts), ``beams`` (the forwards: prompts' beams in one cache, a candidate undone, the attention read), ``search``
(the release's step per prompt, the prompts decoded together), ``method`` (``OPERA``, in place of ``generate``).
"""

from ...methods import register_method
from .config import OPERAConfig
from .method import OPERA
from .search import opera_beam_search

register_method("opera", OPERAConfig, OPERA, family="autoregressive",
                needs="nothing (replaces generate with its beam search)")

__all__ = ["OPERA", "OPERAConfig", "opera_beam_search"]
