"""PVM stage 1: supervised fine-tuning with the backbone frozen; only ``pvm.*`` parameters train.

Our recipe (the paper gives none for the gate): the gate (initialised to 0, so the model starts as the
base) gets its own optimizer group with a larger learning rate (``gate_lr``) and no weight decay; with
the gate at 0 the projections receive no gradient, so the gate has to move first. ``PVMTrainConfig.released()``
holds the authors' settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..atomic import atomic_save_dir, write_json
from ..checks import number
from ..data import VLMCollator
from ..fingerprint import data_fingerprint, dir_fingerprint
from ..models import load_checkpoint
from ..models.withhold import withhold_image
from ..pvm import PVMConfig, attach_pvm, gate_report, save_pvm
from ..pvm.attach import PREFIX
from ..pvm.io import ADAPTER_KIND, CONFIG_FILE
from .distributed import main_process_writes, unshard_root
from .recipe import Recipe, run_recipe
from .trainer import TrainOptions

SUMMARY_FILE = "pvm_train.json"


@dataclass(kw_only=True)
class PVMTrainConfig(TrainOptions):
    steps: int = 600
    lr: float = 1e-3  # projections
    gate_lr: float = 1e-2  # the gate (our recipe: 10x)
    batch_size: int = 16
    # the mechanism control: the image's tokens masked out of the language model's attention while training
    # (keepsight.models.withhold), so that the image reaches the model only through PVM's memory
    withhold_image: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.gate_lr = number("gate_lr", self.gate_lr, 0.0, open_low=True)
        if not isinstance(self.withhold_image, bool):
            raise ValueError(f"withhold_image must be true or false, got {self.withhold_image!r}")

    @classmethod
    def released(cls, **overrides) -> PVMTrainConfig:
        """The released stage-1 settings (PVM's training_file/SFT.py and README): AdamW at lr 1e-4 for every PVM
        parameter (the gate included), cosine with a 10% warm-up, global batch 64, completion-only loss (what
        keepsight's collator always does), one epoch: ``steps`` = rows / 64."""
        return cls(**{**dict(lr=1e-4, gate_lr=1e-4, warmup_ratio=0.1, schedule="cosine", batch_size=64), **overrides})


def is_gate(name: str) -> bool:
    """A PVM gate: the branch's ``gate`` (lambda) or the released block's ``gate_alpha``."""
    return name.startswith(PREFIX) and name.endswith((".gate", ".gate_alpha"))


def pvm_optimizer(model, lr: float, gate_lr: float) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters: the PVM gates at ``gate_lr`` without weight decay, everything else (the
    PVM projections; the language model where it trains too) at ``lr``."""
    gates = [p for n, p in model.named_parameters() if is_gate(n) and p.requires_grad]
    rest = [p for n, p in model.named_parameters() if not is_gate(n) and p.requires_grad]
    return torch.optim.AdamW([{"params": rest, "lr": lr}, {"params": gates, "lr": gate_lr, "weight_decay": 0.0}],
                             lr=lr)


def report_batches(processor, items: list, max_length: int | None = None, skip_bad_rows: bool = False) -> list[dict]:
    """The collated batch (the first eight items) on which the PVM report is measured before / after."""
    return [VLMCollator(processor, max_length, skip_bad_rows)(items[:8])]


def publish_adapter(model, out: Path, summary_file: str, summary: dict) -> None:
    """Write the trained PVM adapter and its summary to ``out`` (rank 0 only, atomically) and drop the
    Trainer checkpoints. On every process: FSDP2 keeps the PVM branches in the root group, gathered
    whole here first (a no-op otherwise)."""
    unshard_root(model)

    def write(tmp: Path) -> None:
        save_pvm(model, tmp)
        write_json(tmp / summary_file, summary)

    # the new directory replaces ``out`` whole: the Trainer checkpoints and the run's request (recorded in the
    # summary now) go with the old one
    main_process_writes(atomic_save_dir, out, write, ADAPTER_KIND)


class PVMSFTRecipe(Recipe):
    """Base model + a new PVM adapter; only ``pvm.*`` trains on ``dataset`` (``Sample``s)."""

    summary_file = SUMMARY_FILE
    marker_file = CONFIG_FILE
    kind = ADAPTER_KIND

    def __init__(self, model_dir, dataset, pvm_config: PVMConfig | None, options: PVMTrainConfig):
        super().__init__(options)
        self.model_dir, self.data, self.pvm_config = Path(model_dir), dataset, pvm_config or PVMConfig()

    def request(self) -> dict:
        return {"base": dir_fingerprint(self.model_dir), "pvm": self.pvm_config.to_dict(),
                "data": data_fingerprint(self.data)}

    def load(self):
        model, processor = load_checkpoint(self.model_dir, dtype=None, device="cpu", expect="autoregressive")
        torch.manual_seed(self.options.seed)
        attach_pvm(model, self.pvm_config)
        if self.options.withhold_image:
            withhold_image(model)
        return model, processor

    def trainable(self, name: str) -> bool:
        return name.startswith(PREFIX)

    def dataset(self, processor):
        return self.data

    def collator(self, processor):
        return VLMCollator(processor, self.options.max_length, self.options.skip_bad_rows)

    def optimizer_fn(self):
        return lambda m: pvm_optimizer(m, self.options.lr, self.options.gate_lr)

    def _report_batches(self, processor):
        return report_batches(processor, [self.data[i] for i in range(min(8, len(self.data)))],
                              self.options.max_length, self.options.skip_bad_rows)

    def before(self, model, processor) -> dict:
        model.eval()
        return gate_report(model, self._report_batches(processor))

    def summarise(self, model, processor, logs):
        return {"base": str(self.model_dir), "pvm": self.pvm_config.to_dict(),
                "after": gate_report(model, self._report_batches(processor))}

    def publish(self, model, processor, out, summary):
        publish_adapter(model, out, self.summary_file, summary)


def train_pvm_sft(model_dir: str | os.PathLike, dataset, out: str | os.PathLike,
                  pvm_config: PVMConfig | None = None, cfg: PVMTrainConfig | None = None,
                  stop_after: int | None = None, progress: bool = True, grad_accum: int = 1,
                  overwrite: bool = False) -> dict | None:
    """Attach PVM to the base in ``model_dir``, train it on ``dataset`` (``Sample``s), write the adapter to ``out``.

    Resumable (Trainer checkpoints under ``out/checkpoints``); returns the summary (gate values and
    relative norms before / after), or None when ``stop_after`` ended the run early. ``cfg.batch_size``
    is the global batch, split over the processes of ``accelerate launch`` and ``grad_accum`` steps;
    only the main process writes. An existing ``out`` made from another request is refused unless ``overwrite``.
    """
    recipe = PVMSFTRecipe(model_dir, dataset, pvm_config, cfg or PVMTrainConfig())
    return run_recipe(recipe, out, stop_after, progress, grad_accum, overwrite)
