"""Metrics (pure Python / torch): CHAIR, distinct-n, repetition, yes/no scores, dilution curve."""

from .chair import chair
from .coco_chair import coco_chair, load_coco_ground_truth, read_captions_jsonl
from .dilution import accuracy_by_index, early_late, least_squares_slope, slope
from .parse import parse_description
from .stats import mean_ci, paired_bootstrap, t95, wilson
from .text import distinct_n, rep_n, repetition_ratio
from .yesno import RULES as YES_NO_RULES
from .yesno import normalise_answer, parse_yes_no, yes_no_scores

__all__ = [
    "accuracy_by_index", "chair", "coco_chair", "load_coco_ground_truth", "read_captions_jsonl", "early_late", "least_squares_slope", "distinct_n", "normalise_answer", "parse_description", "parse_yes_no", "YES_NO_RULES", "rep_n",
    "repetition_ratio", "slope", "yes_no_scores", "mean_ci", "paired_bootstrap", "t95", "wilson",
]
