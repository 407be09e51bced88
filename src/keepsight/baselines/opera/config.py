"""OPERA's settings (``OPERAConfig``): the release's defaults, its efficient setting and its off setting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...checks import number

SCORED_PROMPT = ("llava", "embeds", "full")


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
