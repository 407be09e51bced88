"""Collators: samples -> model inputs with the real tokenizer and processor; labels on the answers only."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .chat import padding_side, render, render_prompt
from .sample import Sample

IGNORE_INDEX = -100


@dataclass
class VLMCollator:
    """Chat-formatted, right-padded batches of ``Sample``s; labels only on the assistant's answer (and what the
    chat template closes it with: eos here, ``<|im_end|>`` in Qwen's). The answer starts where the prompt
    rendered with ``add_generation_prompt=True`` ends, so any chat template that renders the prompt as a
    prefix of the whole turn works (the world's, Qwen-VL's, LLaVA's); one that does not is an error."""

    processor: object

    def __call__(self, batch: list[Sample]) -> dict:
        proc = self.processor
        tok = proc.tokenizer
        images = [im for s in batch for im in s.images]
        texts = [render(proc, s.messages) for s in batch]
        prompts = [render_prompt(proc, s) for s in batch]
        kw = {"images": images} if images else {}
        with padding_side(tok, "right"):
            enc = proc(text=texts, return_tensors="pt", padding=True, **kw)
            penc = proc(text=prompts, return_tensors="pt", padding=True, **kw)
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


@dataclass
class TextCollator:
    """Text-only language-model batches (``{"text": ...}`` items): bos + text + eos, labels on every real token."""

    tokenizer: object

    def __call__(self, batch: list[dict]) -> dict:
        tok = self.tokenizer
        texts = [f"{tok.bos_token} {b['text']} {tok.eos_token}" for b in batch]
        enc = tok(texts, return_tensors="pt", padding=True)
        labels = enc["input_ids"].clone()
        labels[enc["attention_mask"] == 0] = IGNORE_INDEX
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels}
