"""Masked-diffusion training of a LLaDA-V-style VLM (transformers' Trainer: progress, checkpoints, resume;
runs under ``accelerate launch``).

Each example is the chat prompt (with the image) followed by exactly ``answer_length`` answer slots: the
answer's tokens, then end-of-sequence tokens filling the rest (as LLaDA's SFT does, so the model learns
where an answer ends inside a fixed generation window); answers longer than the window are cut. Per
example a mask ratio t ~ U(eps, 1] is drawn, each answer slot is replaced by the mask token with
probability t, and the loss is the cross-entropy at masked slots weighted by 1/t, summed and divided by
the number of answer slots. The prompt is never masked. The vision tower is frozen; the language model
and the projector train.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..checks import number
from ..data import IGNORE_INDEX, Sample, render_prompt
from ..fingerprint import data_fingerprint, dir_fingerprint
from ..models.arch import arch_spec, check_length, is_tower_parameter
from .recipe import Recipe, run_recipe
from .trainer import TrainOptions

SUMMARY_FILE = "diffusion_train.json"


@dataclass(kw_only=True)
class DiffusionTrainConfig(TrainOptions):
    steps: int = 2500
    lr: float = 2e-3
    batch_size: int = 16
    answer_length: int = 64  # generation window: answers cut / filled with eos to this many slots
    eps: float = 1e-3  # t ~ U(eps, 1]
    save_every: int = 250

    def __post_init__(self) -> None:
        super().__post_init__()
        self.answer_length = number("answer_length", self.answer_length, 1, integer=True)
        number("eps", self.eps, 0.0, 1.0, open_low=True, open_high=True)


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

    def __call__(self, batch: list[Sample]) -> dict:
        proc, tok = self.processor, self.processor.tokenizer
        enc = proc(text=[render_prompt(proc, b) for b in batch], images=[im for b in batch for im in b.images],
                   return_tensors="pt", padding=True, padding_side="left")
        prompt_len = enc["attention_mask"].sum(1)  # [B]
        rows, labels = [], []
        for i, b in enumerate(batch):
            p = enc["input_ids"][i, enc["input_ids"].shape[1] - int(prompt_len[i]):]  # [P_i] without padding
            a = torch.tensor(self.answer_ids(b.answer))  # [L]
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


class DiffusionRecipe(Recipe):
    """``init() -> (model, processor)``: the LLaDA-V-style VLM to train (every parameter but the vision tower)."""

    summary_file = SUMMARY_FILE
    marker_file = "config.json"
    kind = "diffusion-model"

    def __init__(self, init: Callable, dataset, options: DiffusionTrainConfig, source: str = "",
                 language_model_from: str = ""):
        super().__init__(options)
        self.init, self.data, self.source, self.lm_source = init, dataset, source, language_model_from
        self.objective: MaskedDiffusionObjective | None = None

    def request(self) -> dict:
        out = {"base": dir_fingerprint(self.source) if self.source else None, "data": data_fingerprint(self.data)}
        if self.lm_source:  # the autoregressive model the language model started from (llada_v_init)
            out["language_model_from"] = dir_fingerprint(self.lm_source)
        return out

    def load(self):
        model, processor = self.init()
        self.spec = arch_spec(model)
        check_length(model, self.options.answer_length, "answer_length")
        self.objective = MaskedDiffusionObjective(model, processor.tokenizer.mask_token_id, self.options.eps)
        return model, processor

    def trainable(self, name: str) -> bool:
        return not is_tower_parameter(self.spec, name)

    def trainer_module(self, model):
        return self.objective

    def dataset(self, processor):
        return self.data

    def collator(self, processor):
        return DiffusionCollator(processor, self.options.answer_length)

    def summarise(self, model, processor, logs):
        return {"base": self.source}


def train_diffusion(init: Callable, dataset, out: str | os.PathLike, cfg: DiffusionTrainConfig | None = None,
                    stop_after: int | None = None, progress: bool = True, grad_accum: int = 1,
                    source: str = "", overwrite: bool = False, language_model_from: str = "") -> dict | None:
    """Train the VLM ``init()`` returns on ``dataset`` (``Sample``s); model + processor land in ``out``
    (atomically), with ``diffusion_train.json`` (``source`` recorded as its ``base``; ``language_model_from``, the
    autoregressive model whose language model ``init`` started from, recorded beside it). Returns the summary, or
    None when ``stop_after`` ended the run early. ``cfg.batch_size`` is the global batch (see
    ``run_trainer``); only the main process writes."""
    recipe = DiffusionRecipe(init, dataset, cfg or DiffusionTrainConfig(), source, language_model_from)
    return run_recipe(recipe, out, stop_after, progress, grad_accum, overwrite)
