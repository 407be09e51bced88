"""One arm of a world experiment: a model (base, or base + a method) scored the same way as every other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..world.base import TrainConfig
from ..world.config import WorldConfig
from ..world.diagnose import diagnose
from ..world.dilution import early_late
from ..world.evaluate import (
    HISTORY_LENGTHS,
    evaluate_after_description,
    evaluate_descriptions,
    evaluate_history,
    evaluate_open,
    evaluate_yes_no,
)
from ..world.tasks import WorldSamples


@dataclass
class EvalSets:
    """The held-out sets every arm is scored on (built once by the demo)."""

    eval: WorldSamples  # mixed object counts: yes/no, open answers, CHAIR
    dilution: WorldSamples  # a fixed object count: accuracy by index, early vs late
    diagnosis: WorldSamples  # a subset of ``dilution`` for attention / LogitLens

    @property
    def n_objects(self) -> int:
        return len(self.dilution.scenes[0].objects) if len(self.dilution) else 0


@dataclass
class ExperimentContext:
    """What every world experiment starts from (built once by the demo)."""

    model_dir: Path  # the trained base model
    train_config: TrainConfig  # how it was trained (its stages' schedules and seeds)
    world: WorldConfig
    sets: EvalSets  # the held-out sets every arm is scored on
    base: dict  # the base arm's results (``evaluate_arm``)
    scenes: Callable[[], WorldSamples]  # the training scenes (built on first use)
    log: Callable[[str], None] = field(default=print)


def evaluate_arm(model, processor, sets: EvalSets, log=print, decoding_method: bool = False) -> dict:
    """Yes/no by category, open answers, description CHAIR, accuracy by index, early vs late, the
    attention / TVR / LogitLens diagnosis, the multi-turn dilution regime (accuracy of a fixed visual
    question after 0 .. 15 turns of history) and the generated-text regime (the same question after the arm's own
    description, and with the image shown again before it: ``evaluate_after_description``). Description texts are
    dropped from the result, except a few.
    ``decoding_method``: a decoding-time method is active (``keepsight.baselines``): yes/no answers are decoded
    (left padding) and the attention probes are left out (the diagnosis is None, the history has no Omega_V)."""
    log(f"  yes/no on {len(sets.eval)} scenes")
    yn, _ = evaluate_yes_no(model, processor, sets.eval, decode=decoding_method)
    log("  open answers")
    open_acc = evaluate_open(model, processor, sets.eval)
    log(f"  descriptions of {len(sets.eval)} scenes")
    desc = evaluate_descriptions(model, processor, sets.eval)
    k = sets.n_objects
    log(f"  dilution curve on {len(sets.dilution)} scenes with {k} objects")
    dil = evaluate_descriptions(model, processor, sets.dilution)
    diag = None
    if not decoding_method:
        log(f"  attention mass, TVR and LogitLens while describing {len(sets.diagnosis)} scenes")
        diag = diagnose(model, processor, sets.diagnosis)
    log(f"  a visual question after 0 .. {HISTORY_LENGTHS[-1]} turns of history, {len(sets.eval)} scenes")
    history = evaluate_history(model, processor, sets.eval, probe=not decoding_method)
    log(f"  the same question after the arm's own description, {len(sets.eval)} scenes")
    after_description = evaluate_after_description(model, processor, sets.eval, descriptions=desc["texts"])
    return {
        "yes_no": yn,
        "open": open_acc,
        "descriptions": {key: v for key, v in desc.items() if key != "texts"},
        "dilution": {"n_objects": k, **{key: v for key, v in dil.items() if key != "texts"},
                     "early_late": early_late(dil["texts"], sets.dilution.scenes, max(1, k // 2))},
        "diagnosis": diag,
        "history": history,
        "after_description": after_description,
        "texts": desc["texts"][:6],
    }


def relative_change(new: float | None, old: float | None) -> float | None:
    """(new - old) / old, None when either is missing or old is 0."""
    if new is None or old is None or old == 0:
        return None
    return (new - old) / old
