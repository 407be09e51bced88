"""Collators: samples -> model inputs with the real tokenizer and processor; labels on the answers only."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .chat import padding_side, render
from .sample import Sample

IGNORE_INDEX = -100


def _has_image(message: dict) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image" for p in content)


def assistant_spans(processor, sample: Sample, n_tokens: int) -> list[tuple[int, int]]:
    """Token spans ``[start, end)`` of every assistant turn of ``sample`` in its full rendering (``n_tokens``
    tokens long, images expanded): from where the template's generation prompt for that turn ends to the
    turn's last token (its end-of-turn token included, whitespace after it not).

    Each turn's start is the length of the conversation before it rendered with ``add_generation_prompt=True``,
    its end the length of the conversation through it; both must render as prefixes of the whole (any chat
    template that renders a conversation turn by turn does: the world's, Qwen-VL's, LLaVA's, LLaMA-3's).
    Lengths come from the tokenizer, plus the tokens the processor adds when it expands the image
    placeholders (all images sit before the first assistant turn in the usual layouts; otherwise each prefix
    goes through the processor with its own images).

    An assistant turn marked ``"context": True`` is left out (text the model reads but is not trained to write,
    as a description that is wrong on purpose)."""
    tok = processor.tokenizer
    full = render(processor, sample.messages).rstrip()
    turns = [i for i, m in enumerate(sample.messages) if m["role"] == "assistant"]
    if not turns:
        raise ValueError(f"sample {sample.id!r} has no assistant turn: nothing to train on")
    if all(sample.messages[i].get("context") for i in turns):
        raise ValueError(f"sample {sample.id!r}: every assistant turn is marked context: nothing to train on")
    first = turns[0]
    images_early = not any(_has_image(m) for m in sample.messages[first:])
    full_ids = tok(full, add_special_tokens=False)["input_ids"]
    offset = n_tokens - len(full_ids)  # the image expansion (and any special tokens the processor adds)

    def length(text: str, upto: int) -> int:
        if images_early:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            if ids != full_ids[: len(ids)]:
                raise ValueError(f"sample {sample.id!r}: the chat template does not render the conversation "
                                 "before an assistant turn as a prefix of the whole; cannot tell the answer's tokens")
            return len(ids) + offset
        images = [im for im, _ in zip(sample.images, range(sum(_has_image(m) for m in sample.messages[:upto])))]
        kw = {"images": [images]} if images else {}  # one row
        return int(processor(text=[text], return_tensors="pt", **kw)["input_ids"].shape[1])

    spans = []
    for i in turns:
        if sample.messages[i].get("context"):
            continue
        start = length(render(processor, sample.messages[:i], add_generation_prompt=True), i)
        end = length(render(processor, sample.messages[: i + 1]).rstrip(), i + 1)
        if not start < end <= n_tokens:
            raise ValueError(f"sample {sample.id!r}: assistant turn {i} has no tokens of its own in the template's "
                             "rendering; cannot tell the answer's tokens")
        spans.append((start, end))
    return spans


def _image_token_id(processor) -> int | None:
    for owner in (processor, processor.tokenizer):
        value = getattr(owner, "image_token_id", None)
        if isinstance(value, int):
            return value
    return None


@dataclass
class VLMCollator:
    """Chat-formatted, right-padded batches of ``Sample``s; labels on every assistant turn (and what the chat
    template closes it with: eos here, ``<|im_end|>`` in Qwen's, ``<|eot_id|>`` in LLaMA-3's), nowhere else
    (system and user turns, images, the template's scaffolding, padding); see ``assistant_spans``.

    ``max_length``: rows are cut to that many tokens (their labels with them), never inside the image tokens:
    a row whose image tokens do not fit, or whose every answer token the cut removes, is an error naming it, or
    (``skip_bad_rows``) left out of its batch and counted in ``skipped``."""

    processor: object
    max_length: int | None = None
    skip_bad_rows: bool = False
    skipped: int = 0

    def __call__(self, batch: list[Sample]) -> dict:
        proc = self.processor
        texts = [render(proc, s.messages).rstrip() for s in batch]
        kw = {"images": [list(s.images) for s in batch]} if any(s.images for s in batch) else {}  # one list per row
        with padding_side(proc.tokenizer, "right"):
            enc = proc(text=texts, return_tensors="pt", padding=True, **kw)
        ids = enc["input_ids"]  # [B, T]
        labels = torch.full_like(ids, IGNORE_INDEX)
        lengths = enc["attention_mask"].sum(1).tolist()  # [B] real tokens per row (right padding)
        for b, sample in enumerate(batch):
            for start, end in assistant_spans(proc, sample, int(lengths[b])):
                labels[b, start:end] = ids[b, start:end]
        enc["labels"] = labels
        if self.max_length is not None and ids.shape[1] > self.max_length:
            return self._cut(batch, dict(enc))
        return dict(enc)

    def _cut(self, batch: list[Sample], enc: dict) -> dict:
        """Rows cut to ``max_length`` tokens; rows whose image tokens reach past it refused or left out."""
        image_id = _image_token_id(self.processor)
        ids, n = enc["input_ids"], self.max_length
        bad = []
        if image_id is not None:
            for b in range(ids.shape[0]):
                where = (ids[b] == image_id).nonzero().flatten()
                if len(where) and int(where[-1]) >= n:
                    bad.append(b)
        labels = enc["labels"]  # [B, T]
        answerless = [b for b in range(ids.shape[0]) if b not in bad and bool((labels[b] != IGNORE_INDEX).any())
                      and not bool((labels[b, :n] != IGNORE_INDEX).any())]
        if answerless and not self.skip_bad_rows:
            names = [batch[b].id or f"row {b} of the batch" for b in answerless]
            raise ValueError(f"samples {names}: --max-length {n} cuts off every answer token (nothing would be "
                             "learned from them); raise it, or pass --skip-bad-rows to leave such rows out")
        if bad and not self.skip_bad_rows:
            names = [batch[b].id or f"row {b} of the batch" for b in bad]
            raise ValueError(f"samples {names}: their image tokens do not fit in --max-length {n}; raise it, or pass "
                             "--skip-bad-rows to leave such rows out")
        bad = sorted(set(bad) | set(answerless))
        if bad:
            self.skipped += len(bad)
            kept = [s for b, s in enumerate(batch) if b not in bad]
            if not kept:
                raise ValueError(f"no sample of the batch fits in --max-length {n}")
            return self(kept)
        return {k: v[:, :n] if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] == ids.shape[1] else v
                for k, v in enc.items()}


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
