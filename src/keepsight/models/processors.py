"""Image-only processor for Qwen-VL checkpoints where the real one cannot be built.

``Qwen3VLProcessor`` / ``Qwen2_5_VLProcessor`` also build a video processor, which needs torchvision;
``QwenImageProcessor`` does what they do for images, with the same call signature (the architecture table
names it as the Qwen rows' processor fallback).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import AutoImageProcessor, AutoTokenizer, BatchFeature


class QwenImageProcessor:
    """Qwen-VL's processor for images only (what ``Qwen3VLProcessor`` / ``Qwen2_5_VLProcessor`` do for
    images, without their torchvision-backed video half): each image token in the text (the chat template
    writes one per image, between the vision start / end markers) becomes ``grid_t * grid_h * grid_w /
    merge_size**2`` copies; ``mm_token_type_ids`` marks them with 1 (transformers 5 needs it)."""

    def __init__(self, image_processor, tokenizer, image_token: str, chat_template: str | None = None):
        self.image_processor, self.tokenizer, self.image_token = image_processor, tokenizer, image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        self.merge = int(getattr(image_processor, "merge_size", 2))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> QwenImageProcessor:
        path = Path(path)
        raw = json.loads((path / "config.json").read_text())
        tok = AutoTokenizer.from_pretrained(path)
        image_token_id = raw.get("image_token_id", raw.get("image_token_index"))
        if image_token_id is None:
            raise ValueError(f"{path}/config.json names no image_token_id")
        template = None
        jinja = path / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text()
        elif (path / "chat_template.json").is_file():
            template = json.loads((path / "chat_template.json").read_text()).get("chat_template")
        try:
            image_processor = AutoImageProcessor.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path} has no image processor config (preprocessor_config.json): {e}") from e
        return cls(image_processor, tok, tok.convert_ids_to_tokens(int(image_token_id)), template)

    def apply_chat_template(self, messages, **kwargs):
        kwargs.setdefault("chat_template", self.chat_template)
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def __call__(self, text=None, images=None, return_tensors="pt", padding=False, **kwargs):
        texts = [text] if isinstance(text, str) else list(text)
        out = {}
        if images:
            pix = self.image_processor(images=images, return_tensors="pt")
            grid = pix["image_grid_thw"]  # [n_images, 3]
            k, expanded = 0, []
            for t in texts:
                parts = t.split(self.image_token)
                s = parts[0]
                for rest in parts[1:]:
                    if k >= len(grid):
                        raise ValueError(f"more image tokens in the text than images ({len(grid)})")
                    s += self.image_token * (int(grid[k].prod()) // self.merge**2) + rest
                    k += 1
                expanded.append(s)
            if k != len(grid):
                raise ValueError(f"{k} image tokens in the text but {len(grid)} images")
            texts = expanded
            out.update(pixel_values=pix["pixel_values"], image_grid_thw=grid)
        enc = self.tokenizer(texts, return_tensors=return_tensors, padding=padding, **kwargs)
        enc["mm_token_type_ids"] = (enc["input_ids"] == self.image_token_id).long()
        return BatchFeature({**enc, **out})

    def batch_decode(self, *args, **kwargs):
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.tokenizer.decode(*args, **kwargs)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write what ``from_pretrained`` reads back: the tokenizer, the image processor config and the chat
        template (the model's ``config.json``, with its image token id, is the model's to write)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)
        if self.chat_template:
            (path / "chat_template.jinja").write_text(self.chat_template)
