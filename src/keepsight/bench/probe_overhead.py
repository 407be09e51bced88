"""Generation time with ``VisualAttentionProbe`` / without, on a tiny and a mid-size random LLaVA."""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..inference import Pipeline
from ..probes import VisualAttentionProbe
from ..world import generate_scenes, render, world_config
from ..world.models import PRESETS, build_model, preset_processor
from ..world.texts import DESCRIBE_PROMPT
from . import write_result

SIZES = {
    "tiny": PRESETS["tiny-llava"],
    "mid": replace(PRESETS["tiny-llava"], vision_hidden=256, vision_layers=4, text_hidden=512, text_layers=8,
                   text_heads=8, text_kv_heads=4, text_intermediate=1536),
}


def _time_answer(pipe: Pipeline, enc, new_tokens: int, repeats: int, probe: bool) -> float:
    """The best of ``repeats`` wall times of ``pipe.answer`` (the call a user makes) for ``new_tokens`` tokens."""
    kw = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens}
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        with VisualAttentionProbe(pipe.model) if probe else contextlib.nullcontext():
            pipe.answer(enc, kw)
        best = min(best, time.perf_counter() - t0)
    return best


@torch.no_grad()
def run(out: str | Path = "runs/bench", batch: int = 8, new_tokens: int = 128, repeats: int = 3) -> dict:
    processor = preset_processor("tiny-llava")
    cfg = world_config()
    images = [render(s, cfg.noise_std) for s in generate_scenes(cfg, batch, seed=0)]
    rows = []
    for name, preset in SIZES.items():
        model = build_model(preset, processor.tokenizer)
        pipe = Pipeline.from_model(model, processor)
        enc = pipe.encode([pipe.chat_prompt(DESCRIBE_PROMPT, 1)] * batch, [[im] for im in images])
        params = sum(p.numel() for p in model.parameters())
        _time_answer(pipe, enc, 4, 1, False)  # warm-up
        plain = _time_answer(pipe, enc, new_tokens, repeats, False)
        probed = _time_answer(pipe, enc, new_tokens, repeats, True)
        rows.append({"model": name, "params": params, "batch": batch, "new_tokens": new_tokens,
                     "plain_s": plain, "probe_s": probed, "ratio": probed / plain})
    result = {"benchmark": "probe-overhead", "target_ratio": 1.3, "threads": torch.get_num_threads(), "rows": rows}
    print(f"{'model':6s} {'params':>10s} {'plain s':>9s} {'probe s':>9s} {'ratio':>6s}  (target < 1.3)")
    for r in rows:
        print(f"{r['model']:6s} {r['params']:>10,d} {r['plain_s']:9.3f} {r['probe_s']:9.3f} {r['ratio']:6.2f}")
    write_result(out, "probe_overhead", result)
    return result
