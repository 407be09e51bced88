"""``keepsight eval``: answers of a model on any dataset, their scores, and CHAIR against MS-COCO.

    keepsight eval generate --model DIR --data SOURCE [--pvm DIR | --bridge | --diffusion [--mps] [--mrs]] --out FILE.jsonl
    keepsight eval score --pred FILE.jsonl [--kind exact|yesno|choice|numeric]
    keepsight eval pope (--coco DIR | --questions FILE... --image-root DIR) --out DIR
                        (--model DIR [method options] | --answers FILE.jsonl) [--parser pope|keepsight|opera]
    keepsight eval chair --captions FILE.jsonl --coco DIR [--out FILE.json]

``generate`` writes one ``{"id", "prompt", "answer", "reference", "category"}`` per row of ``--data`` (any source
of ``keepsight.data.open_dataset``, or a world directory: its yes/no questions of every category), batched, by
the method's decoding (``keepsight.inference.Pipeline``, the same code lmms-eval runs);
``score`` scores such a file overall and per category with 95% Wilson intervals. ``pope`` builds POPE's
questions from local COCO instance annotations (``keepsight.metrics.pope``: random / popular / adversarial
negatives, seeded) or reads POPE's published question files (``--questions``), answers them with the model
(greedy) or reads a given answers file, parses the answers by POPE's own rule (``--parser``, default
``pope``) and reports accuracy (with a 95% Wilson interval), precision, recall, F1, yes-ratio and the
TP/FP/TN/FN counts per strategy.

CHAIR:
``FILE.jsonl`` holds one ``{"image_id": ..., "caption": ...}`` per line (see
``keepsight.metrics.coco_chair.read_captions_jsonl``); ``DIR`` is a COCO root or its ``annotations/``
folder. Prints CHAIRs, CHAIRi and recall and writes the full result, per-caption records included, as
JSON (default: the captions path with the suffix ``.chair.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tqdm import tqdm

from ..atomic import (
    atomic_save_dir,
    check_output_dir,
    check_output_file,
    write_json,
    write_output_json,
    write_output_text,
    write_text,
)
from ..data import Sample, open_dataset, open_image, preflight
from ..diffusion.sampler import SCHEDULE_SETTINGS
from ..inference import Pipeline, method_names
from ..inference.pipeline import pipeline_defaults
from ..inference.settings import DecodeSettings
from ..jsonl import read_jsonl
from ..metrics.answers import KINDS, score_records
from ..metrics.coco_chair import coco_chair, load_coco_ground_truth, read_captions_jsonl
from ..metrics.pope import (
    PARSERS,
    POPE_STRATEGIES,
    build_pope_questions,
    load_coco_instances,
    parser_name,
    pope_scores,
    read_answers_jsonl,
    read_pope_question_files,
)
from ..world.dataset import is_world
from ..world.tasks import VLMDataset
from .config_options import add_config_options, given_settings, short_option
from .method_options import (
    add_method_options,
    baseline_choice,
    diffusion_methods,
    sampler_settings,
)
from .options import (
    bounded_int,
    data_args,
    output_file_args,
    positive_int,
    read_samples,
    short_options,
)

POPE_KIND = "pope"
DECODE_PREFIX = "decode"  # the decoding settings' options: every one under its short spelling (--max-new-tokens)
DECODE_SHORT = short_options(*(f.name for f in dataclasses.fields(DecodeSettings)), training=False)


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
    output_file_args(ch, "result JSON (default: the captions path with suffix .chair.json)")
    ch.set_defaults(func=run)
    generate_parser(ev_sub)
    score_parser(ev_sub)
    pope_parser(ev_sub)
    return ev


def method_args(g, required_model: bool = True) -> None:
    """The model, its method and the decoding options (``eval generate`` and ``eval pope``); the decoding methods'
    options come last (``add_method_options``), after every option of the command's own."""
    g.add_argument("--model", required=required_model, help="checkpoint directory (any supported architecture)")
    method = g.add_mutually_exclusive_group()
    method.add_argument("--pvm", help="a PVM adapter directory to apply")
    method.add_argument("--bridge", action="store_true", help="the model is bridge-converted (checked)")
    method.add_argument("--diffusion", action="store_true", help="a masked-diffusion VLM, LLaDA-style sampler")
    default = pipeline_defaults()  # the one place each is written
    g.add_argument("--batch-size", type=positive_int, default=8, help="rows decoded together (default: %(default)s)")
    g.add_argument("--dtype", default=default["dtype"], help="the weights' dtype (default: %(default)s)")
    g.add_argument("--device", default=default["device"], help="(default: %(default)s)")
    add_config_options(g, DECODE_PREFIX, DecodeSettings, short=DECODE_SHORT, title="decoding")


def decode_settings(args) -> DecodeSettings:
    """The decoding settings the command line gave, the others their defaults."""
    return DecodeSettings(**given_settings(args, DECODE_PREFIX, DecodeSettings))


def load_method(args) -> Pipeline:
    """The model with its method (``keepsight.inference.Pipeline``: the same loading and decoding lmms-eval runs)."""
    decoding, sampler = diffusion_methods(args), sampler_settings(args)
    decode = given_settings(args, DECODE_PREFIX, DecodeSettings)
    if (decoding or sampler or set(decode) & set(SCHEDULE_SETTINGS)) and not args.diffusion:
        switches = ", ".join(f"--{n}" for n in method_names("decode", "diffusion"))
        schedule = ", ".join(short_option(n) for n in SCHEDULE_SETTINGS)
        raise ValueError(f"{switches} (and their options), --sampler.* and {schedule} are for --diffusion")
    method = "pvm" if args.pvm else "bridge" if args.bridge else "diffusion" if args.diffusion else "none"
    baseline, baseline_args = baseline_choice(args)
    return Pipeline(args.model, method=method, pvm=args.pvm, decoding=decoding, dtype=args.dtype,
                    device=args.device, baseline=baseline, baseline_args=baseline_args or None, sampler=sampler,
                    **decode)


def generate_parser(ev_sub) -> None:
    g = ev_sub.add_parser("generate", help="answers of a model (with a keepsight method) to every row of a dataset")
    method_args(g)
    data_args(g, "a world directory gives its yes/no questions")
    g.add_argument("--skip-bad-rows", action="store_true", help="leave out rows the pre-flight check finds bad")
    output_file_args(g, "predictions JSONL", required=True)
    g.add_argument("--limit", type=positive_int, help="the first N rows only")
    add_method_options(g, ("autoregressive", "diffusion"))  # with the sampler's options
    g.set_defaults(func=run_generate)


def score_parser(ev_sub) -> None:
    sc = ev_sub.add_parser("score", help="accuracy of a predictions JSONL overall and per category")
    sc.add_argument("--pred", required=True, type=Path, help="JSONL from keepsight eval generate (answer, reference)")
    sc.add_argument("--kind", default="exact", choices=KINDS, help="how an answer matches its reference")
    output_file_args(sc, "result JSON (default: the predictions path with suffix .score.json)")
    sc.set_defaults(func=run_score)


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
    out = check_output_file(args.out, "--out", inputs=[args.model, args.data, args.pvm], overwrite=args.overwrite,
                            kind="predictions")
    data = eval_dataset(args)  # the data's problems before the model's loading time
    lmm = load_method(args)
    n = min(len(data), args.limit or len(data))
    records = []
    with tqdm(total=n, desc="keepsight eval generate") as bar:
        for start in range(0, n, args.batch_size):
            rows = [data[i] for i in range(start, min(n, start + args.batch_size))]
            answers = lmm.generate_samples(rows)
            for k, (sample, answer) in enumerate(zip(rows, answers)):
                i = start + k
                category = data.category(i) if hasattr(data, "category") else None
                records.append({"id": sample.id or str(i), "prompt": sample.prompt, "answer": answer,
                                "reference": sample.answer, "category": category})
            bar.update(len(rows))
    write_output_text(out, "".join(json.dumps(r) + "\n" for r in records), "predictions")
    print(f"{len(records)} answers in {out}")
    return 0


def read_predictions(path: Path) -> list[dict]:
    """The records of a predictions JSONL; malformed lines are errors naming ``path:line``."""
    if not path.is_file():
        raise FileNotFoundError(f"predictions file {path} does not exist")
    return [r for _, r in read_jsonl(path, "predictions")]


def score_table(result: dict) -> str:
    rows = [("overall", result["overall"])] + list(result["categories"].items())
    lines = [f"{'':<14}{'n':>6}{'accuracy':>10}  95% interval"]
    lines += [f"{name:<14}{r['n']:>6}{r['accuracy']:>10.3f}  [{r['low']:.3f}, {r['high']:.3f}]" for name, r in rows]
    if "yes_ratio" in result:
        lines.append(f"yes-ratio {result['yes_ratio']:.3f}; answers without yes / no: {result['unparsed']}")
    return "\n".join(lines)


def run_score(args) -> int:
    out = check_output_file(args.out or args.pred.with_suffix(".score.json"), "--out", inputs=[args.pred],
                            overwrite=args.overwrite, kind="scores")
    records = read_predictions(args.pred)
    if not records:
        raise ValueError(f"--pred {args.pred}: no predictions to score")
    # one question twice (the same id and prompt) would be scored twice; several questions under one id are fine
    keys = [(str(r.get("id")), str(r.get("prompt"))) for r in records if r.get("id") is not None]
    twice = sorted({k[0] for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"--pred {args.pred}: ids {twice[:5]} appear more than once with the same prompt; each "
                         "would be scored twice (drop the duplicated rows)")
    missing = [r.get("id") for r in records if r.get("reference") is None]
    if missing:
        raise ValueError(f"{len(missing)} predictions have no reference (e.g. id {missing[0]!r}): their rows had no "
                         "answer to score against")
    result = score_records(records, args.kind)
    write_output_json(out, {"predictions": str(args.pred), **result}, "scores")
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
    out = check_output_file(args.out or default_out(args.captions), "--out", inputs=[args.captions],
                            overwrite=args.overwrite, kind="chair")
    captions = read_captions_jsonl(args.captions)
    gt = load_coco_ground_truth(args.coco, image_ids={c["image_id"] for c in captions})
    result = coco_chair(captions, gt)
    write_output_json(out, {"captions_file": str(args.captions), "coco": str(args.coco), **result}, "chair")
    print(format_table(result))
    print(f"wrote {out}")
    return 0


# ----------------------------------------------------------------------------- POPE


def _parser_name(text: str) -> str:
    try:
        return parser_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def pope_parser(ev_sub) -> None:
    pp = ev_sub.add_parser("pope", help="POPE (Li et al. 2023): questions built from local COCO instance "
                           "annotations, or read from POPE's published question files")
    src = pp.add_argument_group("questions (one of --coco / --questions)")
    src.add_argument("--coco", type=Path, help="build the questions: COCO root, its annotations/ folder, or an "
                     "instances JSON file")
    src.add_argument("--questions", type=Path, nargs="+", action="extend", metavar="FILE",
                     help="read the questions from POPE's published files (coco_pope_{random,popular,adversarial}"
                     ".json: JSON Lines of {question_id, image, text, label}); repeatable; each file's strategy is "
                     "the one in its name. Needs --image-root to run a model")
    pp.add_argument("--split", help="--coco: instances_{split}2014.json (or 2017) (default: val)")
    pp.add_argument("--image-root", type=Path, help="where the images' file names resolve (--questions: required "
                    "with --model; --coco: default the first of COCO/{split}2014, COCO/images/{split}2014, "
                    "COCO/{split}2017, COCO that holds them)")
    pp.add_argument("--images", type=bounded_int(1, 1_000_000), help="--coco: images drawn (default, as POPE: 500)")
    pp.add_argument("--per-image", type=bounded_int(1, 40), help="--coco: yes (and no) questions per image "
                    "(default 3)")
    pp.add_argument("--strategies", nargs="+", choices=list(POPE_STRATEGIES), help="--coco: negative sampling "
                    "(default: all three)")
    pp.add_argument("--parser", "--rule", dest="parser", default="pope", type=_parser_name,
                    metavar="{" + ",".join(PARSERS) + "}",
                    help="answer -> yes/no: pope = POPE's evaluate.py exactly (default; first sentence, exact "
                    "case-sensitive No/no/not, anything else yes), keepsight = the first yes / no / not word "
                    "(none: unparsed, counted as no; formerly 'first'), opera = OPERA's pope_eval.py "
                    "(No/no/NO/not or a word ending in n't, whole answer)")
    pp.add_argument("--answers", type=Path, help="score this answers JSONL ({question_id, answer}) instead of "
                    "running a model (with one --questions file the file's own question ids work too)")
    pp.add_argument("--out", required=True, type=Path, help="directory: questions.jsonl, answers.jsonl, scores.json")
    pp.add_argument("--overwrite", action="store_true", help="replace an earlier eval pope's --out (kept whole until "
                    "the new one is complete)")
    method_args(pp, required_model=False)
    add_method_options(pp, ("autoregressive", "diffusion"))
    pp.set_defaults(func=run_pope)


def _image_root(args, records: list[dict]) -> Path:
    if args.image_root is not None:
        return args.image_root
    coco = args.coco if args.coco.is_dir() else args.coco.parent
    roots = [coco / f"{args.split}2014", coco / "images" / f"{args.split}2014", coco / f"{args.split}2017",
             coco / "images" / f"{args.split}2017", coco, coco.parent / f"{args.split}2014"]
    first = records[0]["image"]
    for root in roots:
        if (root / first).is_file():
            return root
    raise FileNotFoundError(f"image {first} is in none of {[str(r) for r in roots]}; pass --image-root")


def pope_table(scores: dict) -> str:
    keys = [k for k in scores if k != "all"] + ["all"]
    lines = [f"{'strategy':<12}{'n':>6}{'accuracy':>10}  {'95% interval':<16}{'precision':>9}{'recall':>8}{'F1':>8}"
             f"{'yes-ratio':>11}{'unparsed':>10}"]
    for k in keys:
        r = scores[k]
        lines.append(f"{k:<12}{r['n']:>6}{r['accuracy']:>10.4f}  [{r['accuracy_low']:.3f}, {r['accuracy_high']:.3f}]"
                     f"{r['precision']:>9.4f}{r['recall']:>8.4f}{r['f1']:>8.4f}{r['yes_ratio']:>11.4f}"
                     f"{r['n_unparsed']:>10}")
    return "\n".join(lines)


def _pope_answers_for(records: list[dict], answers: dict, n_files: int) -> dict:
    """``answers`` keyed by keepsight's question ids; with one published question file, an answers file keyed by
    that file's own ids (``pope_question_id``: POPE's integers) is re-keyed."""
    if n_files == 1 and not any(r["question_id"] in answers for r in records):
        own = {r["pope_question_id"]: r["question_id"] for r in records}
        if any(q in own for q in answers):
            return {own[q]: a for q, a in answers.items() if q in own}
    return answers


def run_pope(args) -> int:
    if (args.model is None) == (args.answers is None):
        raise ValueError("give --model (to answer the questions) or --answers (a file to score), not both or neither")
    if (args.coco is None) == (args.questions is None):
        raise ValueError("give --coco (to build the questions) or --questions (POPE's question files), not both or "
                         "neither")
    if args.questions is not None:
        given = [f"--{k.replace('_', '-')}" for k in ("split", "images", "per_image", "strategies")
                 if getattr(args, k) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: for questions built from --coco, not with --questions")
        if args.model is not None and args.image_root is None:
            raise ValueError("--questions with --model needs --image-root (the folder of the files' images)")
    else:
        args.split = args.split or "val"
        args.images = args.images or 500
        args.per_image = args.per_image or 3
        args.strategies = args.strategies or list(POPE_STRATEGIES)
    decode = decode_settings(args)  # checked before any reading
    inputs = [args.coco, args.model, args.answers, *(args.questions or [])]
    out = check_output_dir(args.out, "--out", kinds=(POPE_KIND,), inputs=[*inputs, args.image_root],
                           overwrite=args.overwrite)
    if args.questions is not None:  # every line checked (images too, when a model will read them) before loading
        records = read_pope_question_files(args.questions, image_root=args.image_root if args.model else None)
    else:
        instances = load_coco_instances(args.coco, split=args.split)
        built = build_pope_questions(instances, n_images=args.images, n_per_image=args.per_image,
                                     strategies=args.strategies, seed=decode.seed)
        records = [r for rs in built.values() for r in rs]
    if args.answers is not None:
        answers = read_answers_jsonl(args.answers)
        if args.questions is not None:
            answers = _pope_answers_for(records, answers, len(args.questions))
    else:
        lmm = load_method(args)
        root = _image_root(args, records)
        answers = {}
        with tqdm(total=len(records), desc="keepsight eval pope") as bar:
            for start in range(0, len(records), args.batch_size):
                chunk = records[start : start + args.batch_size]
                rows = [Sample.single_turn(r["question"], image=open_image(root / r["image"]), id=r["question_id"])
                        for r in chunk]
                for r, text in zip(chunk, lmm.generate_samples(rows)):
                    answers[r["question_id"]] = text
                bar.update(len(chunk))
    asked = {r["question_id"] for r in records}
    extra = sorted(str(q) for q in answers if q not in asked)
    if extra:
        print(f"keepsight: note: {len(extra)} answers are to questions not in this set (e.g. {extra[0]!r}); they are "
              "not scored (recorded as extra_answers in scores.json)", file=sys.stderr)
    scores = pope_scores(records, answers, rule=args.parser)
    if args.questions is not None:
        setup = {"questions": [str(q) for q in args.questions],
                 "image_root": str(args.image_root) if args.image_root else None}
    else:
        setup = {"coco": str(args.coco), "split": args.split, "images": args.images, "per_image": args.per_image,
                 "seed": decode.seed}
    result = {**setup, "parser": args.parser, "rule": args.parser, "model": args.model,
              "max_new_tokens": decode.max_new_tokens if args.model else None,
              "answers": str(args.answers) if args.answers else None, "extra_answers": len(extra), "scores": scores}

    def write(tmp: Path) -> None:  # the three files are published together: never scores beside another run's answers
        write_text(tmp / "questions.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        if args.answers is None:
            write_text(tmp / "answers.jsonl", "".join(json.dumps({"question_id": q, "answer": a}) + "\n"
                                                      for q, a in answers.items()))
        write_json(tmp / "scores.json", result)

    atomic_save_dir(out, write, kind=POPE_KIND)
    print(f"answers parsed by the {args.parser!r} rule")
    print(pope_table(scores))
    print(f"wrote {out}/questions.jsonl, scores.json" + ("" if args.answers else ", answers.jsonl"))
    return 0
