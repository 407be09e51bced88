"""PVM stage 1: supervised fine-tuning with the backbone frozen; only ``pvm.*`` parameters train.

Our recipe (the paper gives none for the gate): the gate (initialised to 0, so the model starts as the
base) gets its own optimizer group with a larger learning rate (``gate_lr``) and no weight decay; with
the gate at 0 the projections receive no gradient, so the gate has to move first.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..atomic import write_json
from ..pvm import PVMConfig, attach_pvm, pvm_report, save_pvm
from ..pvm.io import CONFIG_FILE
from ..world.data import VLMCollator, VLMDataset, WorldSamples
from ..world.distributed import batch_layout, main_process_writes, unshard_root
from ..world.evaluate import load_vlm
from ..world.train import StageConfig, run_trainer

SUMMARY_FILE = "pvm_train.json"


@dataclass
class PVMTrainConfig:
    steps: int = 600
    lr: float = 1e-3  # projections
    gate_lr: float = 1e-2  # the gate (our recipe: 10x)
    batch_size: int = 16
    seed: int = 0
    save_every: int = 200

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "gate_lr"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def pvm_optimizer(model, lr: float, gate_lr: float) -> torch.optim.Optimizer:
    """AdamW over the PVM parameters: projections at ``lr``, gates at ``gate_lr`` without weight decay."""
    gates = [p for n, p in model.named_parameters() if n.startswith("pvm.") and n.endswith(".gate")]
    rest = [p for n, p in model.named_parameters() if n.startswith("pvm.") and not n.endswith(".gate")]
    return torch.optim.AdamW([{"params": rest, "lr": lr}, {"params": gates, "lr": gate_lr, "weight_decay": 0.0}],
                             lr=lr)


def train_pvm_sft(model_dir: str | os.PathLike, samples: WorldSamples, out: str | os.PathLike,
                  pvm_config: PVMConfig | None = None, cfg: PVMTrainConfig | None = None,
                  stop_after: int | None = None, progress: bool = True, grad_accum: int = 1) -> dict | None:
    """Attach PVM to the base in ``model_dir``, train it on ``samples``, write the adapter to ``out``.

    Resumable (Trainer checkpoints under ``out/checkpoints``); returns the summary (gate values and
    relative norms before / after), or None when ``stop_after`` ended the run early. ``cfg.batch_size``
    is the global batch, split over the processes of ``accelerate launch`` and ``grad_accum`` steps;
    only the main process writes.
    """
    out = Path(out)
    if (out / SUMMARY_FILE).is_file() and (out / CONFIG_FILE).is_file():
        return json.loads((out / SUMMARY_FILE).read_text())
    cfg = cfg or PVMTrainConfig()
    model, processor = load_vlm(model_dir)
    torch.manual_seed(cfg.seed)
    attach_pvm(model, pvm_config or PVMConfig())
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("pvm.")
    data = VLMDataset(samples, VLMDataset.TASKS, cfg.seed, describe_repeats=3)
    collate = VLMCollator(processor)
    probe_batch = [collate([data[i] for i in range(min(8, len(data)))])]
    model.eval()
    before = pvm_report(model, probe_batch)
    model.train()
    logs, step = run_trainer(model, data, collate, StageConfig(cfg.steps, cfg.lr, cfg.batch_size),
                             out / "checkpoints", cfg.seed, cfg.save_every, stop_after, progress,
                             optimizer_fn=lambda m: pvm_optimizer(m, cfg.lr, cfg.gate_lr), grad_accum=grad_accum)
    if step < cfg.steps:
        return None
    model.eval()
    losses = [h["loss"] for h in logs if "loss" in h]
    summary = {"base": str(model_dir), "pvm": (pvm_config or PVMConfig()).to_dict(), "train": asdict(cfg),
               "batch_layout": batch_layout(cfg.batch_size, grad_accum),
               "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
               "before": before, "after": pvm_report(model, probe_batch), "log_history": logs}

    publish_adapter(model, out, SUMMARY_FILE, summary)
    return summary


def publish_adapter(model, out: Path, summary_file: str, summary: dict) -> None:
    """Write the trained PVM adapter and its summary to ``out`` (rank 0 only, atomically) and drop the
    Trainer checkpoints. On every process: FSDP2 keeps the PVM branches in the root group, gathered
    whole here first (a no-op otherwise)."""
    unshard_root(model)

    def write() -> None:
        save_pvm(model, out)
        write_json(out / summary_file, summary)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)

    main_process_writes(write)
