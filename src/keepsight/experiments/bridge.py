"""The LIA-MTR world experiment (issue 5): MLP vs LIA-MTR projector from the same backbone, same budget.

The MLP arm is the base model itself: its ``align`` stage is phase 1 (projector only) and its ``instruct``
stage is phase 2 (projector + LLM). The LIA-MTR arm starts from the same lm / vision stages (assembled the
same way, same seeds and data order), swaps in the bridge, and runs the same two budgets. Each arm is
scored after each phase; the LIA-MTR write gate is probed on held-out images (paper: mean 0.5053, std
0.0444).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..data import chat_example
from ..models import load_checkpoint
from ..train.bridge import BridgeTrainConfig, train_bridge
from ..world.base import backbone_init
from ..world.tasks import WorldSamples, caption_data, instruct_data
from ..world.texts import DESCRIBE_PROMPT
from .arm import ExperimentContext, evaluate_arm

PAPER = {"mme_lia": 71.00, "mme_mlp": 68.11, "existence_after_align_lia": 91.67, "existence_after_align_mlp": 81.67,
         "scene_lia": 90.40, "scene_mlp": 78.75, "gate_mean": 0.5053, "gate_std": 0.0444}


@dataclass
class BridgeExperiment:
    bridge: str = "lia_mtr"
    options: dict = field(default_factory=dict)  # LiaMtrConfig fields, e.g. {"n_scales": 4}

    def to_dict(self) -> dict:
        return {"bridge": self.bridge, "options": dict(self.options)}


@torch.no_grad()
def probe_write_gate(model, processor, samples: WorldSamples, n: int = 64) -> dict:
    """Write-gate statistics of the model's bridge on the visual features of ``n`` images."""
    bridge = model.model.multi_modal_projector
    seen: list[torch.Tensor] = []
    handle = bridge.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        enc = processor(text=[chat_example(processor, DESCRIBE_PROMPT)] * min(n, len(samples)),
                        images=samples.images[:n], return_tensors="pt")
        model(**enc)
    finally:
        handle.remove()
    return bridge.probe(torch.cat(seen))


def run_bridge_experiment(exp: BridgeExperiment, ctx: ExperimentContext) -> dict:
    """Train (or reuse) both phases of the bridge arm and score every arm after each phase."""
    model_dir, train_cfg, train, sets, log = ctx.model_dir, ctx.train_config, ctx.scenes(), ctx.sets, ctx.log
    key = hashlib.sha256(json.dumps([exp.to_dict(), train_cfg.to_dict()], sort_keys=True).encode()).hexdigest()[:12]
    cache = Path(f"{model_dir}-bridge") / f"{exp.bridge}-{key}"
    align, instruct = train_cfg.align, train_cfg.instruct  # the same schedules and seeds as the MLP's stages
    p1 = BridgeTrainConfig(phase=1, steps=align.steps, lr=align.lr, batch_size=align.batch_size, bridge=exp.bridge,
                           bridge_options=exp.options, seed=train_cfg.seed + 2, save_every=train_cfg.save_every)
    p2 = BridgeTrainConfig(phase=2, steps=instruct.steps, lr=instruct.lr, batch_size=instruct.batch_size,
                           seed=train_cfg.seed + 3, save_every=train_cfg.save_every)
    log(f"{exp.bridge} phase 1 (alignment, {p1.steps} steps) -> {cache / 'phase1'}")
    s1 = train_bridge(model_dir, caption_data(train, p1.seed), cache / "phase1", p1, progress=False,
                      init=lambda: backbone_init(model_dir, p1.seed))
    log(f"{exp.bridge} phase 2 (instruction tuning, {p2.steps} steps) -> {cache / 'phase2'}")
    s2 = train_bridge(cache / "phase1", instruct_data(train, p2.seed), cache / "phase2", p2, progress=False)

    arms, gates = {}, {}
    for name, path in (("mlp_phase1", model_dir / "stages" / "align"), (f"{exp.bridge}_phase1", cache / "phase1"),
                       (f"{exp.bridge}_phase2", cache / "phase2")):
        log(f"evaluating {name}")
        model, processor = load_checkpoint(path, dtype=None, device="cpu")
        arms[name] = evaluate_arm(model, processor, sets, log)
        if hasattr(model.model.multi_modal_projector, "probe"):
            gates[name] = probe_write_gate(model, processor, sets.eval)
    arms["mlp_phase2"] = ctx.base
    stage_loss = {st: json.loads((model_dir / "stages" / st / "keepsight_stage.json").read_text())["last_loss"]
                  for st in ("align", "instruct")}
    losses = {"mlp_phase1": stage_loss["align"], f"{exp.bridge}_phase1": s1["last_loss"],
              "mlp_phase2": stage_loss["instruct"], f"{exp.bridge}_phase2": s2["last_loss"]}
    order = ["mlp_phase1", f"{exp.bridge}_phase1", "mlp_phase2", f"{exp.bridge}_phase2"]
    strip = lambda s: {k: v for k, v in s.items() if k != "log_history"}  # noqa: E731
    return {
        "config": exp.to_dict(),
        "models": {"mlp_phase1": str(model_dir / "stages" / "align"), "mlp_phase2": str(model_dir),
                   f"{exp.bridge}_phase1": str(cache / "phase1"), f"{exp.bridge}_phase2": str(cache / "phase2")},
        "training": {"phase1": strip(s1), "phase2": strip(s2)},
        "arms": {k: arms[k] for k in order},
        "final_train_loss": losses,  # the last logged training loss of each arm's phase
        "write_gate": gates,
        "paper": PAPER,
    }
