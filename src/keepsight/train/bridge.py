"""Bridge training in the paper's two phases (transformers' Trainer; runs under ``accelerate launch``):

- phase 1, feature alignment: a fresh bridge replaces the projector; only the bridge trains, on
  descriptions and captions;
- phase 2, instruction tuning: bridge + language model train (vision tower frozen) on descriptions,
  captions, QA and grounding questions.

Phase 1 starts from either a LLaVA-family model directory (any checkpoint; its projector is replaced) or a
world base directory holding finished ``stages/lm`` and ``stages/vision``: then the backbone is assembled
from those stages exactly as the base's own MLP projector saw it, so MLP and bridge share the
initialisation. Each phase writes model + processor atomically to ``out`` (plus ``bridge_train.json``) and
resumes from Trainer checkpoints under ``out/checkpoints``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..atomic import write_json
from ..world.data import VLMCollator, VLMDataset, WorldSamples
from ..world.distributed import batch_layout, gather_state_dict, main_process_writes
from ..world.train import StageConfig, atomic_save_dir, run_trainer

SUMMARY_FILE = "bridge_train.json"
PHASE_TRAINABLE = {1: ("multi_modal_projector",), 2: ("multi_modal_projector", "language_model", "lm_head")}


@dataclass
class BridgeTrainConfig:
    phase: int  # 1 = alignment (bridge only), 2 = instruction tuning (bridge + LLM)
    stage: StageConfig = field(default_factory=lambda: StageConfig(200, 2e-3, 16))
    bridge: str = "lia_mtr"  # phase 1: the bridge kind (see keepsight.bridge.build_bridge)
    bridge_options: dict = field(default_factory=dict)  # e.g. {"n_scales": 4}
    seed: int = 2  # the world base's align-stage seed: same projector-init RNG stream and data order
    save_every: int = 200

    def __post_init__(self) -> None:
        if self.phase not in (1, 2):
            raise ValueError(f"phase must be 1 or 2, got {self.phase}")
        if isinstance(self.stage, dict):
            self.stage = StageConfig(**self.stage)
        if self.stage.steps < 1 or self.stage.lr <= 0 or self.stage.batch_size < 1:
            raise ValueError(f"stage: steps, lr and batch_size must be positive, got {self.stage}")
        if self.save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {self.save_every}")


def _phase1_model(model_dir: Path, cfg: BridgeTrainConfig):
    from ..bridge.swap import replace_projector
    from ..world.evaluate import load_vlm

    if (model_dir / "stages" / "lm").is_dir() and (model_dir / "stages" / "vision").is_dir():
        from ..world.models import get_preset, preset_processor
        from ..world.train import TrainConfig, assemble_from_stages

        tc = TrainConfig(**json.loads((model_dir / "train_config.json").read_text()))
        preset = get_preset(tc.preset)
        processor = preset_processor(preset)
        model = assemble_from_stages(model_dir, preset, processor.tokenizer, cfg.seed)
    else:
        model, processor = load_vlm(model_dir)
    torch.manual_seed(cfg.seed)
    return replace_projector(model, cfg.bridge, **cfg.bridge_options), processor


def train_bridge(model_dir: str | os.PathLike, samples: WorldSamples, out: str | os.PathLike,
                 cfg: BridgeTrainConfig, stop_after: int | None = None, progress: bool = True,
                 grad_accum: int = 1) -> dict | None:
    """Run one phase; returns its summary (or None when ``stop_after`` ended it early; run again to resume).
    ``cfg.stage.batch_size`` is the global batch (see ``run_trainer``); only the main process writes."""
    from ..world.evaluate import load_vlm

    out, model_dir = Path(out), Path(model_dir)
    if (out / SUMMARY_FILE).is_file() and (out / "config.json").is_file():
        return json.loads((out / SUMMARY_FILE).read_text())
    if cfg.phase == 1:
        model, processor = _phase1_model(model_dir, cfg)
        data = VLMDataset(samples, ("describe", "caption"), cfg.seed)
    else:
        model, processor = load_vlm(model_dir)
        if getattr(model.config, "bridge", None) is None:
            raise ValueError(f"{model_dir} has no bridge (model_type {model.config.model_type!r}); phase 2 starts "
                             "from a phase-1 output")
        data = VLMDataset(samples, VLMDataset.TASKS, cfg.seed, describe_repeats=3)
    for name, p in model.named_parameters():
        p.requires_grad = any(t in name for t in PHASE_TRAINABLE[cfg.phase])
    model.train()
    logs, step = run_trainer(model, data, VLMCollator(processor), cfg.stage, out / "checkpoints", cfg.seed,
                             cfg.save_every, stop_after, progress, grad_accum=grad_accum)
    if step < cfg.stage.steps:
        return None
    losses = [h["loss"] for h in logs if "loss" in h]
    summary = {"from": str(model_dir), "train": asdict(cfg), "bridge": model.config.bridge,
               "batch_layout": batch_layout(cfg.stage.batch_size, grad_accum),
               "bridge_parameters": sum(p.numel() for p in model.model.multi_modal_projector.parameters()),
               "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
               "log_history": logs}

    sd = gather_state_dict(model)  # None unless FSDP-sharded

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=sd)
        processor.save_pretrained(tmp)
        write_json(tmp / SUMMARY_FILE, summary)

    main_process_writes(atomic_save_dir, out, write)  # replaces ``out`` and its checkpoints in one rename
    return summary
