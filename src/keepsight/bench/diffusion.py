"""``keepsight bench diffusion``: LLaDA-style sampler latency with and without MPS + MRS, for T in
{8, 16, 32, 64} steps, on a random mid-size LLaDA-V-shaped model (width 512, 8 layers; 64 new tokens,
batch 8). Target: overhead at most 3%."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from ..data import chat_example
from ..diffusion import MaskPriorSuppression, MonotonicRoPEScaling, generate
from ..world import generate as world_scenes
from ..world import render, world_config
from ..world.models import PRESETS, build_llada_v
from ..world.processor import build_processor
from ..world.texts import DESCRIBE_PROMPT
from . import best_time, write_result


@torch.inference_mode()
def run(out: str | Path = "runs/bench", steps_grid=(8, 16, 32, 64), batch: int = 8, gen_length: int = 64,
        repeats: int = 3) -> dict:
    processor = build_processor()
    preset = replace(PRESETS["tiny-llava"], text_hidden=512, text_layers=8, text_heads=8, text_kv_heads=4,
                     text_intermediate=1536)
    model = build_llada_v(processor, preset)
    cfg = world_config()
    images = [render(s, cfg.noise_std) for s in world_scenes(cfg, batch, seed=0)]
    enc = processor(text=[chat_example(processor, DESCRIBE_PROMPT)] * batch, images=images, return_tensors="pt")
    mps = MaskPriorSuppression().fit(model, processor.tokenizer)  # the papers' settings (MPSConfig / MRSConfig)
    mrs = MonotonicRoPEScaling()

    def sample(steps: int, fixes: bool) -> None:
        if fixes:
            with mps.apply(model), mrs.apply(model):
                generate(model, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], gen_length=gen_length,
                         steps=steps)
        else:
            generate(model, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], gen_length=gen_length,
                     steps=steps)

    sample(2, True)  # warm-up
    rows = []
    for steps in steps_grid:
        plain = best_time(lambda s=steps: sample(s, False), repeats)
        fixed = best_time(lambda s=steps: sample(s, True), repeats)
        rows.append({"steps": steps, "plain_s": plain, "mps_mrs_s": fixed, "overhead": fixed / plain - 1})
    print(f"{'T':>4s} {'plain s':>9s} {'MPS+MRS s':>10s} {'overhead':>9s}  (target <= 3%)")
    for r in rows:
        print(f"{r['steps']:>4d} {r['plain_s']:9.3f} {r['mps_mrs_s']:10.3f} {100 * r['overhead']:8.1f}%")
    result = {"benchmark": "diffusion", "batch": batch, "gen_length": gen_length, "width": 512, "layers": 8,
              "threads": torch.get_num_threads(), "target_overhead": 0.03, "rows": rows}
    write_result(out, "diffusion", result)
    return result
