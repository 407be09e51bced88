"""The LIA-MTR world experiment: MLP vs LIA-MTR projector from the same backbone, same budget.

The MLP arm is the base model itself: its ``align`` stage is phase 1 (projector only) and its ``instruct``
stage is phase 2 (projector + LLM). The LIA-MTR arm starts from the same lm / vision stages (assembled the
same way, same seeds and data order), swaps in the bridge, and runs the same two budgets. Each arm is
scored after each phase; the LIA-MTR write gate is probed on held-out images (paper: mean 0.5053, std
0.0444).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..fingerprint import digest
from ..inference import Pipeline
from ..models import load_checkpoint
from ..train.bridge import BridgeTrainConfig, train_bridge
from ..world.base import backbone_init
from ..world.tasks import WorldSamples, caption_data
from ..world.texts import DESCRIBE_PROMPT
from .arm import ExperimentContext, evaluate_arm

PAPER = {"mme_lia": 71.00, "mme_mlp": 68.11, "existence_after_align_lia": 91.67, "existence_after_align_mlp": 81.67,
         "scene_lia": 90.40, "scene_mlp": 78.75, "gate_mean": 0.5053, "gate_std": 0.0444}


@dataclass
class BridgeExperiment:
    bridge: str = "lia_mtr"
    options: dict = field(default_factory=dict)  # LiaMtrConfig fields every reading shares, e.g. {"n_scales": 4}
    # the readings of the paper's words to compare (each one LIA-MTR arm): {} is the default (geometric
    # spacing of lambda, a gate per channel); see LiaMtrConfig.lambda_spacing / gate
    readings: tuple[dict, ...] = ({},)

    def to_dict(self) -> dict:
        return {"bridge": self.bridge, "options": dict(self.options), "readings": [dict(r) for r in self.readings]}

    def arm_name(self, reading: dict) -> str:
        if not reading:
            return self.bridge
        return f"{self.bridge}[{','.join(str(v) for _, v in sorted(reading.items()))}]"


@torch.no_grad()
def probe_write_gate(model, processor, samples: WorldSamples, n: int = 64) -> dict:
    """Write-gate statistics of the model's bridge on the visual features of ``n`` images."""
    bridge = model.model.multi_modal_projector
    seen: list[torch.Tensor] = []
    handle = bridge.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        pipe = Pipeline.from_model(model, processor)
        enc = pipe.encode([pipe.chat_prompt(DESCRIBE_PROMPT, 1)] * min(n, len(samples)),
                          [[im] for im in samples.images[:n]])
        model(**enc)
    finally:
        handle.remove()
    return bridge.probe(torch.cat(seen))


def _train_reading(exp: BridgeExperiment, reading: dict, ctx: ExperimentContext, log) -> dict:
    """Both phases of one LIA-MTR reading from the base's backbone, with the MLP's schedules, seeds and data."""
    model_dir, tc, train = ctx.model_dir, ctx.train_config, ctx.scenes()
    options = {**exp.options, **reading}
    spec = [exp.bridge, options, tc.to_dict()]
    key = digest(spec, 12)
    cache = Path(f"{model_dir}-bridge") / f"{exp.bridge}-{key}"
    align, instruct = tc.align, tc.instruct  # the same schedules and seeds as the MLP's stages
    p1 = BridgeTrainConfig(phase=1, steps=align.steps, lr=align.lr, batch_size=align.batch_size, bridge=exp.bridge,
                           bridge_options=options, seed=tc.seed + 2, save_every=tc.save_every)
    p2 = BridgeTrainConfig(phase=2, steps=instruct.steps, lr=instruct.lr, batch_size=instruct.batch_size,
                           lm_lr=tc.instruct_lm_lr, seed=tc.seed + 3, save_every=tc.save_every)
    name = exp.arm_name(reading)
    log(f"{name} phase 1 (alignment, {p1.steps} steps) -> {cache / 'phase1'}")
    s1 = train_bridge(model_dir, caption_data(train, p1.seed), cache / "phase1", p1, progress=False,
                      init=lambda: backbone_init(model_dir, p1.seed))
    log(f"{name} phase 2 (instruction tuning, {p2.steps} steps) -> {cache / 'phase2'}")
    s2 = train_bridge(cache / "phase1", tc.instruct_mix(train, p2.seed),
                      cache / "phase2", p2, progress=False)
    return {"name": name, "dirs": (cache / "phase1", cache / "phase2"), "summaries": (s1, s2)}


def run_bridge_experiment(exp: BridgeExperiment, ctx: ExperimentContext) -> dict:
    """Train (or reuse) both phases of each LIA-MTR reading and score every arm after each phase, beside the MLP
    (the base itself: its align stage is phase 1, its instruct stage phase 2)."""
    model_dir, sets, log = ctx.model_dir, ctx.sets, ctx.log
    trained = [_train_reading(exp, r, ctx, log) for r in exp.readings]
    models = {"mlp_phase1": model_dir / "stages" / "align", "mlp_phase2": model_dir}
    stage_loss = {st: json.loads((model_dir / "stages" / st / "keepsight_stage.json").read_text())["last_loss"]
                  for st in ("align", "instruct")}
    losses = {"mlp_phase1": stage_loss["align"], "mlp_phase2": stage_loss["instruct"]}
    training = {}
    for t in trained:
        for phase, (path, summary) in enumerate(zip(t["dirs"], t["summaries"]), 1):
            arm = f"{t['name']}_phase{phase}"
            models[arm], losses[arm] = path, summary["last_loss"]
            training[arm] = {k: v for k, v in summary.items() if k != "log_history"}
    order = ["mlp_phase1", *[f"{t['name']}_phase1" for t in trained], "mlp_phase2",
             *[f"{t['name']}_phase2" for t in trained]]
    arms, gates = {"mlp_phase2": ctx.base}, {}
    for name in order:
        if name in arms:
            continue
        log(f"evaluating {name}")
        model, processor = load_checkpoint(models[name], dtype=None, device="cpu")
        arms[name] = evaluate_arm(model, processor, sets, log)
        if hasattr(model.model.multi_modal_projector, "probe"):
            gates[name] = probe_write_gate(model, processor, sets.eval)
    return {
        "config": exp.to_dict(),
        "models": {k: str(v) for k, v in models.items()},
        "training": training,
        "arms": {k: arms[k] for k in order},
        "final_train_loss": losses,  # the last logged training loss of each arm's phase
        "write_gate": gates,
        "paper": PAPER,
    }
