"""Full fine-tuning: the upper reference for an adapter (every parameter but the vision tower trains, on the
same data and budget). If full fine-tuning cannot gain on a task, the task is saturated; if it gains and an
adapter does not, the adapter is not working. Model + processor land in ``out`` (atomically)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..data import VLMCollator
from ..fingerprint import data_fingerprint, dir_fingerprint
from ..models import arch_spec, load_checkpoint
from ..models.arch import is_tower_parameter
from .recipe import Recipe, run_recipe
from .trainer import TrainOptions

SUMMARY_FILE = "finetune.json"


@dataclass(kw_only=True)
class FinetuneConfig(TrainOptions):
    steps: int = 600
    lr: float = 5e-4
    batch_size: int = 16


class FinetuneRecipe(Recipe):
    summary_file = SUMMARY_FILE
    marker_file = "config.json"
    kind = "finetuned-model"

    def __init__(self, model_dir, dataset, options: FinetuneConfig):
        super().__init__(options)
        self.model_dir, self.data = Path(model_dir), dataset

    def request(self) -> dict:
        return {"base": dir_fingerprint(self.model_dir), "data": data_fingerprint(self.data)}

    def load(self):
        model, processor = load_checkpoint(self.model_dir, dtype=None, device="cpu", expect="autoregressive")
        self.spec = arch_spec(model)
        return model, processor

    def trainable(self, name: str) -> bool:
        return not is_tower_parameter(self.spec, name)

    def dataset(self, processor):
        return self.data

    def collator(self, processor):
        return VLMCollator(processor, self.options.max_length, self.options.skip_bad_rows)

    def summarise(self, model, processor, logs):
        return {"base": str(self.model_dir),
                "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}


def train_finetune(model_dir: str | os.PathLike, dataset, out: str | os.PathLike, cfg: FinetuneConfig | None = None,
                   stop_after: int | None = None, progress: bool = True, grad_accum: int = 1,
                   overwrite: bool = False) -> dict | None:
    """Fine-tune every parameter of the model in ``model_dir`` but its vision tower on ``dataset`` (``Sample``s)."""
    recipe = FinetuneRecipe(model_dir, dataset, cfg or FinetuneConfig())
    return run_recipe(recipe, out, stop_after, progress, grad_accum, overwrite)
