"""Build a world VLM the way real ones are built, in four resumable stages (transformers' Trainer), each a
``keepsight.train`` recipe:

1. ``lm``       text-only language-model pretraining on world descriptions and captions (learns the
                world's co-occurrence priors, as a real LLM learns its language priors);
2. ``vision``   vision tower trained on its own, to name what sits in each grid cell and the scene type;
3. ``align``    the LLaVA model assembled from both, only the projector trains (feature alignment);
4. ``ground``   (optional) projector + language model learn to read one named cell ("what colour is the object
                at b3 ?"): the lookup a mixed instruction set leaves on a long plateau (see ``LOOKUP``);
5. ``instruct`` projector + language model train on descriptions, captions and QA (tower frozen).

Each stage writes ``<out>/stages/<stage>/`` atomically when it finishes, and periodic Trainer
checkpoints under ``<out>/stages/<stage>-checkpoints/`` while it runs; running it again resumes from
the newest complete checkpoint. The final model and processor land in ``<out>``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn
from transformers import CLIPVisionModel, LlavaForConditionalGeneration, Qwen3ForCausalLM

from ..atomic import MARKER, check_output_dir, mark, marked_kind, replace_dir, write_json
from ..data import IGNORE_INDEX, TextCollator, VLMCollator
from ..determinism import environment
from ..fingerprint import differences, digest
from ..train.distributed import main_process_writes
from ..train.recipe import Recipe, publish_directory, run_recipe
from ..train.trainer import TrainOptions
from .config import WorldConfig
from .models import (
    PRESETS,
    build_llada_v,
    build_model,
    get_preset,
    preset_processor,
    text_config,
    vision_config,
)
from .tasks import (
    INSTRUCT_TASKS,
    TextDataset,
    VisionCollator,
    VisionDataset,
    VLMDataset,
    WorldSamples,
    instruct_data,
)
from .texts import YES_NO_CATEGORIES

STAGES = ("lm", "vision", "align", "ground", "instruct")
BASE_KIND = "world-base"
BASE_REQUEST = "keepsight_request.json"
REQUIRES = {"lm": (), "vision": (), "align": ("lm", "vision"), "ground": ("align",), "instruct": ("ground",)}
DONE_FILE = "keepsight_stage.json"
SEED_OFFSET = {"lm": 0, "vision": 1, "align": 2, "instruct": 3, "ground": 4}  # a stage's seed: the recipe's + this


@dataclass
class StageConfig:
    """One stage's schedule (the rest of its ``TrainOptions`` comes from the ``TrainConfig``)."""

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
    instruct_tasks: tuple[str, ...] = INSTRUCT_TASKS + ("chat",)  # the instruct stage's mix (VLMDataset tasks)
    max_turns: int = 16  # "chat": the longest conversation (turns) the base is trained on
    instruct_lm_lr: float | None = None  # the language model's peak lr in instruct (None: the stage's lr)
    ground: StageConfig | None = None  # the cell-lookup stage between align and instruct (None: no such stage)
    count_head: bool = False  # the vision stage also classifies the number of objects from the CLS feature
    yes_no_categories: int = 2  # "yes_no" in instruct: the categories drawn per scene (each a yes and a no question)
    rehearsal: tuple[int, int] = (4, 4)  # "rehearse" in instruct: lookups and colour yes/no questions per scene

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose from {sorted(PRESETS)}")
        if get_preset(self.preset).arch != "llava":
            raise ValueError(f"preset {self.preset!r}: staged world training supports LLaVA-family presets only")
        if isinstance(self.ground, dict):
            self.ground = StageConfig(**self.ground)
        for name in self.stages:
            st = getattr(self, name)
            if isinstance(st, dict):
                st = StageConfig(**st)
                setattr(self, name, st)
            if st.steps < 1 or st.lr <= 0 or st.batch_size < 1:
                raise ValueError(f"{name}: steps, lr and batch_size must be positive, got {st}")
        if self.save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {self.save_every}")
        self.instruct_tasks = tuple(self.instruct_tasks)
        bad = sorted(set(self.instruct_tasks) - set(VLMDataset.TASKS))
        if bad or not self.instruct_tasks:
            raise ValueError(f"instruct_tasks: unknown {bad}; choose from {VLMDataset.TASKS}" if bad else
                             "instruct_tasks: empty")
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or self.max_turns < 2:
            raise ValueError(f"max_turns must be an integer >= 2, got {self.max_turns!r}")
        if self.instruct_lm_lr is not None and not (isinstance(self.instruct_lm_lr, (int, float))
                                                    and 0 < self.instruct_lm_lr < float("inf")):
            raise ValueError(f"instruct_lm_lr must be > 0 (or None), got {self.instruct_lm_lr!r}")
        self.rehearsal = tuple(self.rehearsal)
        if (len(self.rehearsal) != 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in self.rehearsal)
                or not any(self.rehearsal)):
            raise ValueError(f"rehearsal must be two integers >= 0 (lookups, colour yes/no questions per scene), not "
                             f"both 0; got {self.rehearsal!r}")
        if (isinstance(self.yes_no_categories, bool) or not isinstance(self.yes_no_categories, int)
                or not 1 <= self.yes_no_categories <= len(YES_NO_CATEGORIES)):
            raise ValueError(f"yes_no_categories must be an integer in [1, {len(YES_NO_CATEGORIES)}], got "
                             f"{self.yes_no_categories!r}")

    def to_dict(self) -> dict:
        """The fields; the optional ground stage, count head, yes/no share and rehearsal only when they act, so a recipe
        without them keeps the cache key and ``train_config.json`` it had before they existed."""
        d = asdict(self)
        for name, off in (("ground", None), ("count_head", False), ("yes_no_categories", 2)):
            if d[name] == off:
                del d[name]
        if "rehearse" not in self.instruct_tasks:
            del d["rehearsal"]
        else:
            d["rehearsal"] = list(self.rehearsal)
        return d

    def instruct_mix(self, samples: WorldSamples, seed: int, balanced: bool = False) -> VLMDataset:
        """The instruct stage's data on ``samples`` (its tasks, conversation length and yes/no share): what the method
        recipes (PVM stage 1, the LoRA control, full fine-tuning, a bridge's phase 2) train on beside this base.
        ``balanced``: the yes/no task asks each question with its twin ("yes_no_balanced", the PVM mechanism
        control's data) instead of "yes_no"."""
        tasks = self.instruct_tasks
        if balanced:
            tasks = tuple(t for t in tasks if t != "yes_no") + ("yes_no_balanced",)
        return instruct_data(samples, seed, tasks, self.max_turns, self.yes_no_categories, self.rehearsal)

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages this recipe runs, in order (``ground`` only when it has a schedule)."""
        return tuple(s for s in STAGES if s != "ground" or self.ground is not None)

    def requires(self, stage: str) -> tuple[str, ...]:
        """The stages ``stage`` starts from (instruct starts from align when there is no ground stage)."""
        if stage == "instruct" and self.ground is None:
            return ("align",)
        return REQUIRES[stage]

    def options(self, stage: str) -> TrainOptions:
        """The ``TrainOptions`` of ``stage``: its schedule, seed ``seed + SEED_OFFSET[stage]``, this checkpoint period."""
        st: StageConfig = getattr(self, stage)
        return TrainOptions(steps=st.steps, lr=st.lr, batch_size=st.batch_size, seed=self.seed + SEED_OFFSET[stage],
                            save_every=self.save_every)


# The base recipe (`keepsight world train` and the demo's full profiles; 4,000 scenes, about 9 minutes on 2 cores).
# Alignment is long enough for the frozen language model to read the projector's output, and in instruct the
# language model learns at half the projector's rate: a short alignment at one rate left some seeds' bases
# ignoring the image (held-out yes/no 0.61 against 0.81). The instruct mix adds "count_yes_no" (two "are there n
# objects ?" pairs per scene, one "no" a near miss), without which the yes/no count category stayed near chance.
BASE_RECIPE = TrainConfig(
    lm=StageConfig(250, 3e-3, 32), vision=StageConfig(400, 2e-3, 32), align=StageConfig(600, 2e-3, 16),
    instruct=StageConfig(4000, 2e-3, 16), instruct_lm_lr=1e-3, save_every=200,
    instruct_tasks=INSTRUCT_TASKS + ("chat", "count_yes_no"),
)


# The grounded recipe (`keepsight world train --recipe grounded`): the base recipe with a count head on the tower's CLS,
# a ground stage (2,500 lookup steps) before instruct, every yes/no category of each scene in the instruct mix (six a
# scene, not two), conversations with the image shown again before a later question ("chat_image": the history
# oracle's format), and the ground stage rehearsed in a longer instruct (6,000 steps; "rehearse": four of each scene's
# lookups and four colour yes/no questions). Without the rehearsal instruct undid the lookup and the colour category
# stayed near chance on some seeds; with it at 4,000 steps another category (scene) did on one seed.
# README ("The grounded recipe") gives what it measured over seeds, and what was tried and failed.
GROUNDED_RECIPE = replace(BASE_RECIPE, count_head=True, ground=StageConfig(2500, 7e-4, 16),
                          instruct=StageConfig(6000, 2e-3, 16), yes_no_categories=6,
                          instruct_tasks=BASE_RECIPE.instruct_tasks + ("chat_image", "rehearse"))

# The regime recipe (`keepsight world train --recipe regime`): the grounded recipe on `tiny-llava-r300`, whose language
# model's RoPE base is 300 instead of 10,000. At the default base the tiny model finds the image by content at any
# distance, so what a long history costs it is the text's interference, which showing the image again does not undo
# (the oracle won back 0.23-0.30 of the drop over 3 seeds); with positions that turn within the conversation, reaching
# the image costs more the further the text has run from it, and showing it again just before the question is a real
# restoration of access: the regime the history oracle is meant to prove.
REGIME_RECIPE = replace(GROUNDED_RECIPE, preset="tiny-llava-r300")
RECIPES = {"base": BASE_RECIPE, "grounded": GROUNDED_RECIPE, "regime": REGIME_RECIPE}


class VisionPretrainer(nn.Module):
    """A vision tower with per-cell heads: patch features are average-pooled onto the world's grid and
    classified (shape incl. "empty", colour, size, and which cell it is); the CLS feature classifies the
    scene type (and with ``count_head`` the number of objects). The cell target makes every feature say where
    it is, as a language model reading the features needs: RoPE alone cannot address the k-th image token from a
    growing distance."""

    def __init__(self, tower: nn.Module, config: WorldConfig, count_head: bool = False):
        super().__init__()
        d = tower.config.hidden_size
        self.tower = tower
        self.grid = tuple(config.grid)
        self.shape_head = nn.Linear(d, len(config.shapes) + 1)
        self.colour_head = nn.Linear(d, len(config.colours))
        self.size_head = nn.Linear(d, len(config.sizes))
        self.scene_head = nn.Linear(d, len(config.scenes))
        self.count_head = nn.Linear(d, config.max_objects + 1) if count_head else None
        self.cell_head = nn.Linear(d, self.grid[0] * self.grid[1])

    def forward(self, pixel_values, shape=None, colour=None, size=None, scene=None, count=None):
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
        if self.count_head is not None:
            logits["count"] = self.count_head(cls)
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
            if self.count_head is not None:
                if count is None:
                    raise ValueError("VisionPretrainer(count_head=True) needs the count target")
                out["loss"] = out["loss"] + ce(logits["count"], count)
        return out


# ----------------------------------------------------------------------------- stages


def _stage_dirs(out: Path, stage: str) -> tuple[Path, Path]:
    return out / "stages" / stage, out / "stages" / f"{stage}-checkpoints"


def stage_done(out: Path, stage: str) -> bool:
    return (_stage_dirs(Path(out), stage)[0] / DONE_FILE).is_file()


def is_world_base(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a world base directory with finished ``lm`` and ``vision`` stages."""
    path = Path(path)
    return (path / "train_config.json").is_file() and all(stage_done(path, s) for s in ("lm", "vision"))


def read_train_config(base_dir: str | os.PathLike) -> TrainConfig:
    path = Path(base_dir) / "train_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{base_dir} is not a world base directory: train_config.json is missing")
    return TrainConfig(**json.loads(path.read_text()))


class StageRecipe(Recipe):
    """One stage of the base (see the module docstring)."""

    summary_file = DONE_FILE
    marker_file = DONE_FILE
    kind = "base-stage"

    def __init__(self, stage: str, out: Path, train_cfg: TrainConfig, samples: WorldSamples):
        super().__init__(train_cfg.options(stage))
        self.stage, self.base, self.train_cfg, self.samples = stage, Path(out), train_cfg, samples
        self.preset = get_preset(train_cfg.preset)

    def request(self) -> dict:
        return {"stage": self.stage, "preset": self.train_cfg.preset, "data": self.samples.fingerprint()}

    def load(self):
        processor = preset_processor(self.preset)
        tok, seed = processor.tokenizer, self.options.seed
        torch.manual_seed(seed)
        if self.stage == "lm":
            return Qwen3ForCausalLM(text_config(self.preset, tok)), processor
        if self.stage == "vision":
            tc = self.train_cfg
            return VisionPretrainer(CLIPVisionModel(vision_config(self.preset)), self.samples.config,
                                    count_head=tc.count_head), processor
        if self.stage == "align":  # a fresh projector between the pretrained language model and tower
            return assemble_from_stages(self.base, self.preset, tok, seed), processor
        start = self.train_cfg.requires(self.stage)[0]  # ground: align; instruct: ground (or align)
        return LlavaForConditionalGeneration.from_pretrained(_stage_dirs(self.base, start)[0]), processor

    def trainable(self, name: str) -> bool:
        if self.stage == "align":
            return "multi_modal_projector" in name
        if self.stage in ("ground", "instruct"):  # tower frozen
            return any(t in name for t in ("multi_modal_projector", "language_model", "lm_head"))
        return True

    def dataset(self, processor):
        if self.stage == "lm":
            return TextDataset(self.samples)
        if self.stage == "vision":
            return VisionDataset(self.samples, count=self.train_cfg.count_head)
        if self.stage == "ground":
            return VLMDataset(self.samples, ("lookup",), self.options.seed)
        if self.stage == "align":
            return VLMDataset(self.samples, ("describe", "caption"), self.options.seed)
        # about a quarter of the steps on descriptions, the rest on short QA / grounding (and conversations)
        return self.train_cfg.instruct_mix(self.samples, self.options.seed)

    def optimizer_fn(self):
        lm_lr = self.train_cfg.instruct_lm_lr
        if self.stage != "instruct" or lm_lr is None:
            return None
        lr = self.options.lr

        def build(model):
            groups = {"projector": [], "lm": []}
            for name, p in model.named_parameters():
                if p.requires_grad:
                    groups["projector" if "multi_modal_projector" in name else "lm"].append(p)
            return torch.optim.AdamW([{"params": groups["projector"], "lr": lr}, {"params": groups["lm"], "lr": lm_lr}],
                                     lr=lr, weight_decay=0.0)

        return build

    def collator(self, processor):
        if self.stage == "lm":
            return TextCollator(processor.tokenizer)
        if self.stage == "vision":
            return VisionCollator(processor.image_processor, count=self.train_cfg.count_head)
        return VLMCollator(processor)

    def checkpoint_dir(self) -> Path:
        return _stage_dirs(self.base, self.stage)[1]

    def summarise(self, model, processor, logs):
        return {"stage": self.stage}

    def publish(self, model, processor, out, summary):
        final, ckpts = _stage_dirs(self.base, self.stage)
        if self.stage == "lm":
            def save(d, sd):
                model.save_pretrained(d, state_dict=sd)
                processor.tokenizer.save_pretrained(d)
        elif self.stage == "vision":
            def save(d, sd):
                model.tower.save_pretrained(d, state_dict=sd)
        else:
            def save(d, sd):
                model.save_pretrained(d, state_dict=sd)
                processor.save_pretrained(d)
        publish_directory(final, self.summary_file, summary, model, "tower." if self.stage == "vision" else "", save,
                          cleanup=ckpts, kind=self.kind)


def prepare_base(out: Path, train_cfg: TrainConfig, samples: WorldSamples, overwrite: bool = False) -> Path:
    """Check ``out`` before training a base into it: new, empty, or a base trained with the same config on the
    same scenes under the same environment (``keepsight.determinism``: versions, CPU kind, threads; then finished
    stages are reused and an unfinished one resumes); another base is refused unless ``overwrite``. Returns the
    directory to train in, with the config (``train_config.json``) and the request recorded: ``out``, or, when
    ``overwrite`` replaces another base, a hidden sibling ``.<out>.replacing-<request hash>`` (the old base stays
    whole in ``out`` until the new one is complete and replaces it; a rerun of the same request resumes there)."""
    request = json.loads(json.dumps({"train": train_cfg.to_dict(), "data": samples.fingerprint(),
                                     "environment": environment()}))
    old_cfg = out / "train_config.json"
    if out.is_dir() and marked_kind(out) is None and old_cfg.is_file():  # a base of an earlier keepsight version
        main_process_writes(mark, out, BASE_KIND)
    check_output_dir(out, "--out", kinds=(BASE_KIND,))
    old = None
    if (out / BASE_REQUEST).is_file():
        old = json.loads((out / BASE_REQUEST).read_text())
    elif old_cfg.is_file():
        old = {"train": json.loads(old_cfg.read_text()), "data": request["data"], "environment": None}
    work = out
    if old is not None and old != request:
        if not overwrite:
            diff = "; ".join(differences(old, request)[:6])
            raise ValueError(f"--out {out} holds a base trained with other settings ({diff}); pass --overwrite to "
                             "replace it, or choose another --out")
        work = out.with_name(f".{out.name}.replacing-{digest(request, 12)}")

    def start() -> None:
        work.mkdir(parents=True, exist_ok=True)
        mark(work, BASE_KIND)
        write_json(work / "train_config.json", train_cfg.to_dict())
        write_json(work / BASE_REQUEST, request)

    main_process_writes(start)
    return work


def train_stage(stage: str, out: str | os.PathLike, train_cfg: TrainConfig, samples: WorldSamples,
                stop_after: int | None = None, progress: bool = True, grad_accum: int = 1,
                overwrite: bool = False) -> dict | None:
    """Run one stage (resuming if interrupted). Returns its summary, or None if ``stop_after`` ended
    it before the last step (run again to continue). The stage's batch size is the global batch
    (``run_trainer``); under ``accelerate launch`` only the main process writes. A base that replaces another
    (``prepare_base``) takes ``out``'s place when its last stage is done."""
    if stage not in train_cfg.stages:
        hint = " (this recipe has no ground stage: set its schedule, TrainConfig.ground)" if stage == "ground" else ""
        raise ValueError(f"unknown stage {stage!r}; choose from {train_cfg.stages}{hint}")
    out = Path(out)
    work = prepare_base(out, train_cfg, samples, overwrite)
    final, _ = _stage_dirs(work, stage)
    if (final / DONE_FILE).is_file():
        summary = json.loads((final / DONE_FILE).read_text())
    else:
        for prev in train_cfg.requires(stage):
            if not stage_done(work, prev):
                raise RuntimeError(f"stage {stage!r} needs stage {prev!r} first (run it, or --stage all)")
        preset = get_preset(train_cfg.preset)
        if samples.config.image_size != preset.image_size:
            raise ValueError(f"world image_size {samples.config.image_size} != preset {train_cfg.preset} "
                             f"image_size {preset.image_size}")
        summary = run_recipe(StageRecipe(stage, work, train_cfg, samples), final, stop_after, progress, grad_accum)
    if work != out and all(stage_done(work, s) for s in train_cfg.stages):
        finalize(work)
        main_process_writes(replace_dir, work, out, BASE_KIND)
    return summary


def assemble_from_stages(out: str | os.PathLike, preset, tok, seed: int):
    """A fresh LLaVA (new projector, initialised with ``seed``) whose language model and vision tower come
    from the finished ``lm`` and ``vision`` stages under ``out``: the backbone every projector starts from."""
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


def finalize(out: str | os.PathLike) -> Path:
    """Copy the instruct stage's model + processor to ``out`` itself (so ``from_pretrained(out)`` works)."""
    out = Path(out)
    if not stage_done(out, "instruct"):
        raise RuntimeError(f"{out}: stage 'instruct' has not finished")
    src = _stage_dirs(out, "instruct")[0]

    def copy() -> None:
        for f in src.iterdir():
            if f.name in (DONE_FILE, MARKER):
                continue
            tmp = out / f".{f.name}.tmp"
            shutil.copy2(f, tmp)
            os.replace(tmp, out / f.name)

    main_process_writes(copy)
    return out


def train_base(out: str | os.PathLike, train_cfg: TrainConfig, samples: WorldSamples,
               stages: tuple[str, ...] | None = None, progress: bool = True, grad_accum: int = 1,
               overwrite: bool = False) -> dict:
    """Run ``stages`` (default: every stage of the recipe) in order, skipping finished ones, and finalise when all
    are done. ``out`` must be new, empty or a base of the same request (``prepare_base``)."""
    out = Path(out)
    work = prepare_base(out, train_cfg, samples, overwrite)
    summaries = {}
    for stage in train_cfg.stages if stages is None else stages:
        summaries[stage] = train_stage(stage, out, train_cfg, samples, progress=progress, grad_accum=grad_accum,
                                       overwrite=overwrite)
    if work == out and all(stage_done(out, s) for s in train_cfg.stages):  # a replacement was finalised before its swap
        finalize(out)
    return summaries


# ----------------------------------------------------------------------------- models built from a base's stages


def backbone_init(base_dir: str | os.PathLike, seed: int):
    """``(model, processor)``: a fresh LLaVA whose language model and tower are the base's pretrained ones (the
    backbone its own MLP projector was aligned on), for a bridge's phase 1 (``keepsight.train.bridge``)."""
    tc = read_train_config(base_dir)
    preset = get_preset(tc.preset)
    processor = preset_processor(preset)
    return assemble_from_stages(base_dir, preset, processor.tokenizer, seed), processor


def llada_v_init(base_dir: str | os.PathLike, seed: int = 0, text_layers: int | None = None,
                 language_model_from: str | os.PathLike | None = None):
    """``(model, processor)``: a tiny LLaDA-V-style VLM whose vision tower is the base's pretrained one (stage
    ``vision``), for masked-diffusion training (``keepsight.train.diffusion``); ``text_layers``: a deeper (or
    shallower) language model than the base preset's. ``language_model_from``: an autoregressive world model (a base,
    or one fine-tuned from it) whose language model and projector the diffusion model starts from, as Dream 7B starts
    from Qwen2.5 (``adapt_from_autoregressive``); None: a fresh language model and projector."""
    base_dir = Path(base_dir)
    tower_dir = _stage_dirs(base_dir, "vision")[0]
    if not (tower_dir / "config.json").is_file():
        raise FileNotFoundError(f"{base_dir} has no finished vision stage ({tower_dir}); train the base first")
    tc = read_train_config(base_dir)
    preset = get_preset(tc.preset)
    processor = preset_processor(preset)
    if text_layers is not None:
        preset = replace(preset, text_layers=text_layers)
    model = build_llada_v(processor, preset, seed=seed)
    model.model.vision_tower.load_state_dict(CLIPVisionModel.from_pretrained(tower_dir).state_dict())
    if language_model_from is not None:
        if not (Path(language_model_from) / "config.json").is_file():
            raise FileNotFoundError(f"language_model_from={language_model_from}: no model directory (config.json) "
                                    "there")
        adapt_from_autoregressive(model, LlavaForConditionalGeneration.from_pretrained(language_model_from),
                                  str(language_model_from))
    return model, processor


# the autoregressive world LM's weights a LLaDA language model has no place for (Qwen3 normalises queries and keys)
AR_ONLY = ("self_attn.q_norm.", "self_attn.k_norm.")


def adapt_from_autoregressive(model, source, where: str = "the source") -> None:
    """Copy ``source``'s (an autoregressive LLaVA of the same preset) language model, LM head and projector into the
    diffusion VLM ``model``, in place; its vision tower stays. Qwen3's query / key norms are left out (LLaDA has none).
    Every other weight must be there with the same shape: a missing or misshaped one is a ValueError naming it."""
    theirs = source.state_dict()
    mine = {k: v for k, v in model.state_dict().items() if "vision_tower" not in k}
    missing = sorted(k for k in mine if k not in theirs)
    misshaped = sorted(k for k in mine if k in theirs and theirs[k].shape != mine[k].shape)
    if missing or misshaped:
        raise ValueError(f"{where} does not fit this diffusion VLM: missing {missing[:4]}, other shapes "
                         f"{[(k, tuple(theirs[k].shape), tuple(mine[k].shape)) for k in misshaped[:4]]} (the same "
                         "preset and depth are needed)")
    extra = sorted(k for k in theirs if k not in mine and "vision_tower" not in k and not any(a in k for a in AR_ONLY))
    if extra:
        raise ValueError(f"{where} has weights this diffusion VLM has no place for: {extra[:4]}")
    model.load_state_dict({k: theirs[k] for k in mine}, strict=False)
