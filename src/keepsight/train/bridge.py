"""Bridge training in the paper's two phases (transformers' Trainer; runs under ``accelerate launch``):

- phase 1, feature alignment: a fresh bridge replaces the projector; only the bridge trains (the paper:
  caption data);
- phase 2, instruction tuning: bridge + language model train (vision tower frozen).

Phase 1 starts from a LLaVA-family model: a checkpoint directory (its projector is replaced), or a model
given by the caller (the world assembles its backbone from its base's lm / vision stages, so MLP and bridge
share the initialisation). Each phase writes model + processor atomically to ``out`` (plus
``bridge_train.json``) and resumes from Trainer checkpoints under ``out/checkpoints``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..bridge.swap import replace_projector
from ..data import VLMCollator
from ..fingerprint import data_fingerprint, dir_fingerprint
from ..models import load_checkpoint
from .recipe import Recipe, run_recipe
from .trainer import TrainOptions

SUMMARY_FILE = "bridge_train.json"
PHASE_TRAINABLE = {1: ("multi_modal_projector",), 2: ("multi_modal_projector", "language_model", "lm_head")}


@dataclass(kw_only=True)
class BridgeTrainConfig(TrainOptions):
    phase: int  # 1 = alignment (bridge only), 2 = instruction tuning (bridge + LLM)
    steps: int = 200
    lr: float = 2e-3
    batch_size: int = 16
    bridge: str = "lia_mtr"  # phase 1: the bridge kind (see keepsight.bridge.build_bridge)
    bridge_options: dict = field(default_factory=dict)  # e.g. {"n_scales": 4}
    lm_lr: float | None = None  # phase 2: the language model's peak lr (None: lr); the bridge trains at lr
    seed: int = 2  # the world base's align-stage seed: same projector-init RNG stream and data order

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.phase not in (1, 2):
            raise ValueError(f"phase must be 1 or 2, got {self.phase}")

    @classmethod
    def for_phase(cls, phase: int, **overrides) -> BridgeTrainConfig:
        """The phase's defaults (phase 2: 4,000 steps, the world base's instruct budget) with ``overrides``."""
        return cls(phase=phase, **{**PHASE_DEFAULTS.get(phase, {}), **overrides})


PHASE_DEFAULTS = {2: {"steps": 4000}}  # what differs from the dataclass defaults in phase 2


class BridgeRecipe(Recipe):
    """Phase 1: ``init()`` (or the checkpoint in ``model_dir``) with a fresh bridge; phase 2: a phase-1 output."""

    summary_file = SUMMARY_FILE
    marker_file = "config.json"
    kind = "bridged-model"

    def __init__(self, model_dir, dataset, options: BridgeTrainConfig, init: Callable | None = None):
        super().__init__(options)
        self.model_dir, self.data, self.init = Path(model_dir), dataset, init

    def request(self) -> dict:
        return {"from": dir_fingerprint(self.model_dir), "init": "given" if self.init is not None else "checkpoint",
                "data": data_fingerprint(self.data)}

    def load(self):
        cfg = self.options
        if cfg.phase == 1:
            model, processor = self.init() if self.init is not None else load_checkpoint(
                self.model_dir, dtype=None, device="cpu", expect="autoregressive")
            torch.manual_seed(cfg.seed)
            return replace_projector(model, cfg.bridge, **cfg.bridge_options), processor
        model, processor = load_checkpoint(self.model_dir, dtype=None, device="cpu", expect="autoregressive")
        if getattr(model.config, "bridge", None) is None:
            raise ValueError(f"{self.model_dir} has no bridge (model_type {model.config.model_type!r}); phase 2 starts "
                             "from a phase-1 output")
        return model, processor

    def trainable(self, name: str) -> bool:
        return any(t in name for t in PHASE_TRAINABLE[self.options.phase])

    def optimizer_fn(self):
        lm_lr, lr = self.options.lm_lr, self.options.lr
        if self.options.phase == 1 or lm_lr is None:
            return None

        def build(model):
            bridge = [p for n, p in model.named_parameters() if p.requires_grad and "multi_modal_projector" in n]
            rest = [p for n, p in model.named_parameters() if p.requires_grad and "multi_modal_projector" not in n]
            return torch.optim.AdamW([{"params": bridge, "lr": lr}, {"params": rest, "lr": lm_lr}], lr=lr,
                                     weight_decay=0.0)

        return build

    def dataset(self, processor):
        return self.data

    def collator(self, processor):
        return VLMCollator(processor, self.options.max_length, self.options.skip_bad_rows)

    def summarise(self, model, processor, logs):
        return {"from": str(self.model_dir), "bridge": model.config.bridge,
                "bridge_parameters": sum(p.numel() for p in model.model.multi_modal_projector.parameters())}


def train_bridge(model_dir: str | os.PathLike, dataset, out: str | os.PathLike, cfg: BridgeTrainConfig,
                 stop_after: int | None = None, progress: bool = True, grad_accum: int = 1,
                 init: Callable | None = None, overwrite: bool = False) -> dict | None:
    """Run one phase on ``dataset`` (``Sample``s); returns its summary (or None when ``stop_after`` ended it
    early; run again to resume). ``init() -> (model, processor)`` gives phase 1's starting model instead of
    loading ``model_dir``. ``cfg.batch_size`` is the global batch (see ``run_trainer``); only the main
    process writes."""
    return run_recipe(BridgeRecipe(model_dir, dataset, cfg, init), out, stop_after, progress, grad_accum, overwrite)
