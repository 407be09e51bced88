"""Training examples and collators for the staged build of a world VLM.

Examples are plain dicts; collators turn a list of them into model inputs with the real tokenizer and
processor. Labels cover only the assistant's answer (and its end-of-sequence token).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .config import WorldConfig
from .render import render
from .scene import Scene
from .texts import (
    CAPTION_PROMPT,
    DESCRIBE_PROMPT,
    caption,
    cell_questions,
    description,
    open_questions,
    yes_no_questions,
)

IGNORE_INDEX = -100


@dataclass
class WorldSamples:
    """Scenes with their rendered images, kept in memory (64x64 RGB images are ~12 KB each)."""

    config: WorldConfig
    scenes: list[Scene]
    images: list[Image.Image]

    @classmethod
    def from_scenes(cls, config: WorldConfig, scenes: list[Scene]) -> WorldSamples:
        return cls(config, scenes, [render(s, config.noise_std) for s in scenes])

    @classmethod
    def from_records(cls, config: WorldConfig, records: list[dict]) -> WorldSamples:
        """From ``read_world`` records (images loaded from their PNG files)."""
        scenes = [Scene.from_dict(r["scene"]) for r in records]
        images = []
        for r in records:
            with Image.open(r["image"]) as im:
                images.append(im.convert("RGB"))
        return cls(config, scenes, images)

    def __len__(self) -> int:
        return len(self.scenes)


def user_message(prompt: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]


@contextmanager
def padding_side(tokenizer, side: str):
    """Pad on ``side`` ("left" for generation, "right" for training) inside the block."""
    old = tokenizer.padding_side
    tokenizer.padding_side = side
    try:
        yield
    finally:
        tokenizer.padding_side = old


def chat_example(processor, prompt: str, answer: str | None = None) -> str:
    """Chat-template text for one turn; with ``answer`` the assistant turn (and eos) is included."""
    msgs = user_message(prompt)
    if answer is None:
        return processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    msgs.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
    return processor.apply_chat_template(msgs, tokenize=False)


# ----------------------------------------------------------------------------- text-only LM


class TextDataset(torch.utils.data.Dataset):
    """Text-only pretraining corpus: descriptions and captions of scenes (the world's language prior)."""

    def __init__(self, samples: WorldSamples):
        self.texts = []
        for s in samples.scenes:
            self.texts += [description(s), caption(s)]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> dict:
        return {"text": self.texts[i]}


@dataclass
class TextCollator:
    tokenizer: object

    def __call__(self, batch: list[dict]) -> dict:
        tok = self.tokenizer
        texts = [f"{tok.bos_token} {b['text']} {tok.eos_token}" for b in batch]
        enc = tok(texts, return_tensors="pt", padding=True)
        labels = enc["input_ids"].clone()
        labels[enc["attention_mask"] == 0] = IGNORE_INDEX
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels}


# ----------------------------------------------------------------------------- vision tower


class VisionDataset(torch.utils.data.Dataset):
    """Images with per-cell targets: shape (0 = empty cell), colour, size, and the scene type."""

    def __init__(self, samples: WorldSamples):
        c = samples.config
        self.samples = samples
        self.rows, self.cols = c.grid
        self.shape_ix = {s: i + 1 for i, s in enumerate(c.shapes)}
        self.colour_ix = {s: i for i, s in enumerate(c.colours)}
        self.size_ix = {s: i for i, s in enumerate(c.sizes)}
        self.scene_ix = {s: i for i, s in enumerate(c.scenes)}

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        s = self.samples.scenes[i]
        cells = self.rows * self.cols
        shape = np.zeros(cells, dtype=np.int64)
        colour = np.full(cells, IGNORE_INDEX, dtype=np.int64)
        size = np.full(cells, IGNORE_INDEX, dtype=np.int64)
        for o in s.objects:
            k = o.row * self.cols + o.col
            shape[k], colour[k], size[k] = self.shape_ix[o.shape], self.colour_ix[o.colour], self.size_ix[o.size]
        return {"image": self.samples.images[i], "shape": shape, "colour": colour, "size": size,
                "scene": self.scene_ix[s.scene]}


@dataclass
class VisionCollator:
    image_processor: object

    def __call__(self, batch: list[dict]) -> dict:
        pix = self.image_processor([b["image"] for b in batch], return_tensors="pt")["pixel_values"]
        out = {"pixel_values": pix}
        for k in ("shape", "colour", "size"):
            out[k] = torch.as_tensor(np.stack([b[k] for b in batch]))
        out["scene"] = torch.tensor([b["scene"] for b in batch])
        return out


# ----------------------------------------------------------------------------- VLM (alignment, instruction)


class VLMDataset(torch.utils.data.Dataset):
    """(image, prompt, answer) triples. ``mix`` picks which tasks each scene contributes:
    "describe", "caption", "yes_no" (the yes and the no question of ``yes_no_categories`` categories
    drawn per scene), "open" (one), "cells" (four "what is at b3 ?" grounding questions).
    ``describe_repeats`` repeats each description: with length-grouped batches every batch holds one
    kind of item, so this sets the share of optimizer steps spent on long descriptions."""

    TASKS = ("describe", "caption", "yes_no", "open", "cells")

    def __init__(self, samples: WorldSamples, mix: tuple[str, ...] = TASKS, seed: int = 0,
                 yes_no_categories: int = 2, describe_repeats: int = 1):
        unknown = set(mix) - set(self.TASKS)
        if unknown:
            raise ValueError(f"unknown tasks {sorted(unknown)}; choose from {self.TASKS}")
        rng = np.random.default_rng(seed)
        self.samples = samples
        self.items: list[tuple[int, str, str]] = []  # (scene index, prompt, answer)
        for i, s in enumerate(samples.scenes):
            if "describe" in mix:
                self.items += [(i, DESCRIBE_PROMPT, description(s))] * describe_repeats
            if "caption" in mix:
                self.items.append((i, CAPTION_PROMPT, caption(s)))
            if "yes_no" in mix:
                qs = yes_no_questions(s, samples.config)
                for cat in rng.choice(len(qs) // 2, size=yes_no_categories, replace=False):
                    for q in qs[2 * cat : 2 * cat + 2]:
                        self.items.append((i, q["question"], q["answer"]))
            if "open" in mix:
                qs = open_questions(s)
                q = qs[int(rng.integers(len(qs)))]
                self.items.append((i, q["question"], q["answer"]))
            if "cells" in mix:
                self.items += [(i, q["question"], q["answer"]) for q in cell_questions(s, samples.config)]
        # approximate text lengths (words) for length-grouped batching; image tokens are the same for all
        self.lengths = [len(p.split()) + len(a.split()) for _, p, a in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        k, prompt, answer = self.items[i]
        return {"image": self.samples.images[k], "prompt": prompt, "answer": answer}


@dataclass
class VLMCollator:
    """Chat-formatted, right-padded batches; labels only on the assistant's answer (and what the chat
    template closes it with: eos here, ``<|im_end|>`` in Qwen's). The answer starts where the prompt
    rendered with ``add_generation_prompt=True`` ends, so any chat template that renders the prompt as
    a prefix of the whole turn works (the world's, Qwen-VL's, LLaVA's); one that does not is an error."""

    processor: object

    def __call__(self, batch: list[dict]) -> dict:
        proc = self.processor
        tok = proc.tokenizer
        images = [b["image"] for b in batch]
        texts = [chat_example(proc, b["prompt"], b["answer"]) for b in batch]
        prompts = [chat_example(proc, b["prompt"]) for b in batch]
        with padding_side(tok, "right"):
            enc = proc(text=texts, images=images, return_tensors="pt", padding=True)
            penc = proc(text=prompts, images=images, return_tensors="pt", padding=True)
        starts = penc["attention_mask"].sum(1)  # [B] prompt tokens per row (right padding)
        ids = enc["input_ids"]  # [B, T]
        for b, n in enumerate(starts.tolist()):
            if n >= int(enc["attention_mask"][b].sum()) or not torch.equal(ids[b, :n], penc["input_ids"][b, :n]):
                raise ValueError(f"row {b}: the chat template does not render the prompt as a prefix of the "
                                 "whole turn; cannot tell the answer's tokens")
        labels = ids.clone()
        labels[torch.arange(ids.shape[1])[None] < starts[:, None]] = IGNORE_INDEX
        labels[enc["attention_mask"] == 0] = IGNORE_INDEX
        enc["labels"] = labels
        return dict(enc)


def answer_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor, tokenizer) -> torch.Tensor:
    """Labels [B, T]: the input ids after the last "assistant :" marker; IGNORE_INDEX elsewhere."""
    marker = tokenizer.convert_tokens_to_ids("assistant")
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    for b in range(input_ids.shape[0]):
        pos = (input_ids[b] == marker).nonzero()
        if len(pos) == 0:
            raise ValueError(f"row {b} has no assistant turn; cannot build labels")
        start = int(pos[-1]) + 2  # skip "assistant" and ":"
        labels[b, start:] = input_ids[b, start:]
    labels[attention_mask == 0] = IGNORE_INDEX
    return labels
