"""The beam scorer of transformers 4.29.2 (the release's), for one prompt."""

from __future__ import annotations

import torch


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
