"""``keepsight diffusion train``: a tiny LLaDA-V-style VLM trained on the world with the masked-diffusion
objective (transformers' Trainer: progress, checkpoints, resume; runs under ``accelerate launch``).

Each example is the chat prompt (with the image) followed by exactly ``answer_length`` answer slots: the
answer's tokens, then end-of-sequence tokens filling the rest (as LLaDA's SFT does, so the model learns
where an answer ends inside a fixed generation window); answers longer than the window are cut. Per
example a mask ratio t ~ U(eps, 1] is drawn, each answer slot is replaced by the mask token with
probability t, and the loss is the cross-entropy at masked slots weighted by 1/t, summed and divided by
the number of answer slots. The prompt is never masked. The vision tower comes from the world base's
``vision`` stage (frozen); the Llada language model and the projector train from scratch.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..atomic import write_json
from ..world.data import IGNORE_INDEX, VLMDataset, WorldSamples, chat_example
from ..world.distributed import batch_layout, gather_state_dict, main_process_writes
from ..world.train import StageConfig, atomic_save_dir, run_trainer

SUMMARY_FILE = "diffusion_train.json"


@dataclass
class DiffusionTrainConfig:
    steps: int = 2500
    lr: float = 2e-3
    batch_size: int = 16
    answer_length: int = 64  # generation window: answers cut / filled with eos to this many slots
    eps: float = 1e-3  # t ~ U(eps, 1]
    tasks: tuple[str, ...] = ("describe",)  # VLMDataset tasks; the demo's analyses use descriptions only
    describe_repeats: int = 1  # repeats of each description among the training items
    seed: int = 0
    save_every: int = 250

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "answer_length", "save_every", "describe_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        self.tasks = tuple(self.tasks)
        bad = set(self.tasks) - set(VLMDataset.TASKS)
        if bad or not self.tasks:
            raise ValueError(f"tasks: unknown {sorted(bad)}; choose from {VLMDataset.TASKS}" if bad else "tasks: empty")
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {self.eps}")


@dataclass
class DiffusionCollator:
    """Right-padded batches: prompt ids (image tokens expanded) + ``answer_length`` answer slots; labels
    are the answer slots' ids (eos fill included), IGNORE_INDEX on the prompt and padding."""

    processor: object
    answer_length: int

    def answer_ids(self, answer: str) -> list[int]:
        tok = self.processor.tokenizer
        ids = tok(answer, add_special_tokens=False)["input_ids"][: self.answer_length]
        return ids + [tok.eos_token_id] * (self.answer_length - len(ids))

    def __call__(self, batch: list[dict]) -> dict:
        proc, tok = self.processor, self.processor.tokenizer
        enc = proc(text=[chat_example(proc, b["prompt"]) for b in batch], images=[b["image"] for b in batch],
                   return_tensors="pt", padding=True, padding_side="left")
        prompt_len = enc["attention_mask"].sum(1)  # [B]
        rows, labels = [], []
        for i, b in enumerate(batch):
            p = enc["input_ids"][i, enc["input_ids"].shape[1] - int(prompt_len[i]):]  # [P_i] without padding
            a = torch.tensor(self.answer_ids(b["answer"]))  # [L]
            rows.append(torch.cat([p, a]))
            labels.append(torch.cat([torch.full_like(p, IGNORE_INDEX), a]))
        T = max(len(r) for r in rows)
        ids = torch.full((len(rows), T), tok.pad_token_id)  # [B, T], right padding
        lab = torch.full((len(rows), T), IGNORE_INDEX)
        mask = torch.zeros(len(rows), T, dtype=torch.long)
        for i, (r, y) in enumerate(zip(rows, labels)):
            ids[i, : len(r)], lab[i, : len(r)], mask[i, : len(r)] = r, y, 1
        return {"input_ids": ids, "attention_mask": mask, "pixel_values": enc["pixel_values"], "labels": lab}


class MaskedDiffusionObjective(nn.Module):
    """Wraps a Llada VLM for the Trainer: masks answer slots at a random ratio t and returns the 1/t-weighted
    masked cross-entropy (see the module docstring)."""

    def __init__(self, model: nn.Module, mask_token_id: int, eps: float = 1e-3):
        super().__init__()
        self.model, self.mask_token_id, self.eps = model, mask_token_id, eps

    def forward(self, input_ids, attention_mask, pixel_values, labels):
        answer = labels != IGNORE_INDEX  # [B, T]
        B, T = input_ids.shape
        t = self.eps + (1 - self.eps) * torch.rand(B, device=input_ids.device)  # [B]
        masked = answer & (torch.rand(B, T, device=input_ids.device) < t[:, None])  # [B, T]
        noisy = torch.where(masked, torch.full_like(input_ids, self.mask_token_id), input_ids)
        logits = self.model(input_ids=noisy, attention_mask=attention_mask, pixel_values=pixel_values).logits
        ce = nn.functional.cross_entropy(logits[masked].float(), input_ids[masked], reduction="none")  # [n_masked]
        weight = (1.0 / t)[:, None].expand(B, T)[masked]  # [n_masked]
        return {"loss": (ce * weight).sum() / answer.sum().clamp(min=1)}


def build_world_llada_v(base_dir: str | os.PathLike, seed: int = 0):
    """A tiny LLaDA-V-style VLM whose vision tower is the world base's pretrained one (stage ``vision``)."""
    from transformers import CLIPVisionModel

    from ..diffusion import build_llada_v
    from ..world.models import get_preset, preset_processor
    from ..world.train import TrainConfig

    base_dir = Path(base_dir)
    tower_dir = base_dir / "stages" / "vision"
    if not (tower_dir / "config.json").is_file():
        raise FileNotFoundError(f"{base_dir} has no finished vision stage ({tower_dir}); train the base first")
    tc = TrainConfig(**json.loads((base_dir / "train_config.json").read_text()))
    processor = preset_processor(get_preset(tc.preset))
    model = build_llada_v(processor, tc.preset, seed=seed)
    model.model.vision_tower.load_state_dict(CLIPVisionModel.from_pretrained(tower_dir).state_dict())
    return model, processor


def train_diffusion(base_dir: str | os.PathLike, samples: WorldSamples, out: str | os.PathLike,
                    cfg: DiffusionTrainConfig | None = None, stop_after: int | None = None,
                    progress: bool = True, grad_accum: int = 1) -> dict | None:
    """Train the world's diffusion VLM; model + processor land in ``out`` (atomically), with
    ``diffusion_train.json``. Returns the summary, or None when ``stop_after`` ended the run early.
    ``cfg.batch_size`` is the global batch (see ``run_trainer``); only the main process writes."""
    out = Path(out)
    if (out / SUMMARY_FILE).is_file() and (out / "config.json").is_file():
        return json.loads((out / SUMMARY_FILE).read_text())
    cfg = cfg or DiffusionTrainConfig()
    model, processor = build_world_llada_v(base_dir, cfg.seed)
    for name, p in model.named_parameters():
        p.requires_grad = "vision_tower" not in name
    wrapper = MaskedDiffusionObjective(model, processor.tokenizer.mask_token_id, cfg.eps).train()
    data = VLMDataset(samples, cfg.tasks, cfg.seed, describe_repeats=cfg.describe_repeats)
    logs, step = run_trainer(wrapper, data, DiffusionCollator(processor, cfg.answer_length),
                             StageConfig(cfg.steps, cfg.lr, cfg.batch_size), out / "checkpoints", cfg.seed,
                             cfg.save_every, stop_after, progress, grad_accum=grad_accum)
    if step < cfg.steps:
        return None
    losses = [h["loss"] for h in logs if "loss" in h]
    summary = {"base": str(base_dir), "train": asdict(cfg), "batch_layout": batch_layout(cfg.batch_size, grad_accum),
               "first_loss": losses[0] if losses else None,
               "last_loss": losses[-1] if losses else None, "log_history": logs}
    model.eval()

    sd = gather_state_dict(wrapper, "model.")  # None unless FSDP-sharded (the Trainer wrapped ``wrapper``)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=sd)
        processor.save_pretrained(tmp)
        write_json(tmp / SUMMARY_FILE, summary)

    main_process_writes(atomic_save_dir, out, write)
    return summary
