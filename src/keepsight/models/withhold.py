"""The image withheld from the language model's sequence: a mechanism control for methods with their own path to the
image (PVM's visual memory).

The image's tokens stay in the sequence (their embeddings are computed as usual, so a method that captures them, as
PVM does from ``inputs_embeds``, still has them), but every position's self-attention leaves them out: the language
model's 2D attention mask is zero at the image positions of the sequence's first forward, on that forward and on every
cached decode step after it. Positions are unchanged (the model's RoPE counts the masked tokens as before). What the
language model then knows of the image comes only through such a method; the base, or a method without its own path
to the image (a LoRA), answers from the text alone.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from .arch import arch_info, starts_sequence

ATTRIBUTE = "_keepsight_withheld"  # the model's hook handles while the image is withheld


class _Withheld:
    def __init__(self, model: nn.Module):
        info = arch_info(model)
        self.visual_ids = torch.tensor(info.visual_token_ids)
        self.visual: torch.Tensor | None = None  # [B, T0] image positions of the sequence's first forward
        self.handles = [model.register_forward_pre_hook(self.top, with_kwargs=True),
                        info.language_model.register_forward_pre_hook(self.lm, with_kwargs=True)]

    def top(self, model, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            raise ValueError("withholding the image needs input_ids to find the image tokens (got inputs_embeds only)")
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        if starts_sequence(cache):
            self.visual = torch.isin(input_ids, self.visual_ids.to(input_ids.device))  # [B, T0]
        elif self.visual is None or self.visual.shape[0] != input_ids.shape[0]:
            raise RuntimeError("withholding the image: a cached decode step whose prefill ran without it")

    def lm(self, lm, args, kwargs):
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise RuntimeError("withholding the image: the language model was called without inputs_embeds")
        mask = kwargs.get("attention_mask")
        b, t = embeds.shape[:2]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = 0 if starts_sequence(cache) else cache.get_seq_length()
        if mask is None:
            mask = torch.ones(b, past + t, dtype=torch.long, device=embeds.device)
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[0] != b:
            raise ValueError("withholding the image needs the language model's 2D attention mask [B, T]; got "
                             f"{type(mask).__name__} {tuple(getattr(mask, 'shape', ()))}")
        n = self.visual.shape[1]
        if mask.shape[1] < n:
            raise RuntimeError(f"withholding the image: attention mask of {mask.shape[1]} positions for a sequence "
                               f"whose first forward had {n}")
        mask = mask.clone()
        mask[:, :n] = mask[:, :n] * (~self.visual).to(mask.dtype)
        kwargs["attention_mask"] = mask
        return args, kwargs

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def withhold_image(model: nn.Module) -> nn.Module:
    """Mask the image's tokens out of the language model's attention from now on (``restore_image`` undoes it)."""
    if getattr(model, ATTRIBUTE, None) is not None:
        raise ValueError("the image is already withheld from this model")
    setattr(model, ATTRIBUTE, _Withheld(model))
    return model


def restore_image(model: nn.Module) -> nn.Module:
    """Undo ``withhold_image``."""
    w = getattr(model, ATTRIBUTE, None)
    if w is None:
        raise ValueError("the image is not withheld from this model")
    w.remove()
    setattr(model, ATTRIBUTE, None)
    return model


@contextmanager
def image_withheld(model: nn.Module):
    """``withhold_image`` inside the block."""
    withhold_image(model)
    try:
        yield model
    finally:
        restore_image(model)
