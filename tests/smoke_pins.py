"""The smoke profile's results pinned: a silent change to any stage of the pipeline (data, training, evaluation)
moves one of these numbers. After an intended change, regenerate the pins with
``python tests/smoke_pins.py <runs>/smoke/results.json`` and say why in the commit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

PINS = Path(__file__).with_name("smoke_pins.json")
PATHS = [
    ("base", "stages", "lm", "last_loss"), ("base", "stages", "instruct", "last_loss"),
    ("base", "yes_no", "overall_acc"), ("base", "descriptions", "chair", "object_recall"),
    ("base", "history", "by_length", "0", "acc"), ("base", "history", "by_length", "15", "acc"),
    ("base", "diagnosis", "tvr_plateau"),
    ("pvm", "training", "pvm_sft", "last_loss"), ("pvm", "training", "lora", "last_loss"),
    ("pvm", "training", "full_ft", "last_loss"), ("pvm", "comparison", "pvm_sft", "yes_no_acc"),
    ("bridge", "final_train_loss", "lia_mtr_phase2"), ("bridge", "arms", "lia_mtr_phase2", "yes_no", "overall_acc"),
    ("diffusion", "training", "last_loss"),
]


def pick(results: dict) -> dict[str, float]:
    out = {}
    for path in PATHS:
        v = results
        for p in path:
            v = v[p]
        out["/".join(path)] = v
    return out


if __name__ == "__main__":
    PINS.write_text(json.dumps(pick(json.loads(Path(sys.argv[1]).read_text())), indent=2) + "\n")
    print(f"wrote {PINS}")
