"""Tiny checkpoint directories for the tests: random tiny VLMs saved the way real Hugging Face checkpoints
are (weights, config, tokenizer, image processor, chat template), read back through keepsight's loader."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2VLImageProcessorPil

from keepsight.models import load_checkpoint
from keepsight.world.models import build_llada_v, build_model, get_preset, preset_processor
from keepsight.world.processor import CHAT_TEMPLATE, build_processor

QWEN_CHAT_TEMPLATE_IMAGE = " <vision_start> <image> <vision_end>"  # what Qwen-VL templates write per image


def save_tiny_checkpoint(preset: str, out_dir, seed: int = 0):
    """Write a tiny random VLM directory laid out like a real Hugging Face checkpoint (weights, config,
    tokenizer, image processor, chat template), for tests of the loaders: presets ``tiny-llava``,
    ``tiny-qwen3vl``, ``tiny-qwen25vl``, and ``tiny-llada-v`` (a LLaDA-V-style masked-diffusion VLM).
    Qwen directories hold a Qwen2-VL image processor and a template that brackets the image token with
    vision start / end markers, as Qwen's do; no video processor (it needs torchvision)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if preset == "tiny-llada-v":
        processor = build_processor()
        model = build_llada_v(processor, seed=seed)
        model.save_pretrained(out)
        processor.save_pretrained(out)
        return out
    p = get_preset(preset)
    torch.manual_seed(seed)
    if p.arch == "llava":
        processor = preset_processor(p)
        build_model(p, processor.tokenizer, seed=seed).save_pretrained(out)
        processor.save_pretrained(out)
        return out
    tok = build_processor().tokenizer
    tok.chat_template = CHAT_TEMPLATE.replace(" <image>", QWEN_CHAT_TEMPLATE_IMAGE)
    side = p.image_size
    ip = Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side, patch_size=p.patch_size,
                                  merge_size=2, temporal_patch_size=2)
    build_model(p, tok, seed=seed).save_pretrained(out)
    tok.save_pretrained(out)
    ip.save_pretrained(out)
    return out


def load_vlm(path):
    """A saved model and its processor as the training commands load them (CPU, the saved dtype)."""
    return load_checkpoint(path, dtype=None, device="cpu")
