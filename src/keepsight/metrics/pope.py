"""POPE on MS-COCO (Li et al. 2023, "Evaluating Object Hallucination in Large Vision-Language Models").

POPE (Polling-based Object Probing Evaluation) asks yes/no questions "Is there a <object> in the image?"
about objects that are in the image (answer "yes") and objects that are not ("no"), and scores the answers
as a binary classification with "yes" the positive class. The negatives ("no" objects) are drawn three ways:

* ``random``: uniformly among the categories absent from the image;
* ``popular``: the categories that are most frequent (by the number of images containing them) and absent
  from the image, in frequency order;
* ``adversarial``: the categories that co-occur most often with the image's ground-truth objects and are
  absent from it, in co-occurrence order.

The reference is AoiDragon/POPE (``main.py``, ``utils.py``, ``evaluate.py``); this module is written from
its description and code, stdlib only, seeded and deterministic. The choices it makes, including those the
reference leaves open (marked "open"):

Ground truth. An image's objects are the COCO category names (``categories[].name`` as written in the
file, e.g. "dining table", "tv", "hair drier") of its instance annotations, crowd annotations included;
they are also the object names put in the questions. (The reference reads a precomputed list of objects per
image "collected from segmentations", after LisaAnne/Hallucination; captions are not used here.) The
candidate vocabulary for negatives is every category with at least one annotation anywhere in the file
(the reference uses the categories seen in the 500 sampled images; on COCO val2014 both are all 80).

Images. An image is eligible when it has at least ``n_per_image`` distinct present categories (the reference
keeps images with ``len(objects) >= sample_num``, i.e. >= 3) and at least ``n_per_image`` absent ones (so
every strategy can always ask as many "no" as "yes" questions: the set is balanced, n_per_image of each per
image and strategy). ``n_images`` of the eligible images (sorted by id) are drawn uniformly without
replacement with ``random.Random(seed)`` (the reference: ``random.sample``, unseeded) and listed by
increasing image id (open: the reference keeps the sampling order). Too few eligible images is a
``ValueError`` (the reference asserts). ``n_images=None`` takes every eligible image; ``image_ids`` gives
the images explicitly (used in the order given; each must be eligible; ``n_images`` is then ignored).

Positives (open). The reference takes the first ``sample_num`` objects of each image's list, whose order is
whatever the precomputed file had. Here ``positives="random"`` (default) draws ``n_per_image`` present
categories uniformly without replacement (same RNG, images in output order); ``positives="area"`` takes the
ones with the largest total annotated area (sum of ``area``, else bbox w*h; ties by category id). The same
images and the same positives are used for every strategy, as in the reference.

Frequencies and co-occurrences. Frequency = number of images containing the category; co-occurrence of a
and b = number of images containing both. As in the reference they are counted over the selected images
(``counts_from="selected"``); ``counts_from="all"`` counts over every image of the file instead. Ties in
frequency or co-occurrence are broken by increasing COCO category id (open: the reference's stable sort
keeps the order in which objects first appear in its file).

Negatives. Per image, never a present category and never the same one twice.

* random: ``n_per_image`` categories drawn uniformly without replacement from the absent vocabulary (the
  reference's rejection sampling of ``random.choice`` has the same distribution).
* popular: the first ``n_per_image`` absent categories in frequency order (frequency descending, then
  category id). Never short, by eligibility.
* adversarial, ``adversarial="per_object"`` (default, the reference's code and its published files): the
  i-th negative is paired with the i-th positive p: the absent, not yet asked category that co-occurs most
  often with p (co-occurrence > 0); when p has no such category left (it co-occurs only with present or
  already asked ones) the negative is drawn uniformly from the remaining absent categories, as the
  reference's fallback does. ``adversarial="pooled"`` follows the paper's wording instead: absent categories
  ranked by their co-occurrence summed over *all* the image's present categories, the top ``n_per_image``
  with a positive score, topped up uniformly at random from the remaining absent ones if fewer.

Random draws for the negatives (random, and the adversarial fallback) use ``random.Random(f"{seed}:{name}")``
per strategy, so a strategy's questions do not depend on which other strategies are built.

Questions. "Is there a {object} in the image?", with "an" before a vowel-initial name ("Is there an oven in
the image?", as in the reference's published files). Per image the records alternate positive, negative
(yes, no, yes, no, ...), as in the reference. ``question_id`` is ``f"{strategy}-{k}"`` with k counting from
0 within the strategy (the reference numbers each strategy's file from 0), unique across strategies.

Parsing answers (``parse_yes_no`` of ``keepsight.metrics.yesno``, the one yes / no parser), three of its named rules
(``PARSERS``):

* ``"pope"`` (default; the reference ``evaluate.py`` exactly, so numbers compare with published ones): keep
  the text before the first ".", drop commas, split on single spaces; "no" when one of the tokens is exactly
  "No", "not" or "no" (case-sensitive: "NO", "Not", "no!" and "isn't" do not count), otherwise "yes". It
  never returns ``None``: anything else, the empty answer included, is a "yes" ("I cannot tell" too).
* ``"keepsight"`` (keepsight's earlier default, formerly called ``"first"``, which is still accepted): the
  first of the whole words "yes", "no", "not" (case-insensitive; words are runs of ASCII letters, so "isn't"
  and "cannot" are neither) decides: "yes" -> "yes", "no"/"not" -> "no"; ``None`` when none occurs.
* ``"opera"`` (OPERA's ``pope_eval.py`` ``recorder``): drop every "." and "," (no first-sentence cut), split
  on single spaces; "no" when a token is "No", "not", "no" or "NO" or ends in "n't", otherwise "yes" (never
  ``None``).

Scores (``pope_scores``). Positive class "yes"; the formulas are the reference's: accuracy = (TP+TN)/n,
precision = TP/(TP+FP), recall = TP/(TP+FN), F1 = 2PR/(P+R), yes_ratio = (TP+FP)/n, with the counts
``tp``/``fp``/``tn``/``fn``/``n`` and a 95% Wilson interval for accuracy (``accuracy_low``/``accuracy_high``,
``keepsight.metrics.stats.wilson``). An answer that does not parse (``None``, only under ``"keepsight"``) is
counted in ``n_unparsed`` and scored as "no" (wrong on a yes question, right on a no question). precision,
recall and F1 are 0.0 when their denominator is 0 (the reference divides by zero). Answers are matched to
questions by ``question_id`` (the reference pairs them by line order). Scores are per strategy
(``record["strategy"]``) plus "all", which pools every record (positives then count once per strategy).

Published question files (``read_pope_question_file``). The reference's ``output/coco/coco_pope_{random,
popular,adversarial}.json`` are JSON Lines (CRLF line endings in the repository), one ``{"question_id": int,
"image": "COCO_val2014_....jpg", "text": "Is there a ... in the image?", "label": "yes"|"no"}`` per line.
They are read into the records ``build_pope_questions`` makes, the file's strategy (the POPE strategy named
in the file name, else the file's stem) prefixed to the question id (``"random-1"``; the file's own id stays
in ``pope_question_id``) so that several files can be scored together.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..jsonl import read_jsonl
from .coco_chair import _SPLITS, _YEARS, _candidate_dirs, _load_json
from .stats import wilson
from .yesno import parse_yes_no, rule_name

#: The three negative-sampling strategies of POPE, in the paper's order.
POPE_STRATEGIES = ("random", "popular", "adversarial")
#: The question template (the article becomes "an" before a vowel, see ``pope_question``).
QUESTION_TEMPLATE = "Is there a {} in the image?"

_POSITIVES = ("random", "area")
_COUNTS_FROM = ("selected", "all")
_ADVERSARIAL = ("per_object", "pooled")
#: The answer parsers POPE offers (``metrics.yesno.parse_yes_no``): POPE's evaluate.py (the default), keepsight's
#: first yes / no / not word, OPERA's.
PARSERS = ("pope", "keepsight", "opera")

# ------------------------------------------------------------------------------------ annotations


def load_coco_instances(coco: str | os.PathLike, *, split: str = "val") -> dict:
    """A COCO instances file, parsed: ``coco`` is the file itself, or a COCO root (with ``annotations/``)
    or the annotations directory, where ``instances_{split}2014.json`` is used, else
    ``instances_{split}2017.json`` (``annotations/`` before the directory itself). ``split`` is "val" (POPE
    uses val2014) or "train". Raises ``FileNotFoundError`` naming what is missing and ``ValueError`` naming
    a file that is not a COCO instances file."""
    if split not in _SPLITS:
        raise ValueError(f"unknown COCO split {split!r}; expected one of {list(_SPLITS)}")
    root = Path(coco)
    if root.is_file():
        path = root
    elif root.is_dir():
        looked = [d / f"instances_{split}{year}.json" for year in _YEARS for d in _candidate_dirs(root)]
        path = next((p for p in looked if p.is_file()), None)
        if path is None:
            raise FileNotFoundError(
                f"no COCO instances file under {root}; looked for " + ", ".join(str(p) for p in looked)
            )
    else:
        raise FileNotFoundError(f"COCO instances file or directory not found: {root}")
    data = _load_json(path)
    _check_instances(data, str(path))
    return data


def _check_instances(data: Mapping, where: str) -> None:
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise ValueError(f"{where}: not a COCO instances file (no {key!r} list)")


def _index(data: Mapping, where: str):
    """(category id -> name, image id -> file name, image id -> {category id: total area})."""
    _check_instances(data, where)
    names = {c["id"]: c["name"] for c in data["categories"]}
    files = {img["id"]: img.get("file_name") for img in data["images"]}
    present: dict[int, dict[int, float]] = {imid: {} for imid in files}
    for a in data["annotations"]:
        cat, imid = a.get("category_id"), a.get("image_id")
        if cat not in names:
            raise ValueError(f"{where}: annotation {a.get('id')} has unknown category_id {cat!r}")
        if imid not in present:
            raise ValueError(f"{where}: annotation {a.get('id')} refers to unknown image_id {imid!r}")
        area = a.get("area")
        if area is None:
            bbox = a.get("bbox") or [0, 0, 0, 0]
            area = bbox[2] * bbox[3]
        present[imid][cat] = present[imid].get(cat, 0.0) + float(area)
    return names, files, present


# ------------------------------------------------------------------------------------ building POPE


def pope_question(obj: str, template: str = QUESTION_TEMPLATE) -> str:
    """``template`` filled with ``obj``, its " a " made " an " before a vowel-initial name."""
    if obj and obj[0].lower() in "aeiou":
        template = template.replace(" a {}", " an {}")
    return template.format(obj)


def _counts(images: Iterable[Iterable[int]]):
    freq: Counter[int] = Counter()
    cooc: dict[int, Counter[int]] = {}
    for cats in images:
        cats = set(cats)
        freq.update(cats)
        for a in cats:
            row = cooc.setdefault(a, Counter())
            row.update(b for b in cats if b != a)
    return freq, cooc


def build_pope_questions(
    instances: Mapping | str | os.PathLike,
    n_images: int | None = 500,
    n_per_image: int = 3,
    strategies: Sequence[str] = POPE_STRATEGIES,
    seed: int = 0,
    image_ids: Iterable[int] | None = None,
    *,
    positives: str = "random",
    counts_from: str = "selected",
    adversarial: str = "per_object",
) -> dict[str, list[dict]]:
    """POPE questions per strategy, built from COCO instance annotations (see the module docstring).

    ``instances`` is a parsed COCO instances dict or a path for ``load_coco_instances``. Returns
    ``{strategy: [record, ...]}`` in the order of ``strategies``; each record is ``{"question_id",
    "image_id", "image" (file name), "object", "label" ("yes"/"no"), "strategy", "question"}``, and every
    image has ``n_per_image`` yes and ``n_per_image`` no questions per strategy. Deterministic given
    ``seed``. Raises ``ValueError`` for an unknown strategy or option, too few eligible images, or
    ``image_ids`` that are unknown or not eligible.
    """
    if isinstance(instances, (str, os.PathLike)):
        where = str(instances)
        instances = load_coco_instances(instances)
    else:
        where = "COCO instances"
    if isinstance(strategies, str):
        strategies = (strategies,)
    strategies = list(dict.fromkeys(strategies))
    unknown = [s for s in strategies if s not in POPE_STRATEGIES]
    if unknown or not strategies:
        raise ValueError(
            f"unknown POPE strategy {unknown or strategies!r}; expected some of {list(POPE_STRATEGIES)}"
        )
    options = (("positives", positives, _POSITIVES), ("counts_from", counts_from, _COUNTS_FROM),
               ("adversarial", adversarial, _ADVERSARIAL))
    for name, value, allowed in options:
        if value not in allowed:
            raise ValueError(f"unknown {name} {value!r}; expected one of {list(allowed)}")
    if not isinstance(n_per_image, int) or n_per_image < 1:
        raise ValueError(f"n_per_image must be a positive integer, got {n_per_image!r}")
    if n_images is not None and (not isinstance(n_images, int) or n_images < 1):
        raise ValueError(f"n_images must be a positive integer or None, got {n_images!r}")

    names, files, present = _index(instances, where)
    vocab = sorted({c for cats in present.values() for c in cats})
    vocab_set = set(vocab)

    def eligible(imid: int) -> bool:
        n_present = len(present[imid])
        return n_present >= n_per_image and len(vocab_set) - n_present >= n_per_image

    rng = random.Random(seed)
    if image_ids is not None:
        chosen = list(dict.fromkeys(image_ids))
        missing = [i for i in chosen if i not in present]
        if missing:
            raise ValueError(f"{where}: image ids not in the annotations: {missing[:20]}")
        bad = [i for i in chosen if not eligible(i)]
        if bad:
            raise ValueError(f"{where}: images with fewer than {n_per_image} present or absent categories "
                             f"(not eligible for POPE): {bad[:20]}")
        if not chosen:
            raise ValueError("image_ids is empty")
    else:
        pool = [i for i in sorted(present) if eligible(i)]
        if n_images is None:
            chosen = pool
        elif n_images > len(pool):
            raise ValueError(f"{where}: only {len(pool)} images have >= {n_per_image} objects (and >= "
                             f"{n_per_image} absent categories); {n_images} requested")
        else:
            chosen = sorted(rng.sample(pool, n_images))
        if not chosen:
            raise ValueError(f"{where}: no image has >= {n_per_image} objects")

    if positives == "random":
        pos = {i: rng.sample(sorted(present[i]), n_per_image) for i in chosen}
    else:
        pos = {i: sorted(present[i], key=lambda c, i=i: (-present[i][c], c))[:n_per_image] for i in chosen}

    counted = chosen if counts_from == "selected" else list(present)
    freq, cooc = _counts(present[i] for i in counted)
    popular_order = sorted(vocab, key=lambda c: (-freq[c], c))

    out: dict[str, list[dict]] = {}
    for strategy in strategies:
        srng = random.Random(f"{seed}:{strategy}")
        records: list[dict] = []
        for imid in chosen:
            here = present[imid]
            absent = [c for c in vocab if c not in here]
            if strategy == "random":
                negs = srng.sample(absent, n_per_image)
            elif strategy == "popular":
                negs = [c for c in popular_order if c not in here][:n_per_image]
            elif adversarial == "per_object":
                negs = []
                for p in pos[imid]:
                    row = cooc.get(p, Counter())
                    left = [c for c in absent if c not in negs]
                    best = [c for c in left if row[c] > 0]
                    negs.append(min(best, key=lambda c, row=row: (-row[c], c)) if best else srng.choice(left))
            else:  # pooled
                score = {c: sum(cooc.get(g, Counter())[c] for g in here) for c in absent}
                negs = sorted((c for c in absent if score[c] > 0), key=lambda c: (-score[c], c))[:n_per_image]
                if len(negs) < n_per_image:
                    negs += srng.sample([c for c in absent if c not in negs], n_per_image - len(negs))
            for p, n in zip(pos[imid], negs):
                for cat, label in ((p, "yes"), (n, "no")):
                    records.append({
                        "question_id": f"{strategy}-{len(records)}",
                        "image_id": imid,
                        "image": files[imid],
                        "object": names[cat],
                        "label": label,
                        "strategy": strategy,
                        "question": pope_question(names[cat]),
                    })
        out[strategy] = records
    return out


# ------------------------------------------------------------------------------------ scoring



def parser_name(rule: str) -> str:
    """The canonical name of a POPE parsing rule (``"first"`` -> ``"keepsight"``); ``ValueError`` if unknown."""
    rule = rule_name(rule)
    if rule not in PARSERS:
        raise ValueError(f"unknown yes/no parsing rule {rule!r}; expected one of {list(PARSERS)}")
    return rule


def _answer_map(answers) -> dict:
    if isinstance(answers, Mapping):
        return dict(answers)
    out: dict = {}
    for a in answers:
        qid = a["question_id"]
        if qid in out:
            raise ValueError(f"duplicate answer for question_id {qid!r}")
        out[qid] = a["answer"]
    return out


def _binary(tp: int, fp: int, tn: int, fn: int, n_unparsed: int) -> dict:
    n = tp + fp + tn + fn
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    low, high = wilson(tp + tn, n)
    return {
        "accuracy": (tp + tn) / n,
        "accuracy_low": low,
        "accuracy_high": high,
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "yes_ratio": (tp + fp) / n,
        "n": n,
        "n_unparsed": n_unparsed,
        "tp": tp, "fp": fp, "tn": tn, "fn": fn,
    }


def pope_scores(records: Iterable[Mapping], answers, *, rule: str = "pope") -> dict:
    """Accuracy (with its 95% Wilson interval ``accuracy_low``/``accuracy_high``), precision, recall, F1
    ("yes" positive), yes_ratio, n, n_unparsed and the TP/FP/TN/FN counts, per strategy and "all" (fractions
    in [0, 1]).

    ``records`` are POPE questions (``question_id``, ``label``, optionally ``strategy``; a record without
    one counts in "all" only); ``answers`` maps question_id -> answer text, or is an iterable of
    ``{"question_id", "answer"}`` (``read_answers_jsonl``). Answers that ``parse_yes_no(text, rule)``
    cannot parse (only the ``"keepsight"`` rule has such answers) count as "no" and in ``n_unparsed``. Answers
    to other questions are ignored. Raises
    ``ValueError`` for no records, a label other than yes/no, or questions without an answer.
    """
    rule = parser_name(rule)
    amap = _answer_map(answers)
    # (prediction, label) -> confusion cell
    cell_of = {("yes", "yes"): "tp", ("yes", "no"): "fp", ("no", "no"): "tn", ("no", "yes"): "fn"}
    groups: dict[str, Counter] = {}
    total: Counter = Counter()
    missing = []
    n = 0
    for r in records:
        n += 1
        qid, label = r["question_id"], r["label"]
        if label not in ("yes", "no"):
            raise ValueError(f"question {qid!r} has label {label!r}, expected 'yes' or 'no'")
        if qid not in amap:
            missing.append(qid)
            continue
        pred = parse_yes_no(amap[qid], rule)
        strategy = r.get("strategy")
        for c in [total] if strategy is None else [total, groups.setdefault(strategy, Counter())]:
            c[cell_of[(pred or "no", label)]] += 1
            c["unparsed"] += pred is None
    if not n:
        raise ValueError("no POPE questions to score")
    if missing:
        raise ValueError(f"{len(missing)} question(s) have no answer: {missing[:10]}")
    out = {s: _binary(c["tp"], c["fp"], c["tn"], c["fn"], c["unparsed"]) for s, c in groups.items()}
    out["all"] = _binary(total["tp"], total["fp"], total["tn"], total["fn"], total["unparsed"])
    return out


# ------------------------------------------------------------------------------------ files


def write_questions_jsonl(
    path: str | os.PathLike, records: Iterable[Mapping] | Mapping[str, Iterable[Mapping]]
) -> Path:
    """Write POPE records as JSONL, one per line (a ``build_pope_questions`` dict is written strategy after
    strategy); parent directories are created. Returns the path."""
    path = Path(path)
    if isinstance(records, Mapping):
        records = [r for rs in records.values() for r in rs]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def _jsonl_objects(path: Path, what: str):
    for where, rec in read_jsonl(path, what):
        if not isinstance(rec.get("question_id"), (str, int)) or isinstance(rec.get("question_id"), bool):
            raise ValueError(f"{where}: 'question_id' missing or not a string/integer")
        yield where, rec


def read_questions_jsonl(path: str | os.PathLike) -> list[dict]:
    """POPE records from a JSONL file written by ``write_questions_jsonl`` (each needs ``question_id`` and
    a ``label`` of "yes"/"no"); errors name ``path:line``."""
    path = Path(path)
    out = []
    for where, rec in _jsonl_objects(path, "POPE questions"):
        if rec.get("label") not in ("yes", "no"):
            raise ValueError(f"{where}: 'label' must be 'yes' or 'no', got {rec.get('label')!r}")
        out.append(rec)
    if not out:
        raise ValueError(f"{path}: no questions")
    return out


def pope_file_strategy(path: str | os.PathLike) -> str:
    """The strategy a published POPE question file holds: the POPE strategy named in its file name
    (``coco_pope_adversarial.json`` -> "adversarial"), else the file's stem."""
    stem = Path(path).stem
    return next((s for s in POPE_STRATEGIES if s in stem.lower()), stem)


def read_pope_question_file(
    path: str | os.PathLike, *, strategy: str | None = None, image_root: str | os.PathLike | None = None
) -> list[dict]:
    """POPE records from a published question file (``coco_pope_random.json`` and the like: JSON Lines, LF or
    CRLF, one ``{"question_id", "image", "text", "label"}`` object per line; blank lines are skipped).

    Each record is ``{"question_id": f"{strategy}-{id}", "pope_question_id": id, "image", "question" (the
    file's ``text``), "label", "strategy", "line"}``, in file order; ``strategy`` defaults to
    ``pope_file_strategy(path)``. With ``image_root``, every image must be a file under it. Raises
    ``FileNotFoundError`` for a missing file and ``ValueError`` naming ``path:line`` for a line that is not a
    JSON object, lacks a field (or has one of the wrong type), has a label other than "yes"/"no", repeats a
    question_id, or names an image missing under ``image_root``; ``ValueError`` too for a file without
    questions."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"POPE question file not found: {path}")
    strategy = pope_file_strategy(path) if strategy is None else strategy
    root = None if image_root is None else Path(image_root)
    out: list[dict] = []
    first_line: dict = {}
    for where, rec in read_jsonl(path, "POPE question"):  # universal newlines: CRLF reads as LF
        for key in ("question_id", "image", "text", "label"):
            if key not in rec:
                raise ValueError(f"{where}: missing field {key!r}")
        qid = rec["question_id"]
        if not isinstance(qid, (str, int)) or isinstance(qid, bool):
            raise ValueError(f"{where}: 'question_id' must be an integer or a string, got {qid!r}")
        for key in ("image", "text"):
            if not isinstance(rec[key], str) or not rec[key].strip():
                raise ValueError(f"{where}: {key!r} must be a non-empty string, got {rec[key]!r}")
        if rec["label"] not in ("yes", "no"):
            raise ValueError(f"{where}: 'label' must be 'yes' or 'no', got {rec['label']!r}")
        if qid in first_line:
            raise ValueError(f"{where}: question_id {qid!r} already used at {first_line[qid]}")
        first_line[qid] = where
        if root is not None and not (root / rec["image"]).is_file():
            raise ValueError(f"{where}: image {rec['image']!r} not found under {root}")
        out.append({"question_id": f"{strategy}-{qid}", "pope_question_id": qid, "image": rec["image"],
                    "question": rec["text"], "label": rec["label"], "strategy": strategy,
                    "line": int(where.rsplit(":", 1)[1])})
    if not out:
        raise ValueError(f"{path}: no questions")
    return out


def read_pope_question_files(
    paths: Sequence[str | os.PathLike], *, image_root: str | os.PathLike | None = None
) -> list[dict]:
    """The records of several published question files (``read_pope_question_file``), file after file. Each
    file's strategy is the POPE strategy in its name when those are distinct across the files, else its stem;
    files whose stems coincide too are a ``ValueError`` (their question ids would clash)."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("no POPE question files given")
    names = [pope_file_strategy(p) for p in paths]
    if len(set(names)) < len(names):
        names = [p.stem for p in paths]
        if len(set(names)) < len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"two POPE question files are both named {dup!r} (their question ids would clash): "
                             + ", ".join(str(p) for p, n in zip(paths, names) if n == dup))
    return [r for p, name in zip(paths, names) for r in read_pope_question_file(p, strategy=name,
                                                                                 image_root=image_root)]


def read_answers_jsonl(path: str | os.PathLike) -> dict:
    """question_id -> answer text, from a JSONL file of ``{"question_id", "answer"}`` objects (the answer
    may be under ``text`` instead, as LLaVA's answer files have it). Blank lines are skipped; a malformed
    line or a repeated question_id raises ``ValueError`` naming ``path:line``."""
    path = Path(path)
    out: dict = {}
    first_line: dict = {}
    for where, rec in _jsonl_objects(path, "answers"):
        text = rec.get("answer", rec.get("text"))
        if not isinstance(text, str):
            raise ValueError(f"{where}: no string answer under 'answer' (or 'text')")
        qid = rec["question_id"]
        if qid in out:
            raise ValueError(f"{where}: question_id {qid!r} already answered at {first_line[qid]}")
        out[qid] = text
        first_line[qid] = where
    if not out:
        raise ValueError(f"{path}: no answers")
    return out
