"""PVM stage 2: GRPO (TRL's GRPOTrainer) on the stage-1 model, backbone frozen, verifiable world rewards.

The policy is the base model with the stage-1 adapter attached; only ``pvm.*`` trains (the gate in its own
optimizer group, as in stage 1). With ``beta > 0`` the KL reference is the base model *carrying the
stage-1 PVM*, frozen: TRL would otherwise rebuild the reference from the base checkpoint's path, without
the adapter, and the KL term would pull the policy back to the base rather than to stage 1.

Prompts mix the long description (reward: object F1 against the scene graph) with short questions
(reward: exact answer), plus a small format reward (``keepsight.world.rewards``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..pvm import load_pvm, pvm_report
from ..pvm.io import CONFIG_FILE
from ..world.data import VLMCollator, VLMDataset, WorldSamples, user_message
from ..world.distributed import batch_layout, trainer_placement
from ..world.evaluate import description_budget, load_vlm
from ..world.rewards import answer_reward, format_reward
from ..world.texts import DESCRIBE_PROMPT, cell_questions, description, open_questions, yes_no_questions
from ..world.train import last_complete_checkpoint, stop_at
from .pvm_sft import publish_adapter, pvm_optimizer

SUMMARY_FILE = "pvm_grpo.json"
GRPO_TASKS = ("describe", "open", "yes_no", "cell")


@dataclass
class GRPOTrainConfig:
    steps: int = 100
    lr: float = 2e-4  # projections
    gate_lr: float = 2e-3  # the gate (10x, as in stage 1)
    beta: float = 0.04  # KL to the stage-1 reference (DeepSeekMath's GRPO value); 0 = no reference model
    num_generations: int = 4  # completions per prompt (the group)
    prompts_per_step: int = 4  # the batch is prompts_per_step * num_generations completions
    max_completion_length: int | None = None  # default: the world's description budget
    temperature: float = 1.0
    tasks: list[str] = field(default_factory=lambda: ["describe", "open"])
    format_weight: float = 0.2  # weight of the format reward (the answer reward has weight 1)
    seed: int = 0
    save_every: int = 50

    def __post_init__(self) -> None:
        for name in ("steps", "num_generations", "prompts_per_step", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_generations < 2:
            raise ValueError("num_generations must be >= 2 (GRPO normalises rewards within a group)")
        for name in ("lr", "gate_lr", "temperature"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        bad = [t for t in self.tasks if t not in GRPO_TASKS]
        if bad or not self.tasks:
            raise ValueError(f"tasks: unknown {bad}; choose from {GRPO_TASKS}" if bad else "tasks: empty")


def grpo_dataset(samples: WorldSamples, tasks: list[str], seed: int = 0):
    """One prompt per scene and task, shuffled: columns ``prompt`` (conversational, with an image part),
    ``image``, ``kind``, ``answer`` and ``scene`` (the scene graph as JSON, for the rewards)."""
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    for scene, img in zip(samples.scenes, samples.images):
        for task in tasks:
            if task == "describe":
                q = {"question": DESCRIBE_PROMPT, "kind": "describe", "answer": description(scene)}
            elif task == "open":
                q = dict(open_questions(scene)[int(rng.integers(4))])
            elif task == "yes_no":
                qs = yes_no_questions(scene, samples.config)
                q = {**qs[int(rng.integers(len(qs)))], "kind": "yes_no"}
            else:
                q = dict(cell_questions(scene, samples.config)[int(rng.integers(4))])
            rows.append({"prompt": user_message(q["question"]), "image": img, "kind": q["kind"],
                         "answer": q["answer"], "scene": scene.to_json()})
    order = rng.permutation(len(rows))
    return Dataset.from_list([rows[i] for i in order])


def _trainer_class():
    from trl import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    class PVMGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose KL reference is a given model (the base + stage-1 PVM) instead of one
        rebuilt from the policy's checkpoint path, and whose optimizer comes from ``optimizer_fn(model)``
        (built by the Trainer: FSDP does not accept a ready-made optimizer)."""

        def __init__(self, *args, ref_model=None, optimizer_fn=None, **kwargs):
            self._optimizer_fn = optimizer_fn
            super().__init__(*args, **kwargs)
            if self.beta == 0.0 or ref_model is None:
                return
            if self.args.cast_lm_head_to_fp32:
                raise ValueError("cast_lm_head_to_fp32 is not supported with a PVM reference model")
            ref_model.requires_grad_(False)
            ref_model.eval()
            if self.args.disable_dropout:
                disable_dropout_in_model(ref_model)
            add_fused_lm_head(ref_model, temperature=self.temperature)
            if self.is_deepspeed_enabled:
                from trl.models.utils import prepare_deepspeed

                self.ref_model = prepare_deepspeed(ref_model, self.accelerator)
            else:
                self.ref_model = self.accelerator.prepare_model(ref_model, evaluation_mode=True)

        def create_optimizer(self, model=None):
            if self._optimizer_fn is not None and self.optimizer is None:
                self.optimizer = self._optimizer_fn(self.model if model is None else model)
            return super().create_optimizer(model)

    return PVMGRPOTrainer


def _reward_history(logs: list[dict]) -> list[dict]:
    keys = ("step", "reward", "reward_std", "rewards/answer_reward/mean", "rewards/format_reward/mean", "kl",
            "completions/mean_length")
    return [{k: h[k] for k in keys if k in h} for h in logs if "reward" in h]


def build_grpo_trainer(model_dir: str | os.PathLike, init_pvm: str | os.PathLike, samples: WorldSamples,
                       out: str | os.PathLike, cfg: GRPOTrainConfig, stop_after: int | None = None,
                       progress: bool = True, grad_accum: int = 1):
    """The GRPO trainer for stage 2: policy = base + ``init_pvm`` with only ``pvm.*`` trainable; reference
    (when ``cfg.beta > 0``) = base + ``init_pvm``, frozen. The ``prompts_per_step * num_generations``
    completions of a step are the global batch, split over the processes and ``grad_accum`` steps (TRL
    generates once per ``grad_accum`` steps and normalises rewards per group across processes)."""
    from trl import GRPOConfig

    layout = batch_layout(cfg.prompts_per_step * cfg.num_generations, grad_accum)
    out = Path(out)
    model, processor = load_vlm(model_dir)
    from transformers import ProcessorMixin

    if not isinstance(processor, ProcessorMixin):  # keepsight's image-only Qwen processor (no torchvision)
        raise ValueError(f"GRPO (TRL) needs the checkpoint's own processor class; {model_dir} loaded an image-only "
                         f"{type(processor).__name__} because torchvision is missing - install torchvision (with "
                         "a matching torch) to run stage 2 on Qwen-VL")
    load_pvm(model, init_pvm)
    for name, p in model.named_parameters():
        p.requires_grad = name.startswith("pvm.")
    ref_model = None
    if cfg.beta > 0:
        ref_model, _ = load_vlm(model_dir)
        load_pvm(ref_model, init_pvm)
    args = GRPOConfig(
        output_dir=str(out / "checkpoints"),
        max_steps=cfg.steps,
        per_device_train_batch_size=layout["per_device_batch_size"],
        gradient_accumulation_steps=layout["grad_accum"],
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_completion_length or description_budget(samples.config.max_objects),
        temperature=cfg.temperature,
        beta=cfg.beta,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=max(1, cfg.steps // 20),
        reward_weights=[1.0, cfg.format_weight],
        logging_steps=max(1, min(10, cfg.steps // 10)),
        save_strategy="steps",
        save_steps=cfg.save_every,
        save_total_limit=2,
        report_to=[],
        seed=cfg.seed,
        data_seed=cfg.seed,
        **trainer_placement(),
        gradient_checkpointing=False,
        disable_tqdm=not progress,
    )
    return _trainer_class()(
        model=model, reward_funcs=[answer_reward, format_reward], args=args,
        train_dataset=grpo_dataset(samples, cfg.tasks, cfg.seed), processing_class=processor,
        optimizer_fn=lambda m: pvm_optimizer(m, cfg.lr, cfg.gate_lr), callbacks=[stop_at(stop_after)],
        ref_model=ref_model,
    )


def train_pvm_grpo(model_dir: str | os.PathLike, init_pvm: str | os.PathLike, samples: WorldSamples,
                   out: str | os.PathLike, cfg: GRPOTrainConfig | None = None, stop_after: int | None = None,
                   progress: bool = True, grad_accum: int = 1) -> dict | None:
    """GRPO the stage-1 adapter ``init_pvm`` on top of the base in ``model_dir``; adapter -> ``out``
    (written by the main process only under ``accelerate launch``).

    Resumable (Trainer checkpoints under ``out/checkpoints``); returns the summary (rewards over training,
    gate values and relative norms before / after), or None when ``stop_after`` ended the run early.
    """
    out = Path(out)
    if (out / SUMMARY_FILE).is_file() and (out / CONFIG_FILE).is_file():
        return json.loads((out / SUMMARY_FILE).read_text())
    cfg = cfg or GRPOTrainConfig()
    trainer = build_grpo_trainer(model_dir, init_pvm, samples, out, cfg, stop_after, progress, grad_accum)
    model = trainer.model
    probe_data = VLMDataset(samples, VLMDataset.TASKS, cfg.seed, describe_repeats=3)
    probe_batch = [VLMCollator(trainer.processing_class)([probe_data[i] for i in range(min(8, len(probe_data)))])]
    model.eval()
    before = pvm_report(model, probe_batch)
    trainer.train(resume_from_checkpoint=last_complete_checkpoint(out / "checkpoints"))
    if trainer.state.global_step < cfg.steps:
        return None
    model.eval()
    logs = [dict(h) for h in trainer.state.log_history]
    rewards = _reward_history(logs)
    summary = {"base": str(model_dir), "init": str(init_pvm), "train": asdict(cfg),
               "batch_layout": batch_layout(cfg.prompts_per_step * cfg.num_generations, grad_accum),
               "first_reward": rewards[0] if rewards else None, "last_reward": rewards[-1] if rewards else None,
               "rewards": rewards, "before": before, "after": pvm_report(model, probe_batch), "log_history": logs}

    publish_adapter(model, out, SUMMARY_FILE, summary)
    return summary
