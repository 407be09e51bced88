"""Metrics of any model's answers (pure Python): COCO CHAIR, POPE, distinct-n, repetition, yes/no scores, intervals.
The world's own (its description grammar, CHAIR against its scene graphs, the dilution curve) live in
``keepsight.world``."""

from .coco_chair import coco_chair, load_coco_ground_truth, read_captions_jsonl
from .stats import least_squares_slope, mean_ci, paired_bootstrap, t95, wilson
from .text import distinct_n, rep_n, repetition_ratio
from .yesno import RULES as YES_NO_RULES
from .yesno import normalise_answer, parse_yes_no, yes_no_scores

__all__ = [
    "coco_chair", "load_coco_ground_truth", "read_captions_jsonl", "least_squares_slope", "distinct_n",
    "normalise_answer", "parse_yes_no", "YES_NO_RULES", "rep_n", "repetition_ratio", "yes_no_scores", "mean_ci",
    "paired_bootstrap", "t95", "wilson",
]
