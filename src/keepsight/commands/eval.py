"""``keepsight eval``: answers of a model on any dataset, their scores, and CHAIR against MS-COCO.

    keepsight eval generate --model DIR --data SOURCE [--pvm DIR | --bridge | --diffusion [--mps] [--mrs]] --out FILE.jsonl
    keepsight eval score --pred FILE.jsonl [--kind exact|yesno|choice|numeric]
    keepsight eval chair --captions FILE.jsonl --coco DIR [--out FILE.json]

``generate`` writes one ``{"id", "prompt", "answer", "reference", "category"}`` per row of ``--data`` (any source
of ``keepsight.data.open_dataset``, or a world directory: its yes/no questions of every category), batched, by
the method's decoding (``keepsight.integrations.lmms_eval.KeepsightLMM``, the same code lmms-eval runs);
``score`` scores such a file overall and per category with 95% Wilson intervals.

CHAIR:
``FILE.jsonl`` holds one ``{"image_id": ..., "caption": ...}`` per line (see
``keepsight.metrics.coco_chair.read_captions_jsonl``); ``DIR`` is a COCO root or its ``annotations/``
folder. Prints CHAIRs, CHAIRi and recall and writes the full result, per-caption records included, as
JSON (default: the captions path with the suffix ``.chair.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm import tqdm

from ..atomic import check_output_file, write_json, write_text
from ..data import open_dataset, preflight
from ..integrations.lmms_eval import KeepsightLMM
from ..metrics.answers import KINDS, score_records
from ..metrics.coco_chair import coco_chair, load_coco_ground_truth, read_captions_jsonl
from ..world.dataset import is_world
from ..world.tasks import VLMDataset
from .options import DATA_HELP, nonneg_int, positive_int, read_samples


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
    generate_parser(ev_sub)
    score_parser(ev_sub)
    return ev


def generate_parser(ev_sub) -> None:
    g = ev_sub.add_parser("generate", help="answers of a model (with a keepsight method) to every row of a dataset")
    g.add_argument("--model", required=True, help="checkpoint directory (any supported architecture)")
    g.add_argument("--data", required=True, help=DATA_HELP + "; a world directory gives its yes/no questions")
    g.add_argument("--image-folder", help="where relative image paths of --data resolve (default: its directory)")
    g.add_argument("--skip-bad-rows", action="store_true", help="leave out rows the pre-flight check finds bad")
    g.add_argument("--out", required=True, type=Path, help="predictions JSONL")
    method = g.add_mutually_exclusive_group()
    method.add_argument("--pvm", help="a PVM adapter directory to apply")
    method.add_argument("--bridge", action="store_true", help="the model is bridge-converted (checked)")
    method.add_argument("--diffusion", action="store_true", help="a masked-diffusion VLM, LLaDA-style sampler")
    g.add_argument("--mps", nargs="?", const="{}", help='diffusion: Mask Prior Suppression, optional JSON settings '
                   '(default: the paper\'s, {"k": 3, "lam": 0.1})')
    g.add_argument("--mrs", nargs="?", const="{}", help='diffusion: Monotonic RoPE Scaling, optional JSON settings '
                   '(default: the paper\'s, {"beta": 0.01, "eta": 8, "tau0": 0.6})')
    g.add_argument("--steps", type=positive_int, help="diffusion: denoising steps (default: one per token)")
    g.add_argument("--block-length", type=positive_int, help="diffusion: semi-autoregressive block")
    g.add_argument("--max-new-tokens", type=positive_int, default=64)
    g.add_argument("--batch-size", type=positive_int, default=8)
    g.add_argument("--limit", type=positive_int, help="the first N rows only")
    g.add_argument("--system-prompt", help="a system turn for rows without one")
    g.add_argument("--dtype", default="auto")
    g.add_argument("--device", default="auto")
    g.add_argument("--seed", type=nonneg_int, default=0, help="diffusion sampling")
    g.set_defaults(func=run_generate)


def score_parser(ev_sub) -> None:
    sc = ev_sub.add_parser("score", help="accuracy of a predictions JSONL overall and per category")
    sc.add_argument("--pred", required=True, type=Path, help="JSONL from keepsight eval generate (answer, reference)")
    sc.add_argument("--kind", default="exact", choices=KINDS, help="how an answer matches its reference")
    sc.add_argument("--out", type=Path, help="result JSON (default: the predictions path with suffix .score.json)")
    sc.set_defaults(func=run_score)


def _settings(name: str, text: str | None) -> dict | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--{name} {text!r} is not JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--{name} takes a JSON object of settings, got {text!r}")
    return value or True


def eval_dataset(args):
    """``--data`` as a dataset with ``category(i)``: a world's yes/no questions (every category), or a user's
    source after the pre-flight check."""
    if is_world(args.data):
        samples = read_samples(args.data)
        return VLMDataset(samples, ("yes_no",), 0, yes_no_categories=6)
    ds, report = preflight(open_dataset(args.data, args.image_folder), args.skip_bad_rows, need_answers=False)
    print(f"pre-flight of {args.data}: {report.line()}", flush=True)
    return ds


def run_generate(args) -> int:
    out = check_output_file(args.out, "--out", inputs=[args.model, args.data, args.pvm])
    if (args.mps or args.mrs or args.steps or args.block_length) and not args.diffusion:
        raise ValueError("--mps, --mrs, --steps and --block-length are for --diffusion")
    method = "pvm" if args.pvm else "bridge" if args.bridge else "diffusion" if args.diffusion else "none"
    lmm = KeepsightLMM(pretrained=args.model, method=method, pvm=args.pvm, mps=_settings("mps", args.mps),
                       mrs=_settings("mrs", args.mrs), dtype=args.dtype, device=args.device,
                       batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, steps=args.steps,
                       block_length=args.block_length, seed=args.seed, system_prompt=args.system_prompt)
    data = eval_dataset(args)
    n = min(len(data), args.limit or len(data))
    records = []
    with tqdm(total=n, desc="keepsight eval generate") as bar:
        for start in range(0, n, args.batch_size):
            rows = [data[i] for i in range(start, min(n, start + args.batch_size))]
            answers = lmm.generate_samples(rows, {"max_new_tokens": args.max_new_tokens})
            for k, (sample, answer) in enumerate(zip(rows, answers)):
                i = start + k
                category = data.category(i) if hasattr(data, "category") else None
                records.append({"id": sample.id or str(i), "prompt": sample.prompt, "answer": answer,
                                "reference": sample.answer, "category": category})
            bar.update(len(rows))
    write_text(out, "".join(json.dumps(r) + "\n" for r in records))
    print(f"{len(records)} answers in {out}")
    return 0


def read_predictions(path: Path) -> list[dict]:
    """The records of a predictions JSONL; malformed lines are errors naming ``path:line``."""
    if not path.is_file():
        raise FileNotFoundError(f"predictions file {path} does not exist")
    records = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(r, dict):
            raise ValueError(f"{path}:{lineno}: a {type(r).__name__}, not a JSON object")
        records.append(r)
    return records


def score_table(result: dict) -> str:
    rows = [("overall", result["overall"])] + list(result["categories"].items())
    lines = [f"{'':<14}{'n':>6}{'accuracy':>10}  95% interval"]
    lines += [f"{name:<14}{r['n']:>6}{r['accuracy']:>10.3f}  [{r['low']:.3f}, {r['high']:.3f}]" for name, r in rows]
    if "yes_ratio" in result:
        lines.append(f"yes-ratio {result['yes_ratio']:.3f}; answers without yes / no: {result['unparsed']}")
    return "\n".join(lines)


def run_score(args) -> int:
    out = check_output_file(args.out or args.pred.with_suffix(".score.json"), "--out", inputs=[args.pred])
    records = read_predictions(args.pred)
    missing = [r.get("id") for r in records if r.get("reference") is None]
    if missing:
        raise ValueError(f"{len(missing)} predictions have no reference (e.g. id {missing[0]!r}): their rows had no "
                         "answer to score against")
    result = score_records(records, args.kind)
    write_json(out, {"predictions": str(args.pred), **result})
    print(score_table(result))
    print(f"wrote {out}")
    return 0


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
