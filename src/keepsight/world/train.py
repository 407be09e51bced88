"""Build a world VLM the way real ones are built, in four resumable stages (transformers' Trainer):

1. ``lm``       text-only language-model pretraining on world descriptions and captions (learns the
                world's co-occurrence priors, as a real LLM learns its language priors);
2. ``vision``   vision tower trained on its own, to name what sits in each grid cell and the scene type;
3. ``align``    the LLaVA model assembled from both, only the projector trains (feature alignment);
4. ``instruct`` projector + language model train on descriptions, captions and QA (tower frozen).

Each stage writes ``<out>/stages/<stage>/`` atomically when it finishes, and periodic Trainer
checkpoints under ``<out>/stages/<stage>-checkpoints/`` while it runs; running it again resumes from
the newest complete checkpoint. The final model and processor land in ``<out>``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from .config import WorldConfig
from .data import (
    IGNORE_INDEX,
    TextCollator,
    TextDataset,
    VisionCollator,
    VisionDataset,
    VLMCollator,
    VLMDataset,
    WorldSamples,
)
from .distributed import (
    _set_fsdp_wrap,
    batch_layout,
    gather_state_dict,
    length_grouped_sampler,
    main_process_writes,
    process_rank,
    trainer_placement,
)
from .models import PRESETS, build_model, get_preset, preset_processor, text_config, vision_config

STAGES = ("lm", "vision", "align", "instruct")
REQUIRES = {"lm": (), "vision": (), "align": ("lm", "vision"), "instruct": ("align",)}
DONE_FILE = "keepsight_stage.json"


@dataclass
class StageConfig:
    steps: int  # optimizer steps
    lr: float  # peak learning rate (cosine schedule, 5% warm-up)
    batch_size: int = 32


@dataclass
class TrainConfig:
    """Everything that determines a trained base model (its hash names the demo's cache entry)."""

    preset: str = "tiny-llava"
    seed: int = 0
    lm: StageConfig = field(default_factory=lambda: StageConfig(steps=600, lr=3e-3, batch_size=32))
    vision: StageConfig = field(default_factory=lambda: StageConfig(steps=500, lr=2e-3, batch_size=32))
    align: StageConfig = field(default_factory=lambda: StageConfig(steps=200, lr=2e-3, batch_size=32))
    instruct: StageConfig = field(default_factory=lambda: StageConfig(steps=1000, lr=1e-3, batch_size=32))
    save_every: int = 200  # checkpoint period in steps

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose from {sorted(PRESETS)}")
        if get_preset(self.preset).arch != "llava":
            raise ValueError(f"preset {self.preset!r}: staged world training supports LLaVA-family presets only")
        for name in STAGES:
            st = getattr(self, name)
            if isinstance(st, dict):
                st = StageConfig(**st)
                setattr(self, name, st)
            if st.steps < 1 or st.lr <= 0 or st.batch_size < 1:
                raise ValueError(f"{name}: steps, lr and batch_size must be positive, got {st}")
        if self.save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {self.save_every}")

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- helpers



def atomic_save_dir(out: Path, write) -> Path:
    """Call ``write(tmpdir)`` then rename tmpdir to ``out`` (replacing it): readers never see a half dir."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp", dir=out.parent))
    try:
        write(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def last_complete_checkpoint(ckpt_dir: Path) -> str | None:
    """Newest ``checkpoint-N`` holding ``trainer_state.json`` (Trainer writes it last, so a checkpoint
    interrupted mid-write is skipped)."""
    if not ckpt_dir.is_dir():
        return None
    done = [p for p in ckpt_dir.glob("checkpoint-*") if (p / "trainer_state.json").is_file()]
    if not done:
        return None
    return str(max(done, key=lambda p: int(p.name.split("-")[-1])))


def stop_at(step: int | None):
    """A Trainer callback that saves a checkpoint and stops after global step ``step`` (None: never)."""
    from transformers import TrainerCallback

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if step is not None and state.global_step >= step:
                control.should_save = True
                control.should_training_stop = True
            return control

    return StopAt()



def run_trainer(model: nn.Module, dataset, collator, stage: StageConfig, ckpt_dir: Path, seed: int,
                save_every: int, stop_after: int | None = None, progress: bool = True,
                optimizer_fn=None, grad_accum: int = 1) -> tuple[list[dict], int]:
    """Train with ``transformers.Trainer``, resuming from the newest complete checkpoint in ``ckpt_dir``.

    Runs as it is or under ``accelerate launch`` (DDP, DeepSpeed, FSDP): ``stage.batch_size`` is the
    global batch per optimizer step, split over processes and ``grad_accum`` steps (``batch_layout``);
    every process draws the same length-grouped order (``length_grouped_sampler``) and takes its share
    of each global batch. ``stop_after`` ends the run early after that global step (after its checkpoint),
    for tests and for splitting a long stage over several invocations. ``optimizer_fn(model)`` builds the
    optimizer instead of the Trainer's AdamW (e.g. per-group learning rates); it is called by the Trainer
    (FSDP does not accept a ready-made optimizer); the Trainer builds the cosine schedule around it.
    Returns the log history and the global step.
    """
    from transformers import Trainer, TrainingArguments

    layout = batch_layout(stage.batch_size, grad_accum)
    rank = process_rank()[0]
    if os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3":
        raise ValueError("DeepSpeed ZeRO-3 is not supported (outputs are saved from rank 0's parameters); use "
                         "configs/accelerate/fsdp.yaml to shard parameters, or ZeRO-2")
    _set_fsdp_wrap(model)

    class LengthAwareTrainer(Trainer):
        """Batches of similar length when the dataset knows its items' lengths (``dataset.lengths``):
        short QA items are not padded to the length of a long description."""

        def _get_train_sampler(self, train_dataset=None):
            ds = train_dataset if train_dataset is not None else self.train_dataset
            if getattr(ds, "lengths", None) is not None:
                return length_grouped_sampler(ds.lengths, layout["global_batch_size"], self.args.data_seed)
            return super()._get_train_sampler(train_dataset)

        def create_optimizer(self, model=None):
            if optimizer_fn is not None and self.optimizer is None:
                self.optimizer = optimizer_fn(self.model if model is None else model)
            return super().create_optimizer(model)

    args = TrainingArguments(
        output_dir=str(ckpt_dir),
        max_steps=stage.steps,
        per_device_train_batch_size=layout["per_device_batch_size"],
        gradient_accumulation_steps=layout["grad_accum"],
        learning_rate=stage.lr,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, stage.steps // 20),
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=max(1, min(50, stage.steps // 10)),
        save_strategy="steps",
        save_steps=save_every,
        save_total_limit=2,
        report_to=[],
        # the model's own randomness (dropout, a diffusion objective's masks) differs per process, as it
        # would between the samples of one big batch; the data order (data_seed) is the same everywhere
        seed=seed + rank,
        data_seed=seed,
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
                                 callbacks=[stop_at(stop_after)])
    trainer.train(resume_from_checkpoint=last_complete_checkpoint(ckpt_dir))
    return [dict(h) for h in trainer.state.log_history], trainer.state.global_step


class VisionPretrainer(nn.Module):
    """A vision tower with per-cell heads: patch features are average-pooled onto the world's grid and
    classified (shape incl. "empty", colour, size, and which cell it is); the CLS feature classifies the
    scene type. The cell target makes every feature say where it is, as a language model reading the
    features needs: RoPE alone cannot address the k-th image token from a growing distance."""

    def __init__(self, tower: nn.Module, config: WorldConfig):
        super().__init__()
        d = tower.config.hidden_size
        self.tower = tower
        self.grid = tuple(config.grid)
        self.shape_head = nn.Linear(d, len(config.shapes) + 1)
        self.colour_head = nn.Linear(d, len(config.colours))
        self.size_head = nn.Linear(d, len(config.sizes))
        self.scene_head = nn.Linear(d, len(config.scenes))
        self.cell_head = nn.Linear(d, self.grid[0] * self.grid[1])

    def forward(self, pixel_values, shape=None, colour=None, size=None, scene=None):
        h = self.tower(pixel_values=pixel_values).last_hidden_state  # [B, 1 + P, d]
        cls, patches = h[:, 0], h[:, 1:]
        b, p, d = patches.shape
        side = int(p**0.5)
        grid = patches.transpose(1, 2).reshape(b, d, side, side)  # [B, d, side, side]
        cells = nn.functional.adaptive_avg_pool2d(grid, self.grid).flatten(2).transpose(1, 2)  # [B, R*C, d]
        logits = {
            "shape": self.shape_head(cells), "colour": self.colour_head(cells),
            "size": self.size_head(cells), "scene": self.scene_head(cls), "cell": self.cell_head(cells),
        }
        out = {"logits_" + k: v for k, v in logits.items()}
        if shape is not None:
            ce = nn.functional.cross_entropy
            out["loss"] = (
                ce(logits["shape"].flatten(0, 1), shape.flatten())
                + ce(logits["colour"].flatten(0, 1), colour.flatten(), ignore_index=IGNORE_INDEX)
                + ce(logits["size"].flatten(0, 1), size.flatten(), ignore_index=IGNORE_INDEX)
                + ce(logits["scene"], scene)
                + ce(logits["cell"].flatten(0, 1), torch.arange(cells.shape[1], device=h.device).repeat(b))
            )
        return out


# ----------------------------------------------------------------------------- stages


def _stage_dirs(out: Path, stage: str) -> tuple[Path, Path]:
    return out / "stages" / stage, out / "stages" / f"{stage}-checkpoints"


def stage_done(out: Path, stage: str) -> bool:
    return (_stage_dirs(Path(out), stage)[0] / DONE_FILE).is_file()


def _finish(out: Path, stage: str, save, logs: list[dict], layout: dict) -> None:
    final, ckpts = _stage_dirs(out, stage)

    def write(tmp: Path) -> None:
        save(tmp)
        losses = [h["loss"] for h in logs if "loss" in h]
        info = {"stage": stage, "batch_layout": layout, "log_history": logs,
                "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None}
        (tmp / DONE_FILE).write_text(json.dumps(info, indent=2))

    def publish() -> None:
        atomic_save_dir(final, write)
        shutil.rmtree(ckpts, ignore_errors=True)

    main_process_writes(publish)


def train_stage(stage: str, out: str | os.PathLike, train_cfg: TrainConfig, samples: WorldSamples,
                stop_after: int | None = None, progress: bool = True, grad_accum: int = 1) -> dict | None:
    """Run one stage (resuming if interrupted). Returns its summary, or None if ``stop_after`` ended
    it before the last step (run again to continue). The stage's batch size is the global batch
    (``run_trainer``); under ``accelerate launch`` only the main process writes."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; choose from {STAGES}")
    out = Path(out)
    final, ckpts = _stage_dirs(out, stage)
    if (final / DONE_FILE).is_file():
        return json.loads((final / DONE_FILE).read_text())
    for prev in REQUIRES[stage]:
        if not stage_done(out, prev):
            raise RuntimeError(f"stage {stage!r} needs stage {prev!r} first (run it, or --stage all)")
    preset = get_preset(train_cfg.preset)
    if samples.config.image_size != preset.image_size:
        raise ValueError(f"world image_size {samples.config.image_size} != preset {train_cfg.preset} "
                         f"image_size {preset.image_size}")
    processor = preset_processor(preset)
    tok = processor.tokenizer
    st: StageConfig = getattr(train_cfg, stage)
    seed = train_cfg.seed + STAGES.index(stage)
    torch.manual_seed(seed)

    if stage == "lm":
        from transformers import Qwen3ForCausalLM

        model = Qwen3ForCausalLM(text_config(preset, tok))
        logs, step = run_trainer(model, TextDataset(samples), TextCollator(tok), st, ckpts, seed,
                                 train_cfg.save_every, stop_after, progress, grad_accum=grad_accum)
        save = lambda d, sd: (model.save_pretrained(d, state_dict=sd), tok.save_pretrained(d))  # noqa: E731
    elif stage == "vision":
        from transformers import CLIPVisionModel

        model = VisionPretrainer(CLIPVisionModel(vision_config(preset)), samples.config)
        logs, step = run_trainer(model, VisionDataset(samples), VisionCollator(processor.image_processor), st,
                                 ckpts, seed, train_cfg.save_every, stop_after, progress, grad_accum=grad_accum)
        save = lambda d, sd: model.tower.save_pretrained(d, state_dict=sd)  # noqa: E731
    else:
        model = _vlm_for_stage(stage, out, preset, tok, seed)
        if stage == "align":
            data = VLMDataset(samples, ("describe", "caption"), seed)
        else:  # about a quarter of the steps on descriptions, the rest on short QA / grounding
            data = VLMDataset(samples, VLMDataset.TASKS, seed, describe_repeats=3)
        logs, step = run_trainer(model, data, VLMCollator(processor), st, ckpts, seed,
                                 train_cfg.save_every, stop_after, progress, grad_accum=grad_accum)
        save = lambda d, sd: (model.save_pretrained(d, state_dict=sd), processor.save_pretrained(d))  # noqa: E731
    if step < st.steps:
        return None
    sd = gather_state_dict(model, "tower." if stage == "vision" else "")  # None unless FSDP-sharded
    _finish(out, stage, lambda d: save(d, sd), logs, batch_layout(st.batch_size, grad_accum))
    return json.loads((final / DONE_FILE).read_text())


def assemble_from_stages(out: str | os.PathLike, preset, tok, seed: int):
    """A fresh LLaVA (new projector, initialised with ``seed``) whose language model and vision tower come
    from the finished ``lm`` and ``vision`` stages under ``out``: the backbone every projector starts from."""
    from transformers import CLIPVisionModel, Qwen3ForCausalLM

    out = Path(out)
    for prev in ("lm", "vision"):
        if not stage_done(out, prev):
            raise RuntimeError(f"{out}: stage {prev!r} has not finished")
    model = build_model(preset, tok, seed=seed)
    lm = Qwen3ForCausalLM.from_pretrained(_stage_dirs(out, "lm")[0])
    tower = CLIPVisionModel.from_pretrained(_stage_dirs(out, "vision")[0])
    model.model.language_model.load_state_dict(lm.model.state_dict())
    model.lm_head.load_state_dict(lm.lm_head.state_dict())
    model.model.vision_tower.load_state_dict(tower.state_dict())
    return model


def _vlm_for_stage(stage: str, out: Path, preset, tok, seed: int):
    """align: a fresh LLaVA whose language model and tower come from stages lm and vision, only the
    projector trainable. instruct: the aligned model, tower frozen, projector + language model trainable."""
    from transformers import LlavaForConditionalGeneration

    if stage == "align":
        model = assemble_from_stages(out, preset, tok, seed)
        trainable = ("multi_modal_projector",)
    else:
        model = LlavaForConditionalGeneration.from_pretrained(_stage_dirs(out, "align")[0])
        trainable = ("multi_modal_projector", "language_model", "lm_head")
    for name, p in model.named_parameters():
        p.requires_grad = any(t in name for t in trainable)
    return model.train()


def finalize(out: str | os.PathLike) -> Path:
    """Copy the instruct stage's model + processor to ``out`` itself (so ``from_pretrained(out)`` works)."""
    out = Path(out)
    if not stage_done(out, "instruct"):
        raise RuntimeError(f"{out}: stage 'instruct' has not finished")
    src = _stage_dirs(out, "instruct")[0]

    def copy() -> None:
        for f in src.iterdir():
            if f.name == DONE_FILE:
                continue
            tmp = out / f".{f.name}.tmp"
            shutil.copy2(f, tmp)
            os.replace(tmp, out / f.name)

    main_process_writes(copy)
    return out


def train_base(out: str | os.PathLike, train_cfg: TrainConfig, samples: WorldSamples,
               stages: tuple[str, ...] = STAGES, progress: bool = True, grad_accum: int = 1) -> dict:
    """Run ``stages`` in order (skipping finished ones) and finalise when all four are done."""
    from ..atomic import write_json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    main_process_writes(write_json, out / "train_config.json", train_cfg.to_dict())
    summaries = {}
    for stage in stages:
        summaries[stage] = train_stage(stage, out, train_cfg, samples, progress=progress, grad_accum=grad_accum)
    if all(stage_done(out, s) for s in STAGES):
        finalize(out)
    return summaries
