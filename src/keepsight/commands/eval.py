"""``keepsight eval chair``: CHAIR of generated captions against local MS-COCO annotations.

    keepsight eval chair --captions FILE.jsonl --coco DIR [--out FILE.json]

``FILE.jsonl`` holds one ``{"image_id": ..., "caption": ...}`` per line (see
``keepsight.metrics.coco_chair.read_captions_jsonl``); ``DIR`` is a COCO root or its ``annotations/``
folder. Prints CHAIRs, CHAIRi and recall and writes the full result, per-caption records included, as
JSON (default: the captions path with the suffix ``.chair.json``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..atomic import check_output_file, write_json
from ..metrics.coco_chair import coco_chair, load_coco_ground_truth, read_captions_jsonl


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``eval`` (subcommands under ``eval_command``) with its ``chair`` subcommand; return ``eval``."""
    ev = subparsers.add_parser("eval", help="evaluate generated text on standard benchmarks")
    ev_sub = ev.add_subparsers(dest="eval_command", required=True)
    ch = ev_sub.add_parser(
        "chair", help="CHAIRs / CHAIRi / recall of captions against MS-COCO annotations (Rohrbach et al. 2018)"
    )
    ch.add_argument("--captions", required=True, type=Path,
                    help='JSONL, one {"image_id": int, "caption": str} per line ("text"/"answer" also read)')
    ch.add_argument("--coco", required=True, type=Path,
                    help="COCO root or annotations dir with instances_* and captions_* {train,val}2014 JSON")
    ch.add_argument("--out", type=Path, default=None,
                    help="result JSON (default: the captions path with suffix .chair.json)")
    ch.set_defaults(func=run)
    return ev


def default_out(captions: Path) -> Path:
    """``runs/x/caps.jsonl`` -> ``runs/x/caps.chair.json``."""
    return captions.with_suffix(".chair.json")


def format_table(result: dict) -> str:
    """The three metrics as an aligned table (percentages), then the counts."""
    rows = [("CHAIRs", result["CHAIRs"]), ("CHAIRi", result["CHAIRi"]), ("recall", result["recall"])]
    lines = [f"{'metric':<8}{'value (%)':>10}"] + [f"{name:<8}{100 * v:>10.2f}" for name, v in rows]
    lines.append(
        f"captions {result['n_captions']}, mentions {result['n_mentions']}, "
        f"hallucinated {result['n_hallucinated']}, mean length {result['mean_length']:.1f} words"
    )
    return "\n".join(lines)


def run(args) -> int:
    out = check_output_file(args.out or default_out(args.captions), "--out", inputs=[args.captions])
    captions = read_captions_jsonl(args.captions)
    gt = load_coco_ground_truth(args.coco, image_ids={c["image_id"] for c in captions})
    result = coco_chair(captions, gt)
    write_json(out, {"captions_file": str(args.captions), "coco": str(args.coco), **result})
    print(format_table(result))
    print(f"wrote {out}")
    return 0
