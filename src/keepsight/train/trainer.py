"""The shared Trainer set-up of every recipe: the common option fields, ``run_trainer`` (transformers'
``Trainer``, length-grouped batches, resume from the newest complete checkpoint, stop-after), and the
checkpoint helpers."""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model
from torch import nn
from transformers import PreTrainedModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import _is_peft_model

from ..checks import number
from .distributed import batch_layout, length_grouped_sampler, process_rank, set_fsdp_wrap, trainer_placement

SCHEDULES = {"cosine": "cosine", "constant": "constant_with_warmup"}  # ours -> transformers' scheduler names


def warmup_steps(steps: int, ratio: float) -> int:
    """Warm-up steps: ``ratio`` of ``steps`` rounded down, at least one unless ``ratio`` is 0 (5% of 150 steps: 7)."""
    return 0 if ratio == 0 else max(1, math.floor(steps * ratio + 1e-9))


@dataclass(kw_only=True)
class TrainOptions:
    """The option fields every training recipe shares (each recipe's config extends them, with its defaults)."""

    steps: int = 100  # optimizer steps
    lr: float = 1e-3  # peak learning rate
    batch_size: int = 16  # the global batch per optimizer step (split over processes and grad-accum steps)
    seed: int = 0  # model initialisation, data order and the objective's randomness
    save_every: int = 200  # Trainer checkpoint period (steps)
    max_length: int | None = None  # rows cut to this many tokens (never inside the image tokens); None: no cut
    # rows the pre-flight check finds bad (missing / unreadable images, placeholder / image mismatch, no answer) or
    # whose image tokens do not fit max_length are left out (else an error)
    skip_bad_rows: bool = False
    warmup_ratio: float = 0.05  # linear warm-up over this share of the steps (at least one step)
    schedule: str = "cosine"  # the learning-rate schedule after the warm-up: "cosine" (to 0) | "constant"

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "save_every"):
            setattr(self, name, number(name, getattr(self, name), 1, integer=True))
        self.lr = number("lr", self.lr, 0.0, open_low=True)
        number("warmup_ratio", self.warmup_ratio, 0.0, 1.0, open_high=True)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {tuple(SCHEDULES)}, got {self.schedule!r}")
        if self.max_length is not None:
            self.max_length = number("max_length", self.max_length, 1, integer=True)
        if not isinstance(self.skip_bad_rows, bool):
            raise ValueError(f"skip_bad_rows must be true or false, got {self.skip_bad_rows!r}")
        self.seed = number("seed", self.seed, 0, integer=True)


def last_complete_checkpoint(ckpt_dir: Path) -> str | None:
    """Newest ``checkpoint-N`` holding ``trainer_state.json`` (Trainer writes it last, so a checkpoint
    interrupted mid-write is skipped)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return None
    done = [p for p in ckpt_dir.glob("checkpoint-*") if (p / "trainer_state.json").is_file()]
    if not done:
        return None
    return str(max(done, key=lambda p: int(p.name.split("-")[-1])))


class StopAt(TrainerCallback):
    """Saves a checkpoint and stops after global step ``step`` (None: never)."""

    def __init__(self, step: int | None):
        self.step = step

    def on_step_end(self, args, state, control, **kw):
        if self.step is not None and state.global_step >= self.step:
            control.should_save = True
            control.should_training_stop = True
        return control


def stop_at(step: int | None) -> StopAt:
    """A Trainer callback that saves a checkpoint and stops after global step ``step`` (None: never)."""
    return StopAt(step)


WEIGHTS_FILE = "model.safetensors"  # a checkpoint's weights (the Trainer's name for them)
OWN_NAMES = "keepsight_own_names"  # metadata: the file holds the module's own state-dict names


class ExactResume:
    """A Trainer mixin whose checkpoints resume exactly: the weights are saved under the trained module's own
    state-dict names and loaded back strictly.

    transformers 5 saves LLaVA / Qwen-VL models in their legacy key layout (``language_model.model.*``), and the
    Trainer loads a checkpoint's file with ``strict=False``: no key matches, nothing loads, and a resumed run
    would go on from its initial weights with the checkpoint's optimizer state. Models sharded by FSDP or
    DeepSpeed and PEFT adapters keep the Trainer's own paths."""

    def _sharded_or_peft(self, model) -> bool:
        return self.is_fsdp_enabled or self.is_deepspeed_enabled or _is_peft_model(model)

    def _save_checkpoint(self, model, trial) -> None:
        """The Trainer's checkpoint, or none at all: a save that fails (a full disk) removes its half-written
        ``checkpoint-N`` folder instead of leaving one without weights beside the good ones."""
        folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        existed = folder.exists()
        try:
            super()._save_checkpoint(model, trial)
        except BaseException:
            if not existed and self.args.should_save:
                shutil.rmtree(folder, ignore_errors=True)
            raise

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        if state_dict is not None or self._sharded_or_peft(model) or not isinstance(model, PreTrainedModel):
            return super()._save(output_dir, state_dict)  # a plain module's file already holds its own names
        if not self.args.should_save:
            return None
        out = Path(output_dir if output_dir is not None else self.args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(out)
        save_model(model, str(out / WEIGHTS_FILE), metadata={"format": "pt", OWN_NAMES: "1"})
        torch.save(self.args, out / "training_args.bin")
        return None

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        target = self.model if model is None else model
        path = Path(resume_from_checkpoint) / WEIGHTS_FILE
        if self._sharded_or_peft(target) or not path.is_file():
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        try:
            load_model(target, str(path), strict=True)
        except RuntimeError as e:
            with safe_open(str(path), "pt") as f:
                ours = (f.metadata() or {}).get(OWN_NAMES) == "1"
            if isinstance(target, PreTrainedModel) and not ours:
                raise ValueError(f"{resume_from_checkpoint}: a checkpoint written in transformers' saved layout (an "
                                 "earlier keepsight version), which a resume cannot load exactly; delete that "
                                 "folder (or pass --overwrite) to start the run again") from e
            raise ValueError(f"{resume_from_checkpoint}: its weights do not fit the model being trained "
                             f"({str(e)[:300]})") from e
        return None


class LengthAwareTrainer(ExactResume, Trainer):
    """Batches of similar length when the dataset knows its items' lengths (``dataset.lengths``): short QA
    items are not padded to the length of a long description. ``optimizer_fn(model)`` builds the optimizer
    (the Trainer builds the schedule around it)."""

    def __init__(self, *args, global_batch: int, optimizer_fn=None, **kwargs):
        self._global_batch, self._optimizer_fn = global_batch, optimizer_fn
        super().__init__(*args, **kwargs)

    def _get_train_sampler(self, train_dataset=None):
        ds = train_dataset if train_dataset is not None else self.train_dataset
        if getattr(ds, "lengths", None) is not None:
            return length_grouped_sampler(ds.lengths, self._global_batch, self.args.data_seed)
        return super()._get_train_sampler(train_dataset)

    def create_optimizer(self, model=None):
        if self._optimizer_fn is not None and self.optimizer is None:
            self.optimizer = self._optimizer_fn(self.model if model is None else model)
        return super().create_optimizer(model)


def run_trainer(model: nn.Module, dataset, collator, options: TrainOptions, ckpt_dir: Path,
                stop_after: int | None = None, progress: bool = True, optimizer_fn=None,
                grad_accum: int = 1) -> tuple[list[dict], int]:
    """Train with ``transformers.Trainer``, resuming from the newest complete checkpoint in ``ckpt_dir``.

    Runs as it is or under ``accelerate launch`` (DDP, DeepSpeed, FSDP): ``options.batch_size`` is the
    global batch per optimizer step, split over processes and ``grad_accum`` steps (``batch_layout``);
    every process draws the same length-grouped order (``length_grouped_sampler``) and takes its share
    of each global batch. ``stop_after`` ends the run early after that global step (after its checkpoint),
    for tests and for splitting a long stage over several invocations. ``optimizer_fn(model)`` builds the
    optimizer instead of the Trainer's AdamW (e.g. per-group learning rates); it is called by the Trainer
    (FSDP does not accept a ready-made optimizer); the Trainer builds the cosine schedule around it.
    Returns the log history and the global step.
    """
    layout = batch_layout(options.batch_size, grad_accum)
    rank = process_rank()[0]
    if os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3":
        raise ValueError("DeepSpeed ZeRO-3 is not supported (outputs are saved from rank 0's parameters); use "
                         "configs/accelerate/fsdp.yaml to shard parameters, or ZeRO-2")
    set_fsdp_wrap(model)
    steps = options.steps
    args = TrainingArguments(
        output_dir=str(ckpt_dir),
        max_steps=steps,
        per_device_train_batch_size=layout["per_device_batch_size"],
        gradient_accumulation_steps=layout["grad_accum"],
        learning_rate=options.lr,
        lr_scheduler_type=SCHEDULES[options.schedule],
        warmup_steps=warmup_steps(steps, options.warmup_ratio),
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=max(1, min(50, steps // 10)),
        save_strategy="steps",
        save_steps=options.save_every,
        save_total_limit=2,
        report_to=[],
        # the model's own randomness (dropout, a diffusion objective's masks) differs per process, as it
        # would between the samples of one big batch; the data order (data_seed) is the same everywhere
        seed=options.seed + rank,
        data_seed=options.seed,
        **trainer_placement(),
        # frozen parameters (a frozen backbone) are outside DDP's reducer anyway; a trainable parameter
        # may still get no gradient (the vision stage never reads CLIP's post_layernorm), and DDP must then
        # not wait for it
        ddp_find_unused_parameters=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=not progress,
    )
    if args.world_size != layout["world_size"]:
        raise RuntimeError(f"{args.world_size} training processes but the launcher's environment says "
                           f"{layout['world_size']}")
    trainer = LengthAwareTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                                 callbacks=[stop_at(stop_after)], global_batch=layout["global_batch_size"],
                                 optimizer_fn=optimizer_fn)
    trainer.train(resume_from_checkpoint=last_complete_checkpoint(ckpt_dir))
    return [dict(h) for h in trainer.state.log_history], trainer.state.global_step
