#!/usr/bin/env python
"""Robustness survey: a table of bad inputs thrown at the keepsight CLI and Python API, each outcome classified.

    PYTHONPATH=src python scripts/bad_inputs.py [--out runs/bench/bad_inputs.json] [--only SUBSTR] [--keep] [--strict]

Every case is a small dict: a command line (``keepsight ...``) or a Python API call, the substrings a clear
error must name (the option, the field, the file), and whether the input is valid at all. Outcomes:

    clear      CLI: exit 2 and stderr is one "keepsight: error: ..." line (or argparse's usage + error) that
               names the problem; API: a ValueError / FileNotFoundError / FileExistsError / TypeError naming it
    unnamed    a clean error (as above, or an API RuntimeError) that does not name the option / field / file
    traceback  a traceback on stderr, exit 1 or another exit code, another exception type, a dead child
    silent     success on an invalid input (API: also a NaN output, or an output the case finds wrong)
    hang       still running at the case's timeout (the process group is killed)
    data_loss  a file or directory the case must keep was modified or deleted
    ok         success where success is right (the controls: the fixtures work)
    broken     a control that should succeed failed (a fixture problem or a regression)
    skipped    not run here (the reason says why)

Command lines hold placeholders: ``{W}`` (a fixture, see ``build_fixtures``), ``{tmp}`` (the case's scratch
directory, also its working directory), ``{new:NAME}`` (a path in it that does not exist yet) and
``{copy:W}`` (a private copy of fixture W, for cases that may damage it).

By default each case runs in a child forked from this process after it imported keepsight once (a fresh
``python -m keepsight.cli`` spends ~5 s importing on a small machine); ``--subprocess`` runs every CLI case
as a real ``python -m keepsight.cli`` process instead. Children get one intra-op thread and an address-space
limit (``--mem-gib``), so a huge allocation fails instead of taking the machine down.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTCOMES = ("clear", "unnamed", "traceback", "silent", "hang", "data_loss", "ok", "broken", "skipped")
CLI_TIMEOUT, API_TIMEOUT, SLOW = 60.0, 30.0, 15.0  # seconds; SLOW: cases that would run long once accepted
LEGIT_AFTER = 8.0  # a legitimate but long run (huge --steps) still running after this long counts as accepted
HUGE = 10**12

# ============================================================================= the CLI cases

WB = "world build --out {new:w} --n 2"
WT = "world train --out {new:t} --data {W} --steps-scale 0.001 --batch-size 2"
WTG = "world train --out {new:t} --n 8 --steps-scale 0.001 --batch-size 2"  # generated world: world_args apply
WE = "world eval --model {M} --data {W} --limit 2"
DG = "diagnose --model {M} --data {W} --limit 2 --batch-size 2 --max-new-tokens 4 --out {new:d}"
PS = "pvm train --model {M} --data {W} --out {new:a} --steps 1 --batch-size 2"
PG = ("pvm train --stage grpo --init {A} --model {M} --data {W} --out {new:g} --steps 1 --num-generations 2 "
      "--prompts-per-step 1 --max-completion-length 4")
LT = "lora train --model {M} --data {W} --out {new:l} --steps 1 --batch-size 2"
BT = "bridge train --phase 1 --model {M} --data {W} --out {new:b} --steps 1 --batch-size 2"
DT = "diffusion train --base {B} --data {W} --out {new:v} --steps 1 --batch-size 2 --answer-length 8"
BPO = "bench probe-overhead --out {new:bench} --batch 1 --new-tokens 2 --repeats 1"
CH = "eval chair --captions {CAPS} --coco {COCO} --out {new:chair.json}"
EG = "eval generate --model {M} --data {J} --image-folder {W} --out {new:p.jsonl} --max-new-tokens 2 --batch-size 2"

INT_BAD = {"zero": "0", "neg": "-1", "nan": "nan", "inf": "inf", "huge": str(HUGE), "float": "2.5", "word": "abc"}
FLOAT_BAD = {"zero": "0", "neg": "-1", "nan": "nan", "inf": "inf", "huge": "1e12", "word": "abc"}


def numeric(base: str, option: str, kind: str = "int", *, names=(), valid=None, slow=(), legit=(), skip=(),
            values=None, group: str | None = None, **extra) -> list[dict]:
    """One case per bad value of ``option`` appended to ``base`` (an occurrence in ``base`` is taken out first: an
    option given twice is itself an error).

    ``valid``: {label: True | None} for values that are fine (None: either outcome is acceptable);
    ``slow``: labels that would run a long time once accepted (short timeout); ``legit``: labels that are a
    legitimate long run (valid=None; still running after LEGIT_AFTER s means accepted)."""
    values = values or (INT_BAD if kind == "int" else FLOAT_BAD)
    group = group or "-".join(base.split()[:1 if base.startswith(("diagnose", "bench")) else 2])
    base = re.sub(rf"\s{re.escape(option)}\s+\S+", "", base)
    cases = []
    for label, value in values.items():
        if label in skip:
            continue
        case = {"id": f"cli:{group}:{option}={label}", "kind": "cli",
                "argv": f"{base} {option} {value}", "expect": [option, *names],
                "valid": (valid or {}).get(label, False), **extra}
        if label in slow:
            case["timeout"] = SLOW
        if label in legit:
            case.update(valid=None, accepted_after=LEGIT_AFTER)
        cases.append(case)
    return cases


def cli(id_: str, argv: str, expect=(), valid=False, **extra) -> dict:
    return {"id": f"cli:{id_}", "kind": "cli", "argv": argv, "expect": list(expect), "valid": valid, **extra}


def control(id_: str, argv: str) -> dict:
    """A command that must succeed: if it does not, the fixtures (or keepsight) are broken."""
    return cli(f"control:{id_}", argv, valid=True, control=True)


GRID = {"zero": "0 4", "neg": "-1 4", "cols0": "4 0", "nan": "nan 4", "huge": f"{HUGE} 4", "float": "2.5 4",
        "word": "abc 4"}
LAYERS = {"99": "99", "-99": "-99", "-1": "-1", "nan": "nan", "float": "1.5", "word": "abc", "repeat": "1 1",
          "huge": str(HUGE)}
TRAIN_COMMON = {"seed": dict(valid={"zero": True}, legit=("huge",)), "grad-accum": dict(names=("gradient-accumulation",)),
                "stop-after": dict(legit=("huge",))}


def training_numeric(base: str) -> list[dict]:
    """``--seed``, ``--grad-accum``, ``--stop-after``: the options every training command shares."""
    return [c for opt, kw in TRAIN_COMMON.items() for c in numeric(base, f"--{opt}", **kw)]


CLI_CASES: list[dict] = [
    # ---------------------------------------------------------------- controls: the fixtures work
    control("help", "--help"),
    control("world-build", WB),
    control("world-eval", WE),
    control("diagnose", DG),
    control("pvm-train-sft", PS),
    control("pvm-train-grpo", PG),
    control("lora-train", LT),
    control("bridge-train", BT),
    control("diffusion-train", DT),
    control("world-train", WT),
    control("eval-chair", CH),
    control("bench-probe-overhead", BPO),
    control("world-eval-pvm", f"{WE} --pvm {{A}}"),
    control("world-eval-lora", f"{WE} --lora {{L}}"),
    # ---------------------------------------------------------------- numbers: world build
    *numeric(WB, "--n", names=("n",), slow=("huge",)),
    *numeric(WB, "--seed", valid={"zero": True}, legit=("huge",)),
    *numeric(WB, "--objects", names=("n_objects",), values={**INT_BAD, "40": "40"}),
    *numeric(WB, "--image-size", slow=("huge",)),
    *numeric(WB, "--grid", values=GRID),
    *numeric(WB, "--max-objects"),
    # ---------------------------------------------------------------- numbers: world train
    *numeric(WT, "--steps-scale", "float", legit=("huge",)),
    *numeric(WT, "--batch-size", legit=("huge",)),
    *training_numeric(WT),
    *numeric(WTG, "--n", names=("n",), slow=("huge",), skip=("nan", "inf", "float", "word"), group="world-train-gen"),
    *numeric(WTG, "--image-size", slow=("huge",), skip=("nan", "inf", "float", "word"), group="world-train-gen"),
    *numeric(WTG, "--grid", values={k: GRID[k] for k in ("zero", "word")}, group="world-train-gen"),
    *numeric(WTG, "--max-objects", skip=("nan", "inf", "float", "word"), group="world-train-gen"),
    # ---------------------------------------------------------------- numbers: world eval, diagnose
    *numeric(WE, "--limit", valid={"huge": True}),
    *numeric(DG, "--max-new-tokens", slow=("huge",)),
    *numeric(DG, "--limit", valid={"huge": True}),
    *numeric(DG, "--batch-size", valid={"huge": True}),
    # ---------------------------------------------------------------- numbers: pvm train (sft, grpo)
    *numeric(f"{PS} --stop-after 1", "--steps", valid={"huge": None}, group="pvm-train"),  # --stop-after 1: acceptance shows at once
    *numeric(PS, "--lr", "float", valid={"huge": None}),
    *numeric(PS, "--gate-lr", "float", valid={"huge": None}),
    *numeric(PS, "--batch-size", valid={"huge": None}),
    *numeric(PS, "--pvm-hidden-size", values={**INT_BAD, "1e9": str(10**9), "3": "3"}, names=("pvm_hidden_size",)),
    *numeric(PS, "--layers", values=LAYERS),
    *training_numeric(PS),
    *numeric(PG, "--beta", "float", valid={"zero": True, "huge": None}, group="pvm-grpo"),
    *numeric(PG, "--num-generations", values={**INT_BAD, "1": "1"}, slow=("huge",), group="pvm-grpo"),
    *numeric(PG, "--prompts-per-step", slow=("huge",), group="pvm-grpo"),
    *numeric(PG, "--max-completion-length", slow=("huge",), group="pvm-grpo"),
    *numeric(f"{PG} --stop-after 1", "--steps", values={"zero": "0"}, group="pvm-grpo"),
    *numeric(PG, "--lr", "float", values={"zero": "0"}, group="pvm-grpo"),
    *numeric(PG, "--gate-lr", "float", values={"zero": "0"}, group="pvm-grpo"),
    # ---------------------------------------------------------------- numbers: lora, bridge, diffusion
    *numeric(f"{LT} --stop-after 1", "--steps", valid={"huge": None}, group="lora-train"),
    *numeric(LT, "--lr", "float", valid={"huge": None}),
    *numeric(LT, "--batch-size", valid={"huge": None}),
    *numeric(LT, "--pvm-hidden-size", values={**INT_BAD, "1e9": str(10**9)}, names=("pvm_hidden_size",)),
    *numeric(LT, "--layers", values=LAYERS),
    *training_numeric(LT),
    *numeric(f"{BT} --stop-after 1", "--steps", valid={"huge": None}, group="bridge-train"),
    *numeric(BT, "--lr", "float", valid={"huge": None}),
    *numeric(BT, "--batch-size", valid={"huge": None}),
    *numeric(BT, "--phase", values={"zero": "0", "3": "3", "word": "abc"}),
    *training_numeric(BT),
    *numeric(f"{DT} --stop-after 1", "--steps", valid={"huge": None}, group="diffusion-train"),
    *numeric(DT, "--lr", "float", valid={"huge": None}),
    *numeric(DT, "--batch-size", valid={"huge": None}),
    *numeric(DT, "--answer-length", slow=("huge",)),
    *training_numeric(DT),
    # ---------------------------------------------------------------- numbers: bench
    *numeric(BPO, "--repeats", slow=("huge",)),
    *numeric(BPO, "--batch", names=("batch",), slow=("huge",)),
    *numeric(BPO, "--new-tokens", slow=("huge",)),
    *numeric("bench bridge-memory --out {new:bench}", "--mem-limit-gib", "float", skip=("huge", "inf"),
             timeout=SLOW),  # huge / inf mean "no limit": the whole (hours-long) benchmark, legitimately
    cli("bench:pvm-decode:--new-tokens=1", "bench pvm-decode --out {new:bench} --batch 1 --repeats 1 --new-tokens 1",
        ["--new-tokens"]),
    cli("bench:pvm-decode:--new-tokens=zero", "bench pvm-decode --out {new:bench} --batch 1 --repeats 1 "
        "--new-tokens 0", ["--new-tokens"]),
    cli("bench:diffusion:--repeats=zero", "bench diffusion --out {new:bench} --repeats 0", ["--repeats"],
        timeout=SLOW),
    cli("bench:unknown-name", "bench nope", ["name", "nope"]),
    # ---------------------------------------------------------------- strings and choices
    cli("choice:world-build-difficulty", f"{WB} --difficulty nope", ["--difficulty", "difficulty"]),
    cli("choice:world-train-preset", f"{WT} --preset nope", ["--preset", "preset"]),
    cli("choice:world-train-preset-qwen", f"{WT} --preset tiny-qwen3vl", ["--preset", "preset"]),
    cli("choice:world-train-stage", f"{WT} --stage nope", ["--stage"]),
    cli("choice:world-eval-dtype", f"{WE} --dtype int8", ["--dtype"]),
    cli("choice:world-eval-device-tpu", f"{WE} --device tpu", ["--device", "device"]),
    cli("choice:world-eval-device-cuda", f"{WE} --device cuda", ["--device", "device", "cuda"]),
    cli("choice:world-eval-device-cuda99", f"{WE} --device cuda:99", ["--device", "device", "cuda"]),
    cli("choice:diagnose-prompt", f"{DG} --prompt nope", ["--prompt", "prompt"]),
    cli("choice:pvm-train-stage", f"{PS} --stage nope", ["--stage"]),
    cli("choice:pvm-train-precision", f"{PS} --precision nope", ["--precision"]),
    cli("choice:pvm-train-device", f"{PS} --device tpu", ["--device"]),
    cli("choice:pvm-train-device-cuda", f"{PS} --device cuda", ["--device", "device", "cuda"]),
    cli("choice:pvm-grpo-without-init", PS.replace("pvm train", "pvm train --stage grpo"), ["--init"]),
    cli("choice:pvm-sft-with-init", f"{PS} --init {{A}}", ["--init"]),
    cli("choice:pvm-grpo-tasks", f"{PG} --tasks nope", ["--tasks", "tasks"]),
    cli("choice:bridge-kind", "bridge train --phase 1 --model {M} --data {W} --out {new:b} --steps 0 --lr nan "
        "--batch-size 0 --bridge unknown", ["--bridge", "bridge", "--steps", "--lr", "--batch-size", "lr",
                                            "batch_size", "steps"]),
    cli("choice:bridge-kind-alone", f"{BT} --bridge unknown", ["--bridge", "bridge", "unknown"]),
    cli("choice:diffusion-both", "diffusion train --base {B} --data {W} --out {new:v} --answer-length 0 --steps 0",
        ["--answer-length", "answer_length", "--steps", "steps"]),
    cli("path:diffusion-language-model-missing", f"{DT} --language-model-from {{new:nowhere}}",
        ["language_model_from", "nowhere"]),
    cli("choice:diffusion-language-model-with-model", "diffusion train --model {M} --data {W} --out {new:v} "
        "--language-model-from {M}", ["--language-model-from", "--base"]),
    cli("choice:demo-profile", "demo --profile nope --runs {new:runs}", ["--profile", "profile"]),
    cli("choice:demo-name-escape", "demo --smoke --runs {new:runs} --name ../../escaped", ["--name", "name"],
        timeout=10, must_not_create=["../escaped"]),
    cli("choice:demo-name-empty", 'demo --smoke --runs {new:runs} --name ""', ["--name", "name"], timeout=10),
    cli("choice:demo-name-absolute", "demo --smoke --runs {new:runs} --name {tmp}/abs", ["--name", "name"],
        timeout=10, must_not_create=["abs"]),
    cli("choice:no-subcommand", "world", ["world_command", "world"]),
    cli("choice:missing-required", "pvm train --model {M}", ["--data", "--out"]),
    # ---------------------------------------------------------------- paths
    cli("path:world-eval-missing-data", "world eval --model {M} --data {new:nowhere}", ["nowhere"]),
    cli("path:world-eval-missing-model", "world eval --model {new:nowhere} --data {W}", ["nowhere"]),
    cli("path:world-eval-data-is-file", "world eval --model {M} --data {F}", ["F", "plain.txt"]),
    cli("path:world-eval-model-is-file", "world eval --model {F} --data {W}", ["F", "plain.txt"]),
    cli("path:world-eval-model-is-world", "world eval --model {W} --data {W}", ["W", "config.json"]),
    cli("path:world-eval-data-is-model", "world eval --model {M} --data {M}", ["M", "world.json"]),
    cli("path:world-eval-pvm-missing", f"{WE} --pvm {{new:nowhere}}", ["nowhere", "--pvm"]),
    cli("path:world-eval-pvm-is-file", f"{WE} --pvm {{F}}", ["F", "plain.txt", "--pvm"]),
    cli("path:world-eval-pvm-is-lora", f"{WE} --pvm {{L}}", ["L", "pvm_config.json", "--pvm"]),
    cli("path:world-eval-lora-is-pvm", f"{WE} --lora {{A}}", ["A", "adapter_config.json", "--lora"]),
    cli("path:world-eval-lora-missing", f"{WE} --lora {{new:nowhere}}", ["nowhere", "--lora"]),
    cli("path:world-eval-pvm-and-lora", f"{WE} --pvm {{A}} --lora {{L}}", ["--pvm", "--lora"]),
    cli("path:world-eval-out-is-dir", f"{WE} --out {{copy:D}}", ["--out", "D"], keep=["{copy:D}"]),
    cli("path:world-eval-out-under-file", f"{WE} --out {{F}}/x.json", ["--out", "plain.txt"]),
    cli("path:world-build-out-is-file", "world build --out {copy:F} --n 2", ["F", "--out"], keep=["{copy:F}"]),
    cli("path:world-build-out-is-file-overwrite", "world build --out {copy:F} --n 2 --overwrite", ["F", "--out"],
        keep=["{copy:F}"]),
    cli("path:world-build-out-under-file", "world build --out {F}/w --n 2", ["F", "plain.txt", "--out"]),
    cli("path:world-build-out-exists", "world build --out {copy:W} --n 2", ["W", "--overwrite"], keep=["{copy:W}"]),
    cli("path:world-build-readonly", "world build --out {RO}/w --n 2", ["RO", "readonly", "permission"]),
    cli("path:world-train-data-missing", "world train --out {new:t} --data {new:nowhere}", ["nowhere"]),
    cli("path:world-train-out-is-file", "world train --out {copy:F} --data {W} --steps-scale 0.001", ["F", "--out"],
        keep=["{copy:F}"]),
    cli("path:pvm-train-data-is-file", "pvm train --model {M} --data {F} --out {new:a} --steps 1",
        ["F", "plain.txt", "--data"]),
    cli("path:pvm-train-model-is-file", "pvm train --model {F} --data {W} --out {new:a} --steps 1",
        ["F", "plain.txt", "--model"]),
    cli("path:pvm-train-model-missing", "pvm train --model {new:nowhere} --data {W} --out {new:a} --steps 1",
        ["nowhere"]),
    cli("path:pvm-train-out-is-file", "pvm train --model {M} --data {W} --out {copy:F} --steps 1 --batch-size 2",
        ["F", "--out"], keep=["{copy:F}"]),
    cli("path:pvm-train-out-under-file", "pvm train --model {M} --data {W} --out {F}/a --steps 1 --batch-size 2",
        ["plain.txt", "--out"]),
    cli("path:pvm-train-readonly", "pvm train --model {M} --data {W} --out {RO}/a --steps 1 --batch-size 2",
        ["RO", "readonly", "permission"]),
    cli("path:pvm-train-out-unrelated-dir", "pvm train --model {M} --data {W} --out {copy:D} --steps 1 "
        "--batch-size 2", ["D", "--out"], valid=None, keep=["{copy:D}"]),
    cli("path:pvm-grpo-init-missing", PG.replace("{A}", "{new:nowhere}"), ["nowhere", "--init"]),
    cli("path:lora-train-out-is-file", "lora train --model {M} --data {W} --out {copy:F} --steps 1 --batch-size 2",
        ["F", "--out"], keep=["{copy:F}"]),
    cli("path:diagnose-out-is-file", DG.replace("{new:d}", "{copy:F}"), ["F", "--out"], keep=["{copy:F}"]),
    cli("path:diffusion-base-is-model", DT.replace("{B}", "{M}"), ["M", "--base", "vision"]),
    cli("path:diffusion-base-missing", DT.replace("{B}", "{new:nowhere}"), ["nowhere", "--base"]),
    cli("path:bridge-phase2-from-plain-model", BT.replace("--phase 1", "--phase 2"), ["M", "bridge", "phase"]),
    cli("path:eval-chair-captions-missing", CH.replace("{CAPS}", "{new:nowhere.jsonl}"), ["nowhere.jsonl"]),
    cli("path:eval-chair-captions-is-dir", CH.replace("{CAPS}", "{D}"), ["D", "--captions"]),
    cli("path:eval-chair-coco-missing", CH.replace("{COCO}", "{new:nowhere}"), ["nowhere"]),
    cli("path:eval-chair-coco-is-file", CH.replace("{COCO}", "{F}"), ["F", "plain.txt", "--coco"]),
    cli("path:eval-chair-coco-empty-dir", CH.replace("{COCO}", "{EMPTY}"), ["EMPTY", "instances", "annotations"]),
    cli("path:eval-chair-out-is-dir", CH.replace("{new:chair.json}", "{copy:D}"), ["D", "--out"], keep=["{copy:D}"]),
    cli("path:eval-chair-readonly", CH.replace("{new:chair.json}", "{RO}/x.json"), ["RO", "readonly", "permission"]),
    cli("path:demo-runs-is-file", "demo --smoke --runs {copy:F}", ["--runs", "F"], keep=["{copy:F}"], timeout=SLOW),
    cli("path:bench-out-is-file", "bench bridge-memory --mem-limit-gib 0.001 --out {copy:F}", ["--out", "F"],
        keep=["{copy:F}"]),
    # ---------------------------------------------------------------- data loss: inputs that must survive
    cli("loss:eval-chair-out-is-captions", "eval chair --captions {copy:CAPS} --coco {COCO} --out {copy:CAPS}",
        ["--out", "--captions", "CAPS", "captions.jsonl"], keep=["{copy:CAPS}"]),
    cli("loss:world-build-overwrite-non-world", "world build --out {copy:D} --n 2 --overwrite",
        ["D", "--overwrite", "world"], keep=["{copy:D}"]),
    cli("loss:pvm-train-out-adapter-of-other-model", "pvm train --out {copy:A} --model {M2} --data {W} --steps 1 "
        "--batch-size 2", ["A", "M2", "--out", "--model"], keep=["{copy:A}"]),
    cli("loss:lora-train-out-adapter-of-other-model", "lora train --out {copy:L} --model {M2} --data {W} --steps 1 "
        "--batch-size 2", ["L", "M2", "--out", "--model"], keep=["{copy:L}"]),
    cli("loss:pvm-train-diffusion-model", "pvm train --model {V} --data {W} --out {new:a} --steps 1 --batch-size 2",
        ["V", "diffusion", "--model"]),
    cli("loss:lora-train-diffusion-model", "lora train --model {V} --data {W} --out {new:l} --steps 1 "
        "--batch-size 2", ["V", "diffusion", "--model"]),
    cli("loss:bridge-train-diffusion-model", "bridge train --phase 1 --model {V} --data {W} --out {new:b} --steps 1 "
        "--batch-size 2", ["V", "diffusion", "--model"]),
    cli("loss:world-eval-diffusion-model", "world eval --model {V} --data {W} --limit 2",
        ["V", "diffusion", "--model"]),
    cli("loss:diagnose-diffusion-model", DG.replace("{M}", "{V}"), ["V", "diffusion", "--model"]),
    cli("loss:world-eval-lora-of-other-model", "world eval --model {M2} --data {W} --limit 2 --lora {L}",
        ["L", "M2", "--lora"]),
    cli("loss:world-eval-pvm-of-other-model", "world eval --model {M2} --data {W} --limit 2 --pvm {A}",
        ["A", "M2", "--pvm"]),
    cli("loss:world-eval-out-existing-dir", "world eval --model {M} --data {W} --limit 2 --out {copy:D}",
        ["D", "--out"], keep=["{copy:D}"]),
    cli("loss:bridge-train-out-unrelated-dir", "bridge train --phase 1 --model {M} --data {W} --out {copy:D} "
        "--steps 1 --batch-size 2", ["D", "--out"], keep=["{copy:D}"]),
    cli("loss:lora-train-out-unrelated-dir", "lora train --model {M} --data {W} --out {copy:D} --steps 1 "
        "--batch-size 2", ["D", "--out"], keep=["{copy:D}"]),
    cli("loss:diffusion-train-out-unrelated-dir", DT.replace("{new:v}", "{copy:D}"), ["D", "--out"],
        keep=["{copy:D}"]),
    cli("loss:world-train-out-unrelated-dir", WT.replace("{new:t}", "{copy:D}"), ["D", "--out"], valid=None,
        keep=["{copy:D}"]),
    cli("loss:world-train-out-is-model", WT.replace("{new:t}", "{copy:M}"), ["M", "--out"], keep=["{copy:M}"]),
    cli("loss:pvm-train-out-is-world", PS.replace("{new:a}", "{copy:W}"), ["W", "--out"], valid=None,
        keep=["{copy:W}"]),
    cli("loss:pvm-train-out-is-model", PS.replace("{new:a}", "{copy:M}"), ["M", "--out"], valid=None,
        keep=["{copy:M}"]),
    cli("loss:pvm-train-out-is-data", "pvm train --model {M} --data {copy:W} --out {copy:W} --steps 1 "
        "--batch-size 2", ["W", "--out", "--data"], valid=None, keep=["{copy:W}"]),
    # ---------------------------------------------------------------- corrupt files
    *[cli(f"corrupt:world-eval-model-{k}", f"world eval --model {{{k}}} --data {{W}} --limit 2", names)
      for k, names in (("M_trunc", ("model.safetensors",)), ("M_zero", ("model.safetensors",)),
                       ("M_noweights", ("safetensors",)), ("M_badcfg", ("config.json",)),
                       ("M_nocfg", ("config.json",)), ("M_unknown", ("model_type", "bert")),
                       ("M_noproc", ("processor", "tokenizer")))],
    cli("corrupt:pvm-train-model-M_trunc", PS.replace("{M}", "{M_trunc}"), ["model.safetensors"]),
    cli("corrupt:pvm-train-model-M_zero", PS.replace("{M}", "{M_zero}"), ["model.safetensors"]),
    cli("corrupt:lora-train-model-M_badcfg", LT.replace("{M}", "{M_badcfg}"), ["config.json"]),
    *[cli(f"corrupt:world-eval-pvm-{k}", f"{WE} --pvm {{{k}}}", names) for k, names in (
        ("A_badcfg", ("pvm_config.json",)), ("A_mismatch", ("pvm_config.json", "layers", "config")),
        ("A_noweights", ("pvm.safetensors",)), ("A_nan", ("A_nan", "pvm.safetensors")),
        ("A_emptycfg", ("pvm_config.json",)), ("A_truncw", ("pvm.safetensors",)))],
    cli("corrupt:world-eval-lora-L_badcfg", f"{WE} --lora {{L_badcfg}}", ["adapter_config.json"]),
    cli("corrupt:world-eval-lora-L_noweights", f"{WE} --lora {{L_noweights}}", ["adapter_model.safetensors"]),
    cli("corrupt:pvm-grpo-init-A_badcfg", PG.replace("{A}", "{A_badcfg}"), ["pvm_config.json"]),
    cli("corrupt:pvm-grpo-init-A_noweights", PG.replace("{A}", "{A_noweights}"), ["pvm.safetensors"]),
    cli("corrupt:pvm-grpo-init-A_nan", PG.replace("{A}", "{A_nan}"), ["A_nan", "pvm.safetensors", "--init"]),
    *[cli(f"corrupt:world-eval-data-{k}", f"world eval --model {{M}} --data {{{k}}} --limit 2", names)
      for k, names in (("W_brokenline", ("scenes.jsonl",)), ("W_notimage", ("png",)),
                       ("W_size", ("image_size", "size", "png")), ("W_noimage", ("png",)),
                       ("W_badmeta", ("world.json",)), ("W_empty", ("scenes.jsonl",)),
                       ("W_badscene", ("scenes.jsonl",)))],
    cli("corrupt:pvm-train-data-W_notimage", PS.replace("{W}", "{W_notimage}"), ["png"]),
    cli("corrupt:pvm-train-data-W_size", PS.replace("{W}", "{W_size}"), ["image_size", "size", "png"]),
    cli("corrupt:world-train-data-W_size", WT.replace("{W}", "{W_size}"), ["image_size", "size", "png"]),
    cli("corrupt:diagnose-data-W_size", DG.replace("{W}", "{W_size}"), ["image_size", "size", "png"]),
    cli("corrupt:eval-chair-captions-not-text", CH.replace("{CAPS}", "{NOTIMG}"), ["notimage.png"]),
    cli("corrupt:eval-chair-captions-broken", CH.replace("{CAPS}", "{CAPS_bad}"), ["captions_bad.jsonl"]),
    cli("corrupt:eval-chair-captions-empty", CH.replace("{CAPS}", "{CAPS_empty}"), ["captions_empty.jsonl"]),
    cli("corrupt:eval-chair-coco-broken", CH.replace("{COCO}", "{COCO_bad}"), ["instances_val2014.json"]),
    cli("corrupt:eval-chair-unknown-image-ids", CH.replace("{CAPS}", "{CAPS_unknown}"), ["image_id", "999999"],
        valid=None),

    # ---------------------------------------------------------------- real data, eval generate / score / pope, baselines
    control("eval-generate-llava", EG),
    control("eval-generate-baseline-vcd", f"{EG} --baseline vcd"),
    control("eval-score", "eval score --pred {P} --out {new:s.json}"),
    *[c for opt in ("--limit", "--batch-size", "--max-new-tokens")
      for c in numeric(EG, opt, values={k: INT_BAD[k] for k in ("zero", "neg", "nan", "float", "word")})],
    cli("data:eval-generate-data-missing", EG.replace("{J}", "{new:nowhere.json}"), ["nowhere.json", "--data"]),
    cli("data:eval-generate-data-not-llava", EG.replace("{J}", "{J_notlist}"), ["J_notlist"]),
    cli("data:eval-generate-data-no-conversations", EG.replace("{J}", "{J_noconv}"), ["conversations"]),
    cli("data:eval-generate-data-missing-image", EG.replace("{J}", "{J_missing}"),
        ["nowhere.png", "--skip-bad-rows"]),
    cli("data:eval-generate-data-missing-image-skipped", EG.replace("{J}", "{J_missing}") + " --skip-bad-rows",
        valid=True),
    cli("data:eval-generate-model-is-world", EG.replace("{M}", "{W}"), ["W", "config.json"]),
    cli("data:eval-generate-diffusion-on-llava", f"{EG} --diffusion", ["diffusion", "--model"]),
    cli("data:eval-generate-mps-without-diffusion", f"{EG} --mps", ["--mps", "--diffusion"]),
    cli("data:eval-generate-baseline-unknown", f"{EG} --baseline nope", ["--baseline", "nope"]),
    cli("data:eval-generate-baseline-args-not-json", f"{EG} --baseline vcd --baseline-args '{{bad'",
        ["--baseline-args"]),
    cli("data:eval-generate-baseline-args-alone", EG + " --baseline-args '{\"alpha\": 1}'", ["--baseline"]),
    *[cli(f"data:eval-generate-{m}-{field}", f"{EG} --baseline {m} --baseline-args '{args}'", [field])
      for m, field, args in (("vcd", "alpha", '{"alpha": -1}'), ("vcd", "noise_step", '{"noise_step": 5000}'),
                             ("vcd", "nope", '{"nope": 1}'), ("pai", "layers", '{"layers": [99]}'),
                             ("pai", "alpha", '{"alpha": "nan"}'), ("memvr", "threshold", '{"threshold": -1}'),
                             ("memvr", "end_layer", '{"end_layer": 99}'), ("deco", "layers", '{"layers": [99]}'),
                             ("deco", "alpha", '{"alpha": -0.5}'))],
    cli("loss:eval-generate-out-is-data", "eval generate --model {M} --data {copy:J} --image-folder {W} "
        "--out {copy:J} --max-new-tokens 2", ["--out", "--data"], keep=["{copy:J}"]),
    cli("loss:eval-generate-out-is-dir", EG.replace("{new:p.jsonl}", "{copy:D}"), ["D", "--out"], keep=["{copy:D}"]),
    cli("path:eval-generate-out-under-file", EG.replace("{new:p.jsonl}", "{F}/p.jsonl"), ["--out", "plain.txt"]),
    cli("data:eval-score-pred-missing", "eval score --pred {new:nowhere.jsonl}", ["nowhere.jsonl"]),
    cli("data:eval-score-pred-broken", "eval score --pred {P_bad}", ["P_bad"]),
    cli("data:eval-score-pred-empty", "eval score --pred {CAPS_empty}", ["captions_empty.jsonl"]),
    cli("data:eval-score-pred-no-reference", "eval score --pred {CAPS}", ["captions.jsonl", "reference"]),
    cli("loss:eval-score-out-is-pred", "eval score --pred {copy:P} --out {copy:P}", ["--out", "--pred"],
        keep=["{copy:P}"]),
    cli("data:eval-pope-coco-missing", "eval pope --coco {new:nococo} --out {new:pope} --model {M}", ["nococo"]),
    cli("data:eval-pope-coco-broken", "eval pope --coco {COCO_bad} --out {new:pope} --model {M}",
        ["instances_val2014.json"]),
    cli("data:eval-pope-no-model-no-answers", "eval pope --coco {COCO} --out {new:pope}", ["--model", "--answers"]),
    cli("data:eval-pope-answers-broken", "eval pope --coco {COCO} --out {new:pope} --answers {P_bad} --images 1 "
        "--per-image 1", ["P_bad"]),
    *numeric("eval pope --coco {COCO} --out {new:pope} --model {M}", "--images",
             values={k: INT_BAD[k] for k in ("zero", "neg", "word")}),
    cli("data:pvm-train-llava-missing-image", "pvm train --model {M} --data {J_missing} --image-folder {W} "
        "--out {new:a} --steps 1 --batch-size 2", ["nowhere.png", "--skip-bad-rows"]),
    cli("data:lora-train-llava-no-conversations", "lora train --model {M} --data {J_noconv} --image-folder {W} "
        "--out {new:l} --steps 1 --batch-size 2", ["conversations"]),
    # ---------------------------------------------------------------- nothing lost under reruns (issue 39)
    cli("loss:pvm-train-overwrite-out-holds-data", "pvm train --model {M} --data {copy:A_data}/mydata --out "
        "{copy:A_data} --steps 1 --batch-size 2 --overwrite", ["--out", "input"], keep=["{copy:A_data}"]),
    cli("loss:pvm-train-overwrite-new-run-fails", "pvm train --model {M} --data {W} --out {copy:A} --steps 1 "
        "--batch-size 2 --max-length 4 --overwrite", ["--max-length", "image"], keep=["{copy:A}"]),
    cli("loss:eval-score-out-is-predictions", "eval score --pred {P} --out {copy:GD}/G.jsonl --overwrite",
        ["--out", "predictions"], keep=["{copy:GD}"]),
    cli("loss:world-eval-out-is-predictions", f"{WE} --out {{copy:GD}}/G.jsonl --overwrite", ["--out", "predictions"],
        keep=["{copy:GD}"]),
    cli("loss:eval-chair-out-is-predictions", CH.replace("{new:chair.json}", "{copy:GD}/G.jsonl") + " --overwrite",
        ["--out", "predictions"], keep=["{copy:GD}"]),
    cli("loss:eval-pope-rerun-without-overwrite", "eval pope --coco {COCO} --images 1 --per-image 1 --answers {P} "
        "--out {copy:POPE_D}", ["--out", "--overwrite"], keep=["{copy:POPE_D}"]),
    cli("loss:eval-generate-users-tmp-file", EG.replace("{new:p.jsonl}", "{copy:UT}/p.jsonl"), valid=True,
        keep=["{copy:UT}/p.jsonl.tmp"]),
    # ---------------------------------------------------------------- silent before (issue 39)
    cli("data:world-eval-nan-weights", WE.replace("{M}", "{M_nanw}"), ["M_nanw", "NaN"]),
    cli("data:world-eval-int-adapter", f"{WE} --pvm {{A_int}}", ["pvm.safetensors", "floating"]),
    cli("data:world-eval-vcd-alpha-twice", f"{WE} --vcd.alpha nan --vcd.alpha 1", ["--vcd.alpha", "twice"]),
    cli("data:eval-generate-mps-k-twice", f"{EG} --diffusion --mps.k 0 --mps.k 3", ["--mps.k", "twice"]),
    cli("data:world-eval-pai-prefill-both", f"{WE} --pai.amplify_prefill --no-pai.amplify_prefill",
        ["amplify_prefill", "twice"]),
    cli("data:world-eval-memvr-empty-window", f"{WE} --memvr.start_layer 3 --memvr.end_layer 1",
        ["start_layer", "end_layer"]),
    cli("data:world-eval-pai-drop-outside-vocab", f"{WE} --pai.drop_token_ids 999999", ["drop_token_ids"]),
    cli("data:bench-pvm-decode-new-tokens-cut", "bench pvm-decode --new-tokens 100 --out {new:bench}",
        ["--new-tokens"]),
    cli("data:bench-baselines-new-tokens-cut", "bench baselines --new-tokens 1000 --out {new:bench}",
        ["--new-tokens"]),
    cli("data:eval-score-duplicate-ids", "eval score --pred {P_dup} --out {new:s.json}", ["P_dup", "more than once"]),
    cli("data:eval-generate-baseline-args-key-twice", EG + " --baseline vcd --baseline-args "
        "'{\"alpha\": 1, \"alpha\": 2}'", ["alpha", "twice"]),
    cli("data:pvm-train-image-folder-with-world", "pvm train --model {M} --data {W} --image-folder {W} --out {new:a} "
        "--steps 1 --batch-size 2", ["--image-folder"]),
]

# ============================================================================= the API cases


def api(fn: str, *args, expect=(), valid=False, tag: str = "", timeout: float = API_TIMEOUT, control=False,
        **kw) -> dict:
    """A call of the handler ``fn`` (see HANDLERS) with ``args`` / ``kw``; ``expect``: what a clear error names."""
    shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kw.items())])
    return {"id": f"api:{fn}({tag or shown})", "kind": "api", "fn": fn, "args": list(args), "kw": kw,
            "expect": list(expect), "valid": valid, "timeout": timeout, "control": control}


NAN, INF = float("nan"), float("inf")
LIA = {"d_vision": 8, "d_model": 16}


def lia(**kw) -> dict:
    field = next(iter(kw))
    return api("LiaMtrConfig", **{**LIA, **kw}, expect=[field], tag=", ".join(f"{k}={v!r}" for k, v in kw.items()))


API_CASES: list[dict] = [
    # ---------------------------------------------------------------- controls
    api("PVMConfig", valid=True, control=True, tag="defaults"),
    api("LiaMtrConfig", **LIA, valid=True, control=True, tag="defaults"),
    api("MaskPriorSuppression", valid=True, control=True, tag="defaults"),
    api("MonotonicRoPEScaling", valid=True, control=True, tag="defaults"),
    api("generate", valid=True, control=True, tag="defaults"),
    api("probe", valid=True, control=True, tag="defaults"),
    api("probe", layers=[0, -1], valid=True),
    api("load_checkpoint", "{M}", valid=True, control=True),
    api("load_checkpoint", "{V}", valid=True, control=True),
    api("load_pvm", "{A}", valid=True, control=True),
    # ---------------------------------------------------------------- PVMConfig (constructed, attached, forward)
    api("PVMConfig", layers=[1.7], expect=["layers"]),
    api("PVMConfig", layers=[], expect=["layers"]),
    api("PVMConfig", layers="x", expect=["layers"]),
    api("PVMConfig", layers=[99], expect=["layers", "99"]),
    api("PVMConfig", layers=[-1], expect=["layers", "-1"]),
    api("PVMConfig", layers=[1, 1], expect=["layers"]),
    api("PVMConfig", layers=["a"], expect=["layers"]),
    api("PVMConfig", heads=2.5, expect=["heads"]),
    api("PVMConfig", heads=0, expect=["heads"]),
    api("PVMConfig", heads="2", expect=["heads"]),
    api("PVMConfig", heads=3, expect=["heads"]),
    api("PVMConfig", latent_dim=8.0, expect=["latent_dim"]),
    api("PVMConfig", latent_dim=10**9, expect=["latent_dim"]),
    api("PVMConfig", latent_dim=0, expect=["latent_dim"]),
    api("PVMConfig", latent_dim=-4, expect=["latent_dim"]),
    api("PVMConfig", latent_dim="32", expect=["latent_dim"]),
    api("PVMConfig", dropout=NAN, expect=["dropout"]),
    api("PVMConfig", dropout=1.0, expect=["dropout"]),
    api("PVMConfig", dropout="0.1", expect=["dropout"]),
    api("PVMConfig", gate="x", expect=["gate"]),
    api("PVMConfig", shared_down="no", expect=["shared_down"]),
    api("PVMConfig", silence_visual="no", expect=["silence_visual"]),
    # ---------------------------------------------------------------- LiaMtrConfig (constructed, bridge forward)
    *[lia(d_vision=v) for v in (0, -1, NAN, "8", 2.5)],
    *[lia(d_model=v) for v in (0, -1, NAN, "16", 2.5)],
    *[lia(d_inner=v) for v in (0, -1, 2.5)],
    *[lia(n_scales=v) for v in (0, -1, 2.5, "4", NAN)],
    *[lia(lambda_min=v) for v in (0, -1, NAN, "0.5", 1.0, INF)],
    *[lia(lambda_max=v) for v in (0, 1.5, NAN, 1.0, "0.9")],
    lia(lambda_min=0.9, lambda_max=0.8),
    *[lia(lambdas=v) for v in ([], [0.0], [1.0], [NAN], ["x"], "abc", [0.5, -0.5])],
    lia(lambdas=[0.5, 0.9], n_scales=3),
    *[lia(chunk_size=v) for v in (0, -1, 2.5, NAN, "64")],
    *[lia(conv_kernel=v) for v in (-1, 2.5, "4", NAN)],
    lia(use_gate="yes"),
    # ---------------------------------------------------------------- MaskPriorSuppression (fit, apply, forward)
    *[api("MaskPriorSuppression", lam=v, expect=["lam"]) for v in (-1, 5, NAN, "0.1", INF)],
    *[api("MaskPriorSuppression", k=v, expect=["k"]) for v in (0, "3", 2.5, -1, 10**6)],
    # our earlier reading (keepsight.diffusion.readings.ProjectionMPS): its own settings
    api("MaskPriorSuppression", reading=True, layers=[99], expect=["layers", "99"]),
    api("MaskPriorSuppression", reading=True, layers="x", expect=["layers"]),
    api("MaskPriorSuppression", reading=True, prior="x", expect=["prior"]),
    api("MaskPriorSuppression", reading=True, n_prior_tokens=0, expect=["n_prior_tokens"]),
    api("MaskPriorSuppression", reading=True, center="yes", expect=["center"]),
    api("MaskPriorSuppression", prior="topk", expect=["prior"]),  # a reading's setting given to the released MPS
    api("MaskPriorSuppression", bogus=1, expect=["bogus"]),
    # ---------------------------------------------------------------- MonotonicRoPEScaling (apply, forward)
    *[api("MonotonicRoPEScaling", beta=v, expect=["beta"]) for v in (NAN, -1, 1e9, "0.1", INF)],
    *[api("MonotonicRoPEScaling", eta=v, expect=["eta"]) for v in (NAN, -1, INF)],
    *[api("MonotonicRoPEScaling", tau0=v, expect=["tau0"]) for v in (2, -1, NAN)],
    api("MonotonicRoPEScaling", schedule="x", expect=["schedule"]),
    api("MonotonicRoPEScaling", reading=True, mode="x", expect=["mode"]),
    api("MonotonicRoPEScaling", mode="amplitude", expect=["mode"]),  # a reading's setting given to the released MRS
    api("MonotonicRoPEScaling", segments=["x"], expect=["segments"]),
    api("MonotonicRoPEScaling", segments=[], expect=["segments"]),
    api("MonotonicRoPEScaling", segments=["generation"], no_gen_start=True, expect=["gen_start"]),
    api("MonotonicRoPEScaling", at=10**6, expect=["gen_start"], tag="gen_start=10**6 (past the sequence)"),
    api("MonotonicRoPEScaling", bogus=1, expect=["bogus"]),
    # ---------------------------------------------------------------- the masked-diffusion sampler
    *[api("generate", gen_length=v, expect=["gen_length"]) for v in (0, -1, 10**6, 2.5)],
    *[api("generate", steps=v, expect=["steps"]) for v in (0, -1, 2.5)],
    api("generate", steps=3, block_length=4, expect=["steps"]),
    *[api("generate", block_length=v, expect=["block_length"]) for v in (7, 0, -4)],
    *[api("generate", temperature=v, expect=["temperature"]) for v in (NAN, -1, INF)],
    *[api("generate", cfg_scale=v, expect=["cfg_scale"]) for v in (NAN, -1, INF)],
    api("generate", remasking="x", expect=["remasking"]),
    api("generate", mask_token_id=10**6, expect=["mask_token_id"]),
    api("generate", suppress_token_ids=[-1], expect=["suppress_token_ids"]),
    api("generate", input_1d=True, expect=["input_ids"]),
    api("generate", bad_attention_mask=True, expect=["attention_mask"]),
    api("generate_vlm", tag="pixel_values=None with image tokens in the prompt", expect=["pixel_values", "image"]),
    api("generate_vlm", with_pixels=True, valid=True, tag="with pixel_values"),
    # ---------------------------------------------------------------- VisualAttentionProbe
    *[api("probe", layers=v, expect=["layer", "layers"]) for v in ([1.5], [], [99], [-99], [0, 0], ["0"])],
    api("probe_nested", tag="two nested probes on one model", expect=["already recording"]),
    api("probe", text_only=True, expect=["image"], tag="a prompt without image tokens"),
    # ---------------------------------------------------------------- loaders
    *[api("load_checkpoint", f"{{{k}}}", expect=list(names))
      for k, names in (("M_trunc", ("model.safetensors",)), ("M_zero", ("model.safetensors",)),
                       ("M_noweights", ("safetensors",)), ("M_badcfg", ("config.json",)),
                       ("M_nocfg", ("config.json",)), ("M_unknown", ("model_type",)),
                       ("M_noproc", ("processor", "tokenizer")), ("F", ("F",)), ("W", ("config.json",)))],
    api("load_checkpoint", "{new:nowhere}", expect=["nowhere"]),
    api("load_checkpoint", "{M}", dtype="int8", expect=["dtype", "int8"]),
    api("load_checkpoint", "{M}", device="cuda", expect=["device", "cuda"]),
    api("load_checkpoint", "{M}", device="tpu", expect=["device", "tpu"]),
    api("load_checkpoint", "{M}", device="cuda:99", expect=["device", "cuda"]),
    api("load_checkpoint", "{M}", expect_kind="diffusion", expect=["diffusion", "autoregressive"]),
    api("load_checkpoint", "{V}", expect_kind="autoregressive", expect=["diffusion", "autoregressive"]),
    api("load_checkpoint", "{M}", dtype=3, expect=["dtype"]),
    *[api("load_pvm", f"{{{k}}}", expect=list(names))
      for k, names in (("A_nan", ("A_nan", "pvm.safetensors")), ("A_mismatch", ("pvm_config.json", "layers", "config")),
                       ("A_badcfg", ("pvm_config.json",)), ("A_noweights", ("pvm.safetensors",)),
                       ("A_emptycfg", ("pvm_config.json",)), ("A_truncw", ("pvm.safetensors",)),
                       ("L", ("pvm_config.json",)))],
    api("load_pvm", "{A}", model="{M2}", expect=["M2", "A"], tag="'{A}' onto another model of the same shape"),
    api("load_pvm", "{A}", twice=True, expect=["attached", "PVM"], tag="'{A}' twice"),
    api("load_llada_v", "{V}", valid=True, expect=["V"]),
    api("load_llada_v", "{M}", expect=["M", "llada"]),
    api("load_llada_v", "{M_trunc}", expect=["model.safetensors"]),
    # ---------------------------------------------------------------- world and training configs
    *[api("WorldConfig", **{k: v}, expect=[k]) for k, v in (
        ("image_size", 0), ("image_size", -8), ("image_size", NAN), ("image_size", 64.5), ("grid", (0, 4)),
        ("grid", (4,)), ("max_objects", 0), ("min_objects", 0), ("noise_std", NAN), ("noise_std", INF),
        ("jitter", NAN), ("prior_colour", 2), ("prior_shape", NAN), ("shapes", ("blob",)), ("sizes", ()))],
    api("world_config", "nope", expect=["difficulty", "nope"]),
    api("build_world", n=0, expect=["n"]),
    api("build_world", n=2, n_objects=0, expect=["n_objects"]),
    *[api("TrainConfig", cls="PVMTrainConfig", **{k: v}, expect=[k]) for k, v in (
        ("steps", 0), ("steps", 2.5), ("lr", NAN), ("lr", -1), ("lr", INF), ("gate_lr", 0), ("batch_size", "16"),
        ("seed", -1), ("save_every", 0))],
    *[api("TrainConfig", cls="GRPOTrainConfig", **{k: v}, expect=[k]) for k, v in (
        ("beta", NAN), ("beta", -1), ("beta", INF), ("num_generations", 1), ("temperature", 0),
        ("max_completion_length", 0))],
    *[api("TrainConfig", cls="DiffusionTrainConfig", **{k: v}, expect=[k]) for k, v in (
        ("answer_length", 0), ("eps", NAN), ("eps", 1))],
    api("TrainConfig", cls="BridgeTrainConfig", phase=3, expect=["phase"]),
    api("TrainConfig", cls="BridgeTrainConfig", phase=1, bridge="unknown", expect=["bridge"]),
    api("TrainConfig", cls="LoRATrainConfig", steps=-1, expect=["steps"]),
    # ---------------------------------------------------------------- training-free baselines
    api("baseline", "nope", expect=["nope", "method"]),
    *[api("baseline", name, **{k: v}, expect=[k]) for name, k, v in (
        ("vcd", "alpha", -1.0), ("vcd", "alpha", NAN), ("vcd", "beta", 2.0), ("vcd", "noise_step", -1),
        ("vcd", "noise_step", 1001), ("pai", "alpha", -0.5), ("pai", "gamma", NAN), ("pai", "layers", [99]),
        ("pai", "rows", "every"), ("memvr", "ratio", INF), ("memvr", "threshold", NAN), ("memvr", "ratio", 1.5),
        ("memvr", "start_layer", -99), ("deco", "alpha", -1.0), ("deco", "layers", [99]), ("deco", "top_p", 1.5),
        ("deco", "top_k", 0))],
    api("baseline", "vcd", alpha=0.0, valid=True, tag="'vcd', alpha=0.0 (identity)"),
    # ---------------------------------------------------------------- the Python API's argument types (issue 39)
    api("pipeline_generate", "describe the image.", expect=["list"], tag="'describe the image.' (a string)"),
    api("pipeline_generate", ["describe the image."], max_new_tokens=0, expect=["max_new_tokens"]),
    api("pipeline_generate", ["describe the image."], max_tokens=4, expect=["max_tokens"]),
    api("decoders", "vcd", expect=["vcd", "pairs"], tag="'vcd'"),
    api("decoders", [["vcd", None], ["vcd", {"alpha": 2.0}]], expect=["vcd", "twice"], tag="vcd twice"),
    api("register_method", "damp_i", config="instance", expect=["config"], tag="a config instance"),
    api("register_method", "damp_b", build=42, expect=["build"], tag="build=42"),
    api("register_method", "damp_l", stage="load", expect=["stage", "load"], tag="stage='load' with a config"),
    api("register_method", "none", stage="load", replace=True, config=None, build=None, expect=["none"],
        tag="'none', replace=True"),
]

# ============================================================================= API handlers (run in a child)


def _processor():
    from keepsight.world.processor import build_processor

    return build_processor()


def _llava(seed: int = 0):
    from keepsight.world.models import build_model

    proc = _processor()
    return build_model("tiny-llava", proc.tokenizer, seed=seed), proc


def _vlm_inputs(proc, text_only: bool = False):
    from PIL import Image

    from keepsight.data import chat_example

    if text_only:
        return proc.tokenizer(["<bos> user : describe the scene . assistant :"], return_tensors="pt")
    img = Image.new("RGB", (64, 64), (30, 30, 220))
    return proc(text=[chat_example(proc, "describe the scene .")], images=[img], return_tensors="pt")


def _llada_lm():
    from keepsight.world.models import build_llada_lm

    tok = _processor().tokenizer
    return build_llada_lm(tok), tok


def _masked_prompt(tok):
    return tok(["<bos> user : describe the scene . assistant : <mask> <mask> <mask> <mask>"],
               return_tensors="pt")["input_ids"]


def _nan(t) -> str | None:
    import torch

    return "the output contains NaN" if bool(torch.isnan(t).any()) else None


def _forward_checked(model, inputs) -> str | None:
    import torch

    with torch.no_grad():
        return _nan(model(**inputs).logits)


def h_pvm_config(fx, **kw):
    from keepsight.pvm import PVMConfig, attach_pvm

    cfg = PVMConfig(**kw)
    model, proc = _llava()
    attach_pvm(model, cfg)
    for branch in model.pvm.values():  # let the branch act on the output (the gate starts at 0)
        branch.gate.data.fill_(0.1)
    return {"bad": _forward_checked(model, _vlm_inputs(proc)),
            "note": f"constructed as {cfg}, attached on layers {model._keepsight_pvm.layers}"}


def h_lia_mtr(fx, **kw):
    import torch

    from keepsight.bridge import LiaMtrBridge, LiaMtrConfig

    cfg = LiaMtrConfig(**kw)
    bridge = LiaMtrBridge(cfg)
    with torch.no_grad():
        y = bridge(torch.randn(2, 9, cfg.d_vision))
    return {"bad": _nan(y), "note": f"constructed, output {tuple(y.shape)} (decays {cfg.lambda_values()})"}


def h_mps(fx, reading: bool = False, **kw):
    import torch

    from keepsight.diffusion import MaskPriorSuppression
    from keepsight.diffusion.readings import ProjectionMPS

    lm, tok = _llada_lm()
    mps = (ProjectionMPS if reading else MaskPriorSuppression)(**kw).fit(lm, tok)
    ids = _masked_prompt(tok)
    with torch.no_grad(), mps.apply(lm):
        logits = lm(ids).logits
    return {"bad": _nan(logits), "note": f"fitted and applied with {mps.config}"}


def h_mrs(fx, no_gen_start: bool = False, at: int | None = None, reading: bool = False, **kw):
    import torch

    from keepsight.diffusion import MonotonicRoPEScaling
    from keepsight.diffusion.readings import RoPEGains

    lm, tok = _llada_lm()
    mrs = (RoPEGains if reading else MonotonicRoPEScaling)(**kw)
    ids = _masked_prompt(tok)
    start = None if no_gen_start else ids.shape[1] - 4 if at is None else at
    with torch.no_grad(), mrs.apply(lm, gen_start=start):
        logits = lm(ids).logits
    return {"bad": _nan(logits), "note": f"applied with {mrs.config}"}


def h_generate(fx, input_1d: bool = False, bad_attention_mask: bool = False, **kw):
    import torch

    from keepsight.diffusion import generate

    lm, tok = _llada_lm()
    ids = tok(["<bos> user : describe the scene . assistant :"], return_tensors="pt")["input_ids"]
    mask = torch.ones(1, ids.shape[1] + 1, dtype=torch.long) if bad_attention_mask else None
    out = generate(lm, ids[0] if input_1d else ids, mask, **{"gen_length": 8, "steps": 4, **kw})
    left = int((out.generated == lm.config.mask_token_id).sum())
    return {"bad": f"{left} slots still masked" if left else None, "note": f"generated {tuple(out.generated.shape)}"}


def h_generate_vlm(fx, with_pixels: bool = False):
    from keepsight.diffusion import generate
    from keepsight.world.models import build_llada_v

    proc = _processor()
    vlm = build_llada_v(proc)
    enc = _vlm_inputs(proc)
    out = generate(vlm, enc["input_ids"], enc["attention_mask"], enc["pixel_values"] if with_pixels else None,
                   gen_length=4, steps=2)
    return {"note": f"generated {tuple(out.generated.shape)} without pixel_values" if not with_pixels else "ok"}


def h_probe(fx, text_only: bool = False, **kw):
    import torch

    from keepsight.probes import VisualAttentionProbe

    model, proc = _llava()
    with VisualAttentionProbe(model, **kw) as probe, torch.no_grad():
        model(**_vlm_inputs(proc, text_only))
    omega = probe.omega_v()
    return {"bad": _nan(omega), "note": f"recorded omega_v {tuple(omega.shape)} on layers {probe.layers}"}


def h_probe_nested(fx):
    import torch

    from keepsight.probes import VisualAttentionProbe

    model, proc = _llava()
    inputs = _vlm_inputs(proc)
    with VisualAttentionProbe(model) as outer, VisualAttentionProbe(model) as inner, torch.no_grad():
        model(**inputs)
    with VisualAttentionProbe(model) as alone, torch.no_grad():
        model(**inputs)
    got = {name: p.log_ratio for name, p in (("outer", outer), ("inner", inner))}
    ref = alone.log_ratio
    wrong = [name for name, lr in got.items()
             if len(lr) != len(ref) or any(a is None or not torch.allclose(a, b) for a, b in zip(lr, ref))]
    if wrong:
        return {"bad": f"the {' and '.join(wrong)} probe recorded {[len(got[w]) for w in wrong]} steps "
                       f"(a lone probe: {len(ref)}), or other values", "note": "two nested probes ran"}
    return {"note": "both nested probes recorded what a lone probe records"}


def h_load_checkpoint(fx, path, expect_kind=None, **kw):
    from keepsight.models import load_checkpoint

    model, proc = load_checkpoint(path, expect=expect_kind, **kw)
    return {"note": f"loaded {type(model).__name__} ({next(model.parameters()).dtype})"}


def h_load_pvm(fx, adapter, model=None, twice=False):
    from keepsight.models import load_checkpoint
    from keepsight.pvm import load_pvm

    m, proc = load_checkpoint(model or fx["M"], dtype=None, device="cpu")
    load_pvm(m, adapter)
    if twice:
        load_pvm(m, adapter)
    return {"bad": _forward_checked(m, _vlm_inputs(proc)), "note": f"attached on layers {m._keepsight_pvm.layers}"}


def h_load_llada_v(fx, path):
    from keepsight.models import load_llada_v

    return {"note": f"loaded {type(load_llada_v(path)).__name__}"}


def h_world_config(fx, *args, **kw):
    from keepsight.world.config import world_config

    return {"note": f"built {world_config(*args, **kw)}"}


def h_world_cfg_fields(fx, **kw):
    from keepsight.world.config import WorldConfig

    return {"note": f"built {WorldConfig(**kw)}"}


def h_build_world(fx, **kw):
    from keepsight.world.config import world_config
    from keepsight.world.dataset import build_world

    build_world(Path(os.getcwd()) / "w", world_config(), **kw)
    return {"note": "wrote the world"}


def h_train_config(fx, cls, **kw):
    from keepsight.train.bridge import BridgeTrainConfig
    from keepsight.train.diffusion import DiffusionTrainConfig
    from keepsight.train.lora_control import LoRATrainConfig
    from keepsight.train.pvm_grpo import GRPOTrainConfig
    from keepsight.train.pvm_sft import PVMTrainConfig

    classes = {c.__name__: c for c in (PVMTrainConfig, GRPOTrainConfig, DiffusionTrainConfig, BridgeTrainConfig,
                                       LoRATrainConfig)}
    cfg = classes[cls](**kw)
    if cls == "BridgeTrainConfig" and "bridge" in kw:  # the kind is only looked up when the bridge is built
        from keepsight.bridge import build_bridge

        build_bridge(cfg.bridge, 8, 16)
    return {"note": f"built {cfg}"}


def h_baseline(fx, name, **kw):
    """Build the baseline and apply it to a tiny LLaVA for one short greedy generation (layer checks happen there)."""
    from keepsight.baselines import build_baseline

    method = build_baseline(name, **kw)
    model, proc = _llava()
    inputs = _vlm_inputs(proc)
    with method.apply(model):
        out = model.generate(**inputs, max_new_tokens=2, do_sample=False)
    return {"note": f"{name}: {out.shape[-1]} tokens, stats {method.stats()}"}


def h_pipeline_generate(fx, contexts, **kw):
    from keepsight.inference import Pipeline

    pipe = Pipeline(fx["M"], dtype="float32", device="cpu")
    out = pipe.generate(contexts, **kw)
    return {"note": f"{len(out.texts)} answers"}


def h_decoders(fx, requests):
    from keepsight.inference import Decoders

    Decoders(requests if isinstance(requests, str) else [tuple(r) for r in requests])


def h_register_method(fx, name, config="class", build="class", **kw):
    import dataclasses

    from keepsight.inference.registry import register_method

    @dataclasses.dataclass
    class DampConfig:
        factor: float = 1.0

    cfg = {"class": DampConfig, "instance": DampConfig(), None: None}[config]
    register_method(name, cfg, (lambda c: c) if build == "class" else build, **kw)


HANDLERS = {"pipeline_generate": h_pipeline_generate, "decoders": h_decoders, "register_method": h_register_method,
            "PVMConfig": h_pvm_config, "LiaMtrConfig": h_lia_mtr, "MaskPriorSuppression": h_mps,
            "MonotonicRoPEScaling": h_mrs, "generate": h_generate, "generate_vlm": h_generate_vlm, "probe": h_probe,
            "probe_nested": h_probe_nested, "load_checkpoint": h_load_checkpoint, "load_pvm": h_load_pvm,
            "load_llada_v": h_load_llada_v, "world_config": h_world_config, "WorldConfig": h_world_cfg_fields,
            "build_world": h_build_world, "TrainConfig": h_train_config, "baseline": h_baseline}

CLEAN_EXCEPTIONS = (ValueError, FileNotFoundError, FileExistsError, TypeError)


def run_api(case: dict, fx: dict, result_file: Path) -> int:
    """In the child: call the case's handler, write what happened to ``result_file``."""
    try:
        out = HANDLERS[case["fn"]](fx, *case["args"], **case["kw"]) or {}
        res = {"raised": None, "bad": out.get("bad"), "note": out.get("note", "")}
    except BaseException as e:  # noqa: BLE001 - every escape is data here
        res = {"raised": type(e).__name__, "message": str(e), "clean": isinstance(e, CLEAN_EXCEPTIONS),
               "runtime": isinstance(e, RuntimeError),
               "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]}
    result_file.write_text(json.dumps(res, default=str))
    return 0


# ============================================================================= fixtures


# fixture name -> directory name: distinctive words, so that "names the file" never matches by accident
DIRS = {"W": "world6", "M": "model_m1", "M2": "model_m2", "V": "model_dv", "A": "adapter_a1", "L": "adapter_l1",
        "B": "world_base", "A_nan": "A_nan"}


def _save_models(root: Path) -> int:
    """In a child: the tiny model directories (tests/tiny_checkpoints.py)."""
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_checkpoints import save_tiny_checkpoint

    save_tiny_checkpoint("tiny-llava", root / DIRS["M"])
    save_tiny_checkpoint("tiny-llava", root / DIRS["M2"], seed=1)
    save_tiny_checkpoint("tiny-llada-v", root / DIRS["V"])
    return 0


def _nan_adapter(src: Path, dst: Path) -> int:
    """In a child: a copy of the adapter ``src`` whose every weight is NaN."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(str(src / "pvm.safetensors"))
    save_file({k: torch.full_like(v, float("nan")) for k, v in weights.items()}, str(dst / "pvm.safetensors"))
    return 0


def _copy_with(root: Path, src: Path, name: str, edit) -> None:
    dst = root / name
    shutil.copytree(src, dst)
    edit(dst)


def _overwrite_middle(path: Path, data: bytes) -> None:
    """Overwrite bytes in the middle of ``path``'s tensor data (a safetensors header stays intact)."""
    raw = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(raw[:8], "little")
    middle = start + (len(raw) - start) // 2
    raw[middle:middle + len(data)] = data
    path.write_bytes(bytes(raw))


def _int_adapter(d: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    w = load_file(str(d / "pvm.safetensors"))
    save_file({k: v.to(torch.int32) for k, v in w.items()}, str(d / "pvm.safetensors"))


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _resize_images(world: Path, side: int) -> None:
    from PIL import Image

    for png in sorted((world / "images").glob("*.png")):
        with Image.open(png) as im:
            im.convert("RGB").resize((side, side)).save(png)


def _edit_json(path: Path, fn) -> None:
    path.write_text(json.dumps(fn(json.loads(path.read_text()))))


def _file_fixtures(root: Path, fx: dict, problems: dict) -> None:
    """Corrupt variants of the model, adapter and world directories, plain files, COCO-style annotations."""
    def need(*keys):
        missing = [k for k in keys if k not in fx]
        return not missing

    (root / "plain.txt").write_text("not a directory\n")
    fx["F"] = root / "plain.txt"
    d = root / "unrelated_dir"
    (d / "sub").mkdir(parents=True)
    (d / "notes.txt").write_text("unrelated work that must survive\n")
    (d / "sub" / "data.csv").write_text("a,b\n1,2\n")
    fx["D"] = d
    (root / "empty_dir").mkdir()
    fx["EMPTY"] = root / "empty_dir"
    (root / "notimage.png").write_text("this is text, not a PNG\n")
    fx["NOTIMG"] = root / "notimage.png"
    ro = root / "readonly"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        (ro / "probe").write_text("x")
        (ro / "probe").unlink()
        problems["RO"] = (f"running as uid {os.geteuid()}: a 0555 directory is writable here, so read-only "
                          "--out cases cannot be tested")
    except PermissionError:
        fx["RO"] = ro
    # COCO-style captions + annotations (the layout of tests/metrics/test_coco_chair.py)
    coco = root / "coco"
    ann = coco / "annotations"
    ann.mkdir(parents=True)
    cats = [{"id": 1, "name": "person", "supercategory": "x"}, {"id": 18, "name": "dog", "supercategory": "x"}]
    for split, ids in (("train", [4]), ("val", [1, 2])):
        images = [{"id": i, "file_name": f"COCO_{split}2014_{i:012d}.jpg", "width": 64, "height": 64} for i in ids]
        inst = [{"id": 10 * i, "image_id": i, "category_id": 1 if i % 2 else 18, "bbox": [0, 0, 1, 1], "area": 1,
                 "iscrowd": 0} for i in ids]
        caps = [{"id": 10 * i, "image_id": i, "caption": "A man walks his dog."} for i in ids]
        (ann / f"instances_{split}2014.json").write_text(json.dumps({"images": images, "annotations": inst,
                                                                     "categories": cats}))
        (ann / f"captions_{split}2014.json").write_text(json.dumps({"images": images, "annotations": caps}))
    fx["COCO"] = coco
    shutil.copytree(coco, root / "coco_bad")
    _truncate(root / "coco_bad" / "annotations" / "instances_val2014.json", 0.5)
    fx["COCO_bad"] = root / "coco_bad"
    lines = [{"image_id": 1, "caption": "A man and a dog and a car."}, {"image_id": 2, "caption": "A dog."}]
    (root / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    fx["CAPS"] = root / "captions.jsonl"
    (root / "captions_bad.jsonl").write_text(json.dumps(lines[0]) + "\n{\"image_id\": 2, \"capt\n")
    fx["CAPS_bad"] = root / "captions_bad.jsonl"
    (root / "captions_empty.jsonl").write_text("\n")
    fx["CAPS_empty"] = root / "captions_empty.jsonl"
    (root / "captions_unknown.jsonl").write_text(json.dumps({"image_id": 999999, "caption": "A dog."}) + "\n")
    fx["CAPS_unknown"] = root / "captions_unknown.jsonl"
    # LLaVA-format data over the world's images, predictions files
    if need("W"):
        images = sorted((fx["W"] / "images").glob("*.png"))[:2]
        rows = [{"id": f"r{i}", "image": f"images/{im.name}", "conversations": [
            {"from": "human", "value": "<image>\nIs there a red circle?"}, {"from": "gpt", "value": "yes"}]}
            for i, im in enumerate(images)]
        (root / "J.json").write_text(json.dumps(rows))
        fx["J"] = root / "J.json"
        (root / "J_missing.json").write_text(json.dumps(rows + [{**rows[0], "id": "gone", "image": "images/nowhere.png"}]))
        fx["J_missing"] = root / "J_missing.json"
        (root / "J_notlist.json").write_text(json.dumps({"rows": rows}))
        fx["J_notlist"] = root / "J_notlist.json"
        (root / "J_noconv.json").write_text(json.dumps([{"id": "x", "image": rows[0]["image"]}]))
        fx["J_noconv"] = root / "J_noconv.json"
    preds = [{"id": "a", "prompt": "Is there a dog?", "answer": "Yes.", "reference": "yes"},
             {"id": "b", "prompt": "Is there a cat?", "answer": "yes", "reference": "no"}]
    (root / "P.jsonl").write_text("".join(json.dumps(r) + "\n" for r in preds))
    fx["P"] = root / "P.jsonl"
    (root / "P_bad.jsonl").write_text(json.dumps(preds[0]) + "\n{\"id\": \"b\", \"ans\n")
    fx["P_bad"] = root / "P_bad.jsonl"
    (root / "P_dup.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (preds[0], {**preds[0], "answer": "no"})))
    fx["P_dup"] = root / "P_dup.jsonl"
    from keepsight.atomic import mark, write_output_text

    gd = root / "GD"  # a predictions file keepsight wrote (with its record beside it)
    gd.mkdir()
    write_output_text(gd / "G.jsonl", (root / "P.jsonl").read_text(), "predictions")
    fx["GD"] = gd
    pope = root / "POPE_D"  # an earlier eval pope --model run's output
    pope.mkdir()
    for name, text in (("questions.jsonl", "{}\n"), ("answers.jsonl", "{}\n"), ("scores.json", "{}")):
        (pope / name).write_text(text)
    mark(pope, "pope")
    fx["POPE_D"] = pope
    ut = root / "UT"  # a user's file named like a temporary file of the output beside it
    ut.mkdir()
    (ut / "p.jsonl.tmp").write_text("the user's notes\n")
    fx["UT"] = ut
    # models
    if need("M"):
        variants = {
            "M_trunc": lambda d: _truncate(d / "model.safetensors", 0.5),
            "M_zero": lambda d: (d / "model.safetensors").write_bytes(b""),
            "M_noweights": lambda d: (d / "model.safetensors").unlink(),
            "M_badcfg": lambda d: (d / "config.json").write_text('{"model_type": "llava", '),
            "M_nocfg": lambda d: (d / "config.json").unlink(),
            "M_unknown": lambda d: _edit_json(d / "config.json", lambda c: {**c, "model_type": "bert"}),
            "M_noproc": lambda d: [(d / f).unlink() for f in ("processor_config.json", "tokenizer.json",
                                                              "tokenizer_config.json")],
            "M_nanw": lambda d: _overwrite_middle(d / "model.safetensors", b"\xff" * 4096),  # header intact
        }
        for name, edit in variants.items():
            _copy_with(root, fx["M"], name, edit)
            fx[name] = root / name
    # adapters
    if need("A"):
        def mismatch(cfg):  # names other layers than its weights hold
            return {**cfg, "pvm": {**cfg["pvm"], "layers": [0]}, "layers": [0]}

        variants = {
            "A_badcfg": lambda d: (d / "pvm_config.json").write_text('{"pvm": {"layers": [1, 2'),
            "A_mismatch": lambda d: _edit_json(d / "pvm_config.json", mismatch),
            "A_noweights": lambda d: (d / "pvm.safetensors").unlink(),
            "A_emptycfg": lambda d: (d / "pvm_config.json").write_text("{}"),
            "A_truncw": lambda d: _truncate(d / "pvm.safetensors", 0.5),
            "A_int": _int_adapter,
        }
        for name, edit in variants.items():
            _copy_with(root, fx["A"], name, edit)
            fx[name] = root / name
        if need("W"):  # an adapter directory the user also keeps a dataset in
            _copy_with(root, fx["A"], "A_data", lambda d: shutil.copytree(fx["W"], d / "mydata"))
            fx["A_data"] = root / "A_data"
    if need("L"):
        _copy_with(root, fx["L"], "L_badcfg", lambda d: (d / "adapter_config.json").write_text('{"r": 3,'))
        fx["L_badcfg"] = root / "L_badcfg"
        _copy_with(root, fx["L"], "L_noweights", lambda d: (d / "adapter_model.safetensors").unlink())
        fx["L_noweights"] = root / "L_noweights"
    # worlds
    if need("W"):
        def broken_line(d):
            lines = (d / "scenes.jsonl").read_text().splitlines(keepends=True)
            lines[1] = lines[1][: len(lines[1]) // 2] + "\n"
            (d / "scenes.jsonl").write_text("".join(lines))

        def bad_scene(d):
            recs = [json.loads(x) for x in (d / "scenes.jsonl").read_text().splitlines()]
            recs[0]["scene"] = {"id": recs[0]["id"]}
            (d / "scenes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

        variants = {
            "W_brokenline": broken_line,
            "W_notimage": lambda d: next(iter(sorted((d / "images").glob("*.png")))).write_text("not a png\n"),
            "W_size": lambda d: _resize_images(d, 48),
            "W_noimage": lambda d: next(iter(sorted((d / "images").glob("*.png")))).unlink(),
            "W_badmeta": lambda d: (d / "world.json").write_text("{"),
            "W_empty": lambda d: (d / "scenes.jsonl").write_text(""),
            "W_badscene": bad_scene,
        }
        for name, edit in variants.items():
            _copy_with(root, fx["W"], name, edit)
            fx[name] = root / name


def build_fixtures(root: Path, runner: Runner) -> tuple[dict, dict]:
    """Build every fixture under ``root``; returns (name -> path, name -> why it could not be built)."""
    fx: dict[str, Path] = {}
    problems: dict[str, str] = {}

    def phase(jobs: list[tuple[str, dict, list[str]]]) -> None:
        """jobs: (fixture names, a case that builds them, fixtures it needs)."""
        todo = []
        for names, case, needs in jobs:
            missing = [n for n in needs if n not in fx]
            if missing:
                for n in names.split():
                    problems[n] = f"needs {missing}, which could not be built"
                continue
            todo.append((names, {**case, "valid": True, "expect": [], "timeout": 300}))
        for (names, _), rec in zip(todo, runner.run([c for _, c in todo], fx)):
            for n in names.split():
                if rec["outcome"] == "ok":
                    fx[n] = root / DIRS.get(n, n)
                else:
                    problems[n] = f"{rec['input']}: {rec['outcome']}: {rec['reason']}"

    t0 = time.time()
    d = {k: root / v for k, v in DIRS.items()}
    phase([("W", cli("fixture:W", f"world build --out {d['W']} --n 6 --seed 1"), []),
           ("M M2 V", {"id": "fixture:models", "kind": "py", "fn": _save_models, "args": [root]}, [])])
    phase([("A", cli("fixture:A", f"pvm train --stage sft --model {{M}} --data {{W}} --out {d['A']} --steps 2 "
                     "--batch-size 2"), ["M", "W"]),
           ("L", cli("fixture:L", f"lora train --model {{M}} --data {{W}} --out {d['L']} --steps 2 --batch-size 2"),
            ["M", "W"]),
           ("B", cli("fixture:B", f"world train --out {d['B']} --data {{W}} --steps-scale 0.001 --batch-size 2"),
            ["W"])])
    phase([("A_nan", {"id": "fixture:A_nan", "kind": "py", "fn": _nan_adapter, "args": [d["A"], d["A_nan"]]},
            ["A"])])
    _file_fixtures(root, fx, problems)
    print(f"fixtures: {len(fx)} built in {time.time() - t0:.0f} s under {root}"
          + (f"; not built: {', '.join(sorted(problems))}" if problems else ""), flush=True)
    return fx, problems


# ============================================================================= running cases

TOKEN = re.compile(r"\{(\w+)(?::([\w.]+))?\}")


def referenced(case: dict) -> set[str]:
    """Fixture names a case's command line / arguments / kept paths refer to."""
    texts = [case.get("argv", ""), *case.get("keep", []), *map(str, case.get("args", [])),
             *(str(v) for v in case.get("kw", {}).values())]
    names = set()
    for text in texts:
        for key, arg in TOKEN.findall(text):
            if key == "copy":
                names.add(arg)
            elif key not in ("tmp", "new"):
                names.add(key)
    return names


def expand(value, fx: dict, scratch: Path):
    """Placeholders in ``value`` (a str, or lists / dicts of them) -> paths; ``{copy:X}`` copies X once."""
    if isinstance(value, list):
        return [expand(v, fx, scratch) for v in value]
    if isinstance(value, dict):
        return {k: expand(v, fx, scratch) for k, v in value.items()}
    if not isinstance(value, str):
        return value

    def sub(m):
        key, arg = m.group(1), m.group(2)
        if key == "tmp":
            return str(scratch)
        if key == "new":
            return str(scratch / arg)
        if key == "copy":
            src = Path(fx[arg])
            dst = scratch / src.name  # the fixture's own name, which the case's expected names refer to
            if not dst.exists():
                shutil.copytree(src, dst, symlinks=True) if src.is_dir() else shutil.copy2(src, dst)
            return str(dst)
        return str(fx[key])

    return TOKEN.sub(sub, value)


def expected_names(case: dict, fx: dict) -> list[str]:
    """What a clear error may name: fixture names become their file names, ``--opt`` also counts as ``opt``."""
    out = []
    for e in case.get("expect", []):
        out.append(Path(fx[e]).name if e in fx else e)
        if e.startswith("--"):
            out.append(e[2:])
    return list(dict.fromkeys(out))


def snapshot(path: Path) -> dict[str, str]:
    """relative file path -> sha256 of every file under ``path`` (or of ``path`` itself)."""
    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    if path.is_file():
        return {".": sha(path)}
    if path.is_dir():
        return {str(p.relative_to(path)): sha(p) for p in sorted(path.rglob("*")) if p.is_file()}
    return {}


class Child:
    """A running case: a forked child calling ``target()`` (its return value is the exit code), or a process."""

    def __init__(self, scratch: Path, target=None, argv: list[str] | None = None, mem_bytes: int = 0):
        out, err = scratch / "stdout.txt", scratch / "stderr.txt"
        if argv is not None:  # a real `python -m keepsight.cli` process
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
            with open(out, "wb") as fo, open(err, "wb") as fe:
                self.proc = subprocess.Popen([sys.executable, "-m", "keepsight.cli", *argv], cwd=scratch, env=env,
                                             stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, start_new_session=True,
                                             preexec_fn=lambda: _limit_memory(mem_bytes))
            self.pid = self.proc.pid
            return
        self.proc = None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.setpgid(0, 0)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                for fd, path in ((1, out), (2, err)):
                    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(f, fd)
                    os.close(f)
                os.chdir(scratch)
                _limit_memory(mem_bytes)
                import torch

                torch.set_num_threads(1)
                code = target()
            except SystemExit as e:  # as the interpreter does: an int is the code, anything else is printed
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - an uncaught exception: the traceback, exit 1, as python does
                traceback.print_exc()
                code = 1
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        self.pid = pid

    def poll(self) -> int | None:
        if self.proc is not None:
            return self.proc.poll()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        return None if pid == 0 else os.waitstatus_to_exitcode(status)

    def kill(self) -> int:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc is not None:
            return self.proc.wait()
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def _limit_memory(mem_bytes: int) -> None:
    if mem_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))


def _cli_target(argv: list[str]):
    def target() -> int:
        from keepsight import cli as keepsight_cli

        sys.argv = ["keepsight", *argv]
        return keepsight_cli.main(argv)

    return target


class Runner:
    def __init__(self, root: Path, jobs: int = 2, subprocess_cli: bool = False, mem_gib: float = 8.0):
        self.root, self.jobs, self.subprocess_cli = root, jobs, subprocess_cli
        self.mem_bytes = int(mem_gib * 2**30)
        self.t_start = time.time()
        self.cases_dir = root / "cases"
        self.cases_dir.mkdir(parents=True, exist_ok=True)

    def _start(self, case: dict, fx: dict) -> dict:
        scratch = self.cases_dir / re.sub(r"[^\w.=+-]+", "_", case["id"])[:120]
        n = 1
        while scratch.exists():
            scratch = scratch.with_name(f"{scratch.name.rsplit('~', 1)[0]}~{n}")
            n += 1
        scratch.mkdir(parents=True)
        kind = case["kind"]
        run = {"case": case, "scratch": scratch, "t0": time.time(), "argv": None,
               "expect": expected_names(case, fx)}
        if kind == "cli":
            argv = [expand(tok, fx, scratch) for tok in shlex.split(case["argv"])]
            run["argv"] = argv
        run["keep"] = {p: snapshot(Path(p)) for p in expand(case.get("keep", []), fx, scratch)}
        if kind == "cli" and self.subprocess_cli:
            run["child"] = Child(scratch, argv=run["argv"], mem_bytes=self.mem_bytes)
        elif kind == "cli":
            run["child"] = Child(scratch, _cli_target(run["argv"]), mem_bytes=self.mem_bytes)
        elif kind == "api":
            api_case = {**case, "args": expand(case["args"], fx, scratch), "kw": expand(case["kw"], fx, scratch)}
            run["input"] = f"{case['fn']}({', '.join(map(repr, api_case['args']))}" + "".join(
                f", {k}={v!r}" for k, v in api_case["kw"].items()) + ")"
            result = scratch / "result.json"
            run["child"] = Child(scratch, lambda: run_api(api_case, fx, result), mem_bytes=self.mem_bytes)
        else:  # "py": a fixture-building function
            run["child"] = Child(scratch, lambda: case["fn"](*case["args"]), mem_bytes=self.mem_bytes)
        limit = case.get("accepted_after") or case.get("timeout") or (CLI_TIMEOUT if kind == "cli" else API_TIMEOUT)
        run["deadline"] = run["t0"] + limit
        run["limit"] = limit
        return run

    def run(self, cases: list[dict], fx: dict, problems: dict | None = None, progress: bool = False) -> list[dict]:
        """Run ``cases`` (``jobs`` at a time); returns their records in order."""
        problems = problems or {}
        records: list[dict | None] = [None] * len(cases)
        pending = list(enumerate(cases))
        running: dict[int, dict] = {}
        done = 0
        while pending or running:
            while pending and len(running) < self.jobs:
                i, case = pending.pop(0)
                missing = sorted(n for n in referenced(case) if n not in fx)
                if case.get("skip") or missing:
                    why = case.get("skip") or "; ".join(problems.get(n, f"fixture {n} missing") for n in missing)
                    records[i] = record(case, None, skipped=why)
                    continue
                running[i] = self._start(case, fx)
            for i, run in list(running.items()):
                code = run["child"].poll()
                timed_out = False
                if code is None and time.time() > run["deadline"]:
                    code, timed_out = run["child"].kill(), True
                if code is None:
                    continue
                del running[i]
                run.update(exit_code=code, timed_out=timed_out, seconds=time.time() - run["t0"])
                records[i] = record(run["case"], run)
                done += 1
                if progress and (done % 25 == 0):
                    print(f"  {done} cases run ({time.time() - self.t_start:.0f} s)", flush=True)
            time.sleep(0.02)
        return records


# ============================================================================= classifying

ARGPARSE_ERROR = re.compile(r"^keepsight(?: [\w-]+)*: error: ")


def names_problem(message: str, expect: list[str]) -> bool:
    """Whether ``message`` names one of ``expect`` as a word ('-' and '_' alike, case-insensitive)."""
    msg = message.lower().replace("_", "-")
    for e in expect:
        e = e.lower().replace("_", "-")
        if re.search(r"(?<![\w])" + re.escape(e) + r"(?![\w])", msg):
            return True
    return False


def record(case: dict, run: dict | None, skipped: str | None = None) -> dict:
    """The JSON record of one case, with its outcome and a one-line reason."""
    rec = {"id": case["id"], "kind": case["kind"], "input": case.get("argv") or run_input(case, run),
           "expected": run["expect"] if run else case.get("expect", []), "valid": case.get("valid", False), "outcome": None, "reason": "",
           "exit_code": None, "message": "", "stderr_first_line": "", "seconds": 0.0}
    if skipped:
        rec.update(outcome="skipped", reason=skipped)
        return rec
    rec["seconds"] = round(run["seconds"], 2)
    if run["argv"] is not None:
        rec["argv"] = shlex.join(run["argv"])
    stdout = _read(run["scratch"] / "stdout.txt")
    stderr = _read(run["scratch"] / "stderr.txt")
    err_lines = [ln for ln in stderr.splitlines() if ln.strip()]
    rec["stderr_first_line"] = err_lines[0] if err_lines else ""
    rec["exit_code"] = run["exit_code"]
    outcome, reason, message = classify(case, run, stdout, stderr)
    # inputs that had to survive: checked last, they override every other outcome
    lost = []
    for path, before in run["keep"].items():
        after = snapshot(Path(path))
        gone = [rel for rel, h in before.items() if after.get(rel) != h]
        if gone:
            what = ("deleted" if not Path(path).exists() else "overwritten" if gone == ["."]
                    else f"changed/removed {', '.join(gone[:4])}")
            lost.append(f"{Path(path).name}: {what}")
    if lost:
        outcome, reason = "data_loss", f"{'; '.join(lost)} (the command {outcome_phrase(outcome, reason)})"
    created = [p for p in case.get("must_not_create", []) if (run["scratch"] / p).exists()]
    if created:
        reason += f"; created {', '.join(str((run['scratch'] / p).resolve()) for p in created)} outside --runs"
    rec.update(outcome=outcome, reason=reason, message=message)
    return rec


def run_input(case: dict, run: dict | None) -> str:
    if run is not None and "input" in run:
        return run["input"]
    if case["kind"] == "api":
        return f"{case['fn']}({', '.join(map(repr, case['args']))}" + "".join(
            f", {k}={v!r}" for k, v in case["kw"].items()) + ")"
    return case["id"]


def outcome_phrase(outcome: str, reason: str) -> str:
    return {"ok": "succeeded", "silent": "succeeded"}.get(outcome, f"ended {outcome}: {reason[:160]}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def exception_line(stderr: str) -> str:
    """The ``ExcType: message`` line of the last traceback in ``stderr`` (else its last non-empty line)."""
    lines = stderr.splitlines()
    starts = [i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln]
    if starts:
        for ln in lines[starts[-1] + 1:]:
            if ln.strip() and not ln.startswith(" "):
                return ln.strip()
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "")


def _success(case: dict, what: str, bad: str | None = None) -> tuple[str, str]:
    if bad:
        return "silent", f"{what}, but {bad}"
    if case.get("valid") is False:
        return "silent", f"accepted: {what}"
    return "ok", what


def classify(case: dict, run: dict, stdout: str, stderr: str) -> tuple[str, str, str]:
    """(outcome, reason, the error message) of a finished case (before the data-loss check)."""
    valid, expect = case.get("valid", False), run["expect"]
    if run["timed_out"]:
        if case.get("accepted_after") and valid is None:
            return "ok", f"accepted: still running after {run['limit']:.0f} s (a legitimate long run; killed)", ""
        return "hang", f"still running after {run['limit']:.0f} s; killed", ""
    if case["kind"] == "api":
        return classify_api(case, run)
    code = run["exit_code"]
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if "Traceback (most recent call last)" in stderr or code not in (0, 2):
        last = exception_line(stderr)
        why = f"exit {code}" if code >= 0 else f"killed by signal {-code}"
        outcome = "broken" if case.get("control") else "traceback"
        return outcome, f"{why}: {last[:300]}", last
    if code == 0:
        out_lines = [ln for ln in stdout.splitlines() if ln.strip()]
        outcome, reason = _success(case, f"exit 0: {out_lines[-1][:200] if out_lines else '(no output)'}")
        return outcome, reason, ""
    # exit 2: our own one-line error, or argparse's usage + error
    ours = [ln for ln in lines if ln.startswith("keepsight: error: ")]
    argparse_err = lines and lines[0].startswith("usage: ") and ARGPARSE_ERROR.match(lines[-1])
    message = ours[-1] if ours else (lines[-1] if lines else "")
    clean = (len(lines) == 1 and ours) or (argparse_err and all(
        ln.startswith(("usage: ", " ")) for ln in lines[:-1]))
    if valid is True:
        if case.get("control"):
            return "broken", f"exit 2: {message[:300]}", message
        return "unnamed", f"rejected a valid input: {message[:300]}", message
    if not clean:
        extra = len(lines) - 1
        if ours and names_problem(message, expect):
            return "clear", f"{message[:300]} (+{extra} other stderr lines)", message
        return "unnamed", f"{message[:300]} (+{extra} other stderr lines, names none of {expect})", message
    if names_problem(message, expect):
        return "clear", message[:300], message
    return "unnamed", f"{message[:300]} (names none of {expect})", message


def classify_api(case: dict, run: dict) -> tuple[str, str, str]:
    valid, expect = case.get("valid", False), run["expect"]
    res_file = run["scratch"] / "result.json"
    if not res_file.is_file():
        code = run["exit_code"]
        stderr = _read(run["scratch"] / "stderr.txt").strip().splitlines()
        why = f"killed by signal {-code}" if code < 0 else f"exit {code}"
        return "traceback", f"the child died ({why}): {stderr[-1][:200] if stderr else ''}", ""
    res = json.loads(res_file.read_text())
    if res["raised"] is None:
        outcome, reason = _success(case, res.get("note") or "no exception", res.get("bad"))
        return outcome, reason, ""
    message = f"{res['raised']}: {res['message']}".splitlines()[0] if res["message"] else res["raised"]
    if case.get("control"):
        return "broken", f"raised: {message[:300]}", message
    if valid is True:  # a clean error cannot be "clear" about a problem that is not there
        outcome = "unnamed" if res["clean"] or res["runtime"] else "traceback"
        return outcome, f"rejected a valid input: {message[:300]}", message
    if res["clean"]:
        if names_problem(res["message"], expect):
            return "clear", message[:300], message
        return "unnamed", f"{message[:300]} (names none of {expect})", message
    if res["runtime"]:
        return "unnamed", f"{message[:300]} (a RuntimeError)", message
    return "traceback", f"{message[:300]} (not one of the clean exception types)", message


# ============================================================================= report


def report(records: list[dict], seconds: float, problems: dict) -> str:
    counts = Counter(r["outcome"] for r in records)
    groups: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        parts = r["id"].split(":")
        groups[parts[0] + ":" + (parts[1].split("(")[0] if len(parts) > 1 else "")][r["outcome"]] += 1
    shown = [o for o in OUTCOMES if counts[o]]
    width = max(len(g) for g in groups) + 2
    lines = [f"{'group':<{width}}" + "".join(f"{o:>10}" for o in shown) + f"{'total':>8}"]
    for g in sorted(groups):
        lines.append(f"{g:<{width}}" + "".join(f"{groups[g][o] or '':>10}" for o in shown)
                     + f"{sum(groups[g].values()):>8}")
    lines.append(f"{'all':<{width}}" + "".join(f"{counts[o]:>10}" for o in shown) + f"{len(records):>8}")
    lines.append("")
    for o in OUTCOMES:
        if o in ("clear", "ok") or not counts[o]:
            continue
        lines.append(f"--- {o} ({counts[o]})")
        for r in records:
            if r["outcome"] == o:
                lines.append(f"  {r['id']}: {r['reason']}")
    noisy = [r for r in records if r["outcome"] == "clear" and "other stderr lines" in r["reason"]]
    if noisy:
        lines.append(f"--- clear, but stderr had more than the error line ({len(noisy)})")
        lines += [f"  {r['id']}: {r['reason']}" for r in noisy]
    if problems:
        lines.append("--- fixtures not built")
        lines += [f"  {k}: {v}" for k, v in sorted(problems.items())]
    lines.append(f"{len(records)} cases in {seconds:.0f} s")
    return "\n".join(lines)


def all_cases() -> list[dict]:
    cases = CLI_CASES + API_CASES
    ids = Counter(c["id"] for c in cases)
    dup = [i for i, n in ids.items() if n > 1]
    if dup:
        raise ValueError(f"duplicate case ids: {dup}")
    return cases


FAILING = ("traceback", "silent", "hang", "data_loss", "broken")  # outcomes that fail --strict


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/bench/bad_inputs.json", help="the JSON records")
    p.add_argument("--only", action="append", help="run the cases whose id contains this (repeatable)")
    p.add_argument("--keep", action="store_true", help="keep the fixtures and scratch directories")
    p.add_argument("--jobs", type=int, default=2, help="cases at a time")
    p.add_argument("--subprocess", action="store_true", help="run CLI cases as real `python -m keepsight.cli`")
    p.add_argument("--mem-gib", type=float, default=8.0, help="address-space limit of each case")
    p.add_argument("--list", action="store_true", help="list the case ids and exit")
    p.add_argument("--strict", action="store_true",
                   help=f"exit 1 when any case ends {'/'.join(FAILING)} (CI runs it so)")
    args = p.parse_args(argv)
    if args.jobs < 1 or not math.isfinite(args.mem_gib) or args.mem_gib <= 0:
        p.error("--jobs must be >= 1 and --mem-gib > 0")
    cases = all_cases()
    if args.only:
        cases = [c for c in cases if any(s in c["id"] for s in args.only)]
    if args.list:
        print("\n".join(c["id"] for c in cases))
        return 0
    print(f"{len(cases)} cases ({sum(c['kind'] == 'cli' for c in cases)} CLI, "
          f"{sum(c['kind'] == 'api' for c in cases)} API)", flush=True)
    t0 = time.time()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import keepsight.cli  # noqa: F401 - imported once here, inherited by every forked case
    import keepsight.diffusion  # noqa: F401
    import keepsight.probes  # noqa: F401
    import keepsight.report.plots  # noqa: F401
    import keepsight.world.models  # noqa: F401

    try:
        import peft  # noqa: F401
    except ImportError:
        pass
    root = Path(tempfile.mkdtemp(prefix="keepsight-bad-inputs-"))
    runner = Runner(root, args.jobs, args.subprocess, args.mem_gib)
    try:
        fx, problems = build_fixtures(root, runner)
        records = runner.run(cases, fx, problems, progress=True)
        seconds = time.time() - t0
        print(report(records, seconds, problems))
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        summary = {o: n for o, n in Counter(r["outcome"] for r in records).items()}
        out.write_text(json.dumps({"seconds": round(seconds, 1), "summary": summary, "fixture_problems": problems,
                                   "mode": "subprocess" if args.subprocess else "fork", "cases": records},
                                  indent=1, default=str))
        print(f"wrote {out}")
        failing = sorted(r["id"] for r in records if r["outcome"] in FAILING)
        if args.strict and failing:
            print(f"{len(failing)} case(s) failed: {', '.join(failing[:20])}", file=sys.stderr)
            return 1
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            ro = root / "readonly"
            if ro.exists():
                ro.chmod(0o755)
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
