"""PVM stage 2: GRPO (TRL's GRPOTrainer) on the stage-1 model, backbone frozen, verifiable rewards.

The policy is the base model with the stage-1 adapter attached; only ``pvm.*`` trains (the gate in its own
optimizer group, as in stage 1). With ``beta > 0`` the KL reference is the base model *carrying the
stage-1 PVM*, frozen: TRL would otherwise rebuild the reference from the base checkpoint's path, without
the adapter, and the KL term would pull the policy back to the base rather than to stage 1.

What it trains on is a ``GRPOData``: prompts in TRL's conversational layout with the columns the reward
functions read, the rewards and their weights (the world's: ``keepsight.world.grpo``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset
from transformers import ProcessorMixin

from ..atomic import write_json
from ..checks import number
from ..fingerprint import data_fingerprint, dir_fingerprint
from ..models import load_checkpoint
from ..models.arch import arch_info, check_length
from ..pvm import gate_report, load_pvm
from ..pvm.attach import PREFIX
from ..pvm.io import ADAPTER_KIND, CONFIG_FILE
from ..pvm.layout import CHECKPOINT_KIND, save_released
from .distributed import batch_layout, main_process_writes, trainer_placement, unshard_root
from .pvm_sft import publish_adapter, pvm_optimizer, report_batches
from .recipe import Recipe, Run, run_recipe
from .trainer import (
    SCHEDULES,
    ExactResume,
    TrainOptions,
    last_complete_checkpoint,
    stop_at,
    warmup_steps,
)

SUMMARY_FILE = "pvm_grpo.json"
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
TRAINABLE = ("pvm", "llm+pvm")
MAX_COMPLETIONS = 1 << 16  # completions one optimizer step generates


@dataclass(kw_only=True)
class GRPOTrainConfig(TrainOptions):
    """``batch_size`` is derived: the ``prompts_per_step * num_generations`` completions of one optimizer step."""

    steps: int = 100
    lr: float = 2e-4  # projections
    gate_lr: float = 2e-3  # the gate (10x, as in stage 1)
    beta: float = 0.04  # KL to the stage-1 reference (DeepSeekMath's GRPO value); 0 = no reference model
    num_generations: int = 4  # completions per prompt (the group)
    prompts_per_step: int = 4  # the batch is prompts_per_step * num_generations completions
    max_completion_length: int | None = None  # default: the data's (GRPOData.max_completion_length)
    temperature: float = 1.0  # sampling temperature of the completions
    top_p: float = 1.0  # nucleus sampling of the completions
    loss_type: str = "dapo"  # TRL's GRPO loss aggregation ("grpo" | "bnpo" | "dr_grpo" | "dapo": TRL's default)
    mask_truncated_completions: bool = False  # completions cut at max_completion_length carry no loss
    trainable: str = "pvm"  # "pvm": only the PVM blocks; "llm+pvm": the language model too (tower and projector
    #                         frozen), as released; then the output is a whole checkpoint in the released layout
    save_every: int = 50
    schedule: str = "constant"  # constant after the warm-up (GRPO's usual schedule)
    batch_size: int = field(init=False, default=0)

    @classmethod
    def released(cls, **overrides) -> GRPOTrainConfig:
        """The released stage-2 settings (PVM's training_file/GRPO.py and README): lr 1e-6 constant, no warm-up,
        8 completions a prompt, temperature 1.0, top_p 1.0, truncated completions masked, the language model and
        PVM trainable with the tower frozen, no KL term and TRL's "dapo" loss (the script sets neither: these are
        TRL's defaults from 0.22 on, the versions beside its transformers 4.57). The released global batch is
        64 completions (8 prompts x 8), its completions up to 16,384 tokens (``max_completion_length``)."""
        return cls(**{**dict(lr=1e-6, gate_lr=1e-6, schedule="constant", warmup_ratio=0.0, num_generations=8,
                             prompts_per_step=8, temperature=1.0, top_p=1.0, beta=0.0, loss_type="dapo",
                             mask_truncated_completions=True, trainable="llm+pvm"), **overrides})

    def __post_init__(self) -> None:
        self.num_generations = number("num_generations", self.num_generations, 1, integer=True)
        self.prompts_per_step = number("prompts_per_step", self.prompts_per_step, 1, integer=True)
        if self.num_generations < 2:
            raise ValueError("num_generations must be >= 2 (GRPO normalises rewards within a group)")
        self.batch_size = self.prompts_per_step * self.num_generations
        super().__post_init__()
        self.gate_lr = number("gate_lr", self.gate_lr, 0.0, open_low=True)
        self.temperature = number("temperature", self.temperature, 0.0, open_low=True)
        self.top_p = number("top_p", self.top_p, 0.0, 1.0, open_low=True)
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.trainable not in TRAINABLE:
            raise ValueError(f"trainable must be one of {TRAINABLE}, got {self.trainable!r}")
        if not isinstance(self.mask_truncated_completions, bool):
            raise ValueError(f"mask_truncated_completions must be true or false, got {self.mask_truncated_completions!r}")
        if self.max_completion_length is not None:
            self.max_completion_length = number("max_completion_length", self.max_completion_length, 1, integer=True)
        number("beta", self.beta, 0.0)
        if self.batch_size > MAX_COMPLETIONS:
            raise ValueError(f"prompts_per_step x num_generations = {self.batch_size} completions a step; at most "
                             f"{MAX_COMPLETIONS}")


@dataclass
class GRPOData:
    """What stage 2 trains on."""

    dataset: object  # a datasets.Dataset: "prompt" (conversational, with image parts), "image", reward columns
    rewards: list[Callable]  # TRL reward functions (completions, **columns) -> list[float]
    weights: list[float]  # one per reward
    report_items: list = field(default_factory=list)  # ``Sample``s the PVM report is measured on
    max_completion_length: int = 128  # used when the config gives none
    fingerprint: str = ""  # what the prompts and rewards were made from (recorded with the adapter)

    def __post_init__(self) -> None:
        if len(self.rewards) != len(self.weights) or not self.rewards:
            raise ValueError(f"GRPOData: {len(self.rewards)} rewards but {len(self.weights)} weights")

    @classmethod
    def from_samples(cls, dataset, rewards: list, weights: list[float] | None = None,
                     max_completion_length: int = 128) -> GRPOData:
        """Prompts from ``Sample``s with reference answers (a user's data): each prompt is the conversation
        before its last assistant turn, that turn's text is the ``answer`` column the rewards read. A sample
        without an assistant turn is an error naming it (GRPO needs a reference)."""
        rows = []
        for i in range(len(dataset)):
            s = dataset[i]
            if s.answer is None:
                where = dataset.where(i) if hasattr(dataset, "where") else f"sample {i}"
                raise ValueError(f"{where}: no assistant turn to take the reference answer from; GRPO on your data "
                                 "needs an answer per prompt")
            n = sum(p.get("type") == "image" for m in s.prompt_messages for p in m["content"]
                    if isinstance(m["content"], list))
            row = {"prompt": s.prompt_messages, "answer": s.answer}
            if n == 1:
                row["image"] = s.images[0]
            elif n > 1:
                row["images"] = s.images
            rows.append(row)
        weights = [1.0] * len(rewards) if weights is None else list(weights)
        return cls(Dataset.from_list(rows), list(rewards), weights, report_items=[dataset[i] for i in
                                                                                   range(min(8, len(dataset)))],
                   max_completion_length=max_completion_length, fingerprint=data_fingerprint(dataset))


def _trainer_class():
    from trl import GRPOTrainer  # optional dependency (the `train` extra)
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model  # optional dependency

    class PVMGRPOTrainer(ExactResume, GRPOTrainer):
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
                from trl.models.utils import prepare_deepspeed  # optional dependency (the `train` extra)

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


class PVMGRPORecipe(Recipe):
    """Base + the stage-1 adapter ``init_pvm``, trained with TRL's GRPOTrainer: only ``pvm.*`` (an adapter comes out),
    or with ``trainable="llm+pvm"`` the language model too (a whole checkpoint in the released PVM layout)."""

    summary_file = SUMMARY_FILE
    marker_file = CONFIG_FILE
    kind = ADAPTER_KIND

    def __init__(self, model_dir, init_pvm, data: GRPOData, options: GRPOTrainConfig):
        super().__init__(options)
        self.model_dir, self.init_pvm, self.data = Path(model_dir), Path(init_pvm), data
        self.trainer = None
        self.language_model: set[str] = set()  # parameter names of the decoder stack and lm_head (llm+pvm)
        if options.trainable == "llm+pvm":
            self.kind, self.marker_file = CHECKPOINT_KIND, "config.json"

    def request(self) -> dict:
        return {"base": dir_fingerprint(self.model_dir), "init": dir_fingerprint(self.init_pvm),
                "data": self.data.fingerprint, "rewards": [getattr(r, "__name__", repr(r)) for r in self.data.rewards],
                "weights": list(self.data.weights)}

    def trainable(self, name: str) -> bool:
        return name.startswith(PREFIX) or name in self.language_model

    def load(self):
        """Builds the GRPO trainer (the model is frozen by name before TRL sees it) and returns its policy."""
        self.trainer = self._build_trainer()
        return self.trainer.model, self.trainer.processing_class

    def _build_trainer(self):
        from trl import GRPOConfig  # optional dependency (the `train` extra)

        cfg, run = self.options, self.run
        layout = batch_layout(cfg.batch_size, run.grad_accum)
        model, processor = load_checkpoint(self.model_dir, dtype=None, device="cpu", expect="autoregressive")
        if not isinstance(processor, ProcessorMixin):  # keepsight's image-only Qwen processor (no torchvision)
            raise ValueError(f"GRPO (TRL) needs the checkpoint's own processor class; {self.model_dir} loaded an "
                             f"image-only {type(processor).__name__} because torchvision is missing - install "
                             "torchvision (with a matching torch) to run stage 2 on Qwen-VL")
        completion = cfg.max_completion_length or self.data.max_completion_length
        check_length(model, completion, "max_completion_length")
        if cfg.prompts_per_step > len(self.data.dataset):
            raise ValueError(f"prompts_per_step {cfg.prompts_per_step} exceeds the {len(self.data.dataset)} prompts of "
                             "the data: no full step could be drawn")
        load_pvm(model, self.init_pvm)
        if cfg.trainable == "llm+pvm":
            if model._keepsight_pvm.config.variant != "released":
                raise ValueError("trainable llm+pvm writes the released checkpoint layout, which holds the released "
                                 f"block; {self.init_pvm} is a {model._keepsight_pvm.config.variant!r} adapter")
            info = arch_info(model)
            lm = {id(p) for m in (info.language_model, info.lm_head) for p in m.parameters()}
            self.language_model = {n for n, p in model.named_parameters() if id(p) in lm}
        for name, p in model.named_parameters():
            p.requires_grad = self.trainable(name)
        ref_model = None
        if cfg.beta > 0:
            ref_model, _ = load_checkpoint(self.model_dir, dtype=None, device="cpu")
            load_pvm(ref_model, self.init_pvm)
        args = GRPOConfig(
            output_dir=str(self.checkpoint_dir()),
            max_steps=cfg.steps,
            per_device_train_batch_size=layout["per_device_batch_size"],
            gradient_accumulation_steps=layout["grad_accum"],
            num_generations=cfg.num_generations,
            max_completion_length=completion,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            loss_type=cfg.loss_type,
            mask_truncated_completions=cfg.mask_truncated_completions,
            beta=cfg.beta,
            learning_rate=cfg.lr,
            lr_scheduler_type=SCHEDULES[cfg.schedule],
            warmup_steps=warmup_steps(cfg.steps, cfg.warmup_ratio),
            reward_weights=list(self.data.weights),
            logging_steps=max(1, min(10, cfg.steps // 10)),
            save_strategy="steps",
            save_steps=cfg.save_every,
            save_total_limit=2,
            report_to=[],
            seed=cfg.seed,
            data_seed=cfg.seed,
            **trainer_placement(),
            gradient_checkpointing=False,
            disable_tqdm=not run.progress,
        )
        return _trainer_class()(
            model=model, reward_funcs=list(self.data.rewards), args=args, train_dataset=self.data.dataset,
            processing_class=processor, optimizer_fn=lambda m: pvm_optimizer(m, cfg.lr, cfg.gate_lr),
            callbacks=[stop_at(run.stop_after)], ref_model=ref_model,
        )

    def dataset(self, processor):
        return self.data.dataset

    def collator(self, processor):
        return None  # TRL's GRPOTrainer tokenises the prompts itself

    def _report(self, model) -> dict:
        items = self.data.report_items
        return gate_report(model, report_batches(self.trainer.processing_class, items, self.options.max_length,
                                                 self.options.skip_bad_rows)) if items else {}

    def before(self, model, processor) -> dict:
        model.eval()
        return self._report(model)

    def fit(self, model, processor):
        self.trainer.train(resume_from_checkpoint=last_complete_checkpoint(self.checkpoint_dir()))
        return [dict(h) for h in self.trainer.state.log_history], self.trainer.state.global_step

    def summarise(self, model, processor, logs):
        rewards = _reward_history(logs)
        return {"base": str(self.model_dir), "init": str(self.init_pvm),
                "first_reward": rewards[0] if rewards else None, "last_reward": rewards[-1] if rewards else None,
                "rewards": rewards, "after": self._report(model)}

    def publish(self, model, processor, out, summary):
        if self.options.trainable == "pvm":
            return publish_adapter(model, out, self.summary_file, summary)
        unshard_root(model)
        main_process_writes(lambda: save_released(model, out, processor,
                                                  extra=lambda tmp: write_json(tmp / self.summary_file, summary)))
        return None


def build_grpo_trainer(model_dir: str | os.PathLike, init_pvm: str | os.PathLike, data: GRPOData,
                       out: str | os.PathLike, cfg: GRPOTrainConfig, stop_after: int | None = None,
                       progress: bool = True, grad_accum: int = 1):
    """The GRPO trainer for stage 2: policy = base + ``init_pvm`` with only ``pvm.*`` trainable; reference
    (when ``cfg.beta > 0``) = base + ``init_pvm``, frozen. The ``prompts_per_step * num_generations``
    completions of a step are the global batch, split over the processes and ``grad_accum`` steps (TRL
    generates once per ``grad_accum`` steps and normalises rewards per group across processes)."""
    recipe = PVMGRPORecipe(model_dir, init_pvm, data, cfg)
    recipe.run = Run(Path(out), stop_after, progress, grad_accum)
    return recipe._build_trainer()


def train_pvm_grpo(model_dir: str | os.PathLike, init_pvm: str | os.PathLike, data: GRPOData,
                   out: str | os.PathLike, cfg: GRPOTrainConfig | None = None, stop_after: int | None = None,
                   progress: bool = True, grad_accum: int = 1, overwrite: bool = False) -> dict | None:
    """GRPO the stage-1 adapter ``init_pvm`` on top of the base in ``model_dir``; adapter -> ``out``
    (written by the main process only under ``accelerate launch``).

    Resumable (Trainer checkpoints under ``out/checkpoints``); returns the summary (rewards over training,
    gate values and relative norms before / after), or None when ``stop_after`` ended the run early.
    """
    recipe = PVMGRPORecipe(model_dir, init_pvm, data, cfg or GRPOTrainConfig())
    return run_recipe(recipe, out, stop_after, progress, grad_accum, overwrite)
