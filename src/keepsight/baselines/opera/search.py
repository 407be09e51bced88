"""OPERA's beam search (the release's ``opera_beam_search``), one prompt's state and step in ``_Search``, several
prompts decoded together in ``_decode``."""

from __future__ import annotations

import copy

import torch

from ...models.arch import arch_info, rope_state_kept
from .beams import _AttentionTap, _Beams, _CacheMark, _repeatable
from .config import OPERAConfig
from .rows import _Row
from .scorer import _BeamScorer

WINDOW = 512  # U:3134 ``window_size``: sizes the history buffers; generate() never forwards it (U:1648-1665)
FIRST = 10  # U:3440 ``cur_response_lens <= 10``: image-attention bonus; U:3460 ``rollback_loc < 10``: no rollback
FLOOR = -999.0  # U:3543-3552 / U:3556: the floor of rejected and non-candidate tokens
# candidates scored in one forward (the beams' cache repeated for each): the release runs one forward per candidate;
# a row of the batch computes what it computes alone, so the tokens are the release's (the parity fixtures); every
# token a candidate (num_attn_candidates None) goes in forwards of this many
CANDIDATES_PER_FORWARD = 8
COUNTERS = ("forwards", "steps", "candidate_forwards", "rollbacks", "rollback_forwards", "banned_candidates")


def _replay(rows: list, k: int, prompt: int, dtype, device) -> torch.Tensor:
    """The response rows of the release's ``attn_previous`` after the logged steps: each step pads a zero key column,
    reorders the rows with the beams and appends the fed token's row (U:3348-3357). [K, 1, t, P + t]."""
    out = torch.zeros(k, 1, 0, prompt, dtype=dtype, device=device)
    for beam_idx, row in rows:
        out = torch.cat([out, torch.zeros_like(out).sum(-1, keepdim=True)], -1)[beam_idx]
        out = torch.cat([out, row], -2)
    return out


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
        fed_probs = None  # the last forward's last-layer attention, max over heads [rows, 1, 1, keys] (none: prefill)
        while active:
            pads = beams.pads()
            fed = [None if fed_probs is None else fed_probs[i * k: (i + 1) * k, ..., pads[i]:]
                   for i in range(len(active))]
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
            fed_probs = tap.probs.max(1, keepdim=True).values
            logits = [out[i * k: (i + 1) * k] for i in range(len(active))]
    return results


def ends(eos_token_id, pad_token_id) -> tuple[list[int], int]:
    """The eos ids as a list (from None, one id or several) and the pad id (the first eos where none is given, else
    0)."""
    ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id
    eos = [int(e) for e in ids]
    return eos, pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)


def opera_beam_search(model, inputs: dict, max_new_tokens: int, config: OPERAConfig | None = None, *,
                      eos_token_id: list[int] | int | None = None, pad_token_id: int | None = None,
                      min_new_tokens: int = 0, length_penalty: float = 1.0, early_stopping=False,
                      stats: dict | None = None, trace: list | None = None) -> tuple[torch.Tensor, float]:
    """OPERA's beam search on one prompt (``inputs``: ``input_ids`` [1, P] without padding, the image inputs,
    the per-token inputs the table names, e.g. ``mm_token_type_ids`` for Qwen-VL). Returns the generated ids [new]
    (an eos appended when the best beam ended early, as 4.29.2's ``finalize``) and the best beam's normalised score.
    ``stats`` (a dict of counters) and ``trace`` (a list: one dict per beam step) are filled when given."""
    eos, pad = ends(eos_token_id, pad_token_id)
    st = stats if stats is not None else {}
    for key in COUNTERS:
        st.setdefault(key, 0)
    (result,) = _decode(model, [inputs], max_new_tokens, config or OPERAConfig(), eos=eos, pad=pad,
                        min_new_tokens=min_new_tokens, length_penalty=length_penalty, early_stopping=early_stopping,
                        st=st, traces=None if trace is None else [trace])
    return result
