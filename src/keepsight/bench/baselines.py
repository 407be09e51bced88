"""``keepsight bench baselines``: generation time per token of each training-free baseline (``keepsight.baselines``)
relative to the plain model, as the median of interleaved A/B pairs on the same inputs, on the tiny LLaVA preset and
a mid-size one (text width 512, 8 layers). By design VCD and PAI's text-only subtraction run a second stream, about
one extra cached forward per token (a design cost of ~2x); MemVR and DeCo add LogitLens reads; OPERA is timed against
plain beam search with the same 5 beams, its design cost one forward for the beams plus one per candidate (6x). The
table reports each ratio next to its design cost (goal: within 10% of it).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..inference import Pipeline
from ..world import generate_scenes as world_scenes
from ..world import render, world_config
from ..world.models import PRESETS, build_model, preset_processor
from ..world.texts import DESCRIBE_PROMPT
from . import write_result

# method -> (settings, the design cost in plain forwards per token, decoding settings for both arms)
METHODS = {"vcd": ({}, 2.0, {}), "pai": ({}, 2.0, {}), "pai (attention only)": ({"gamma": 0.0, "beta": 0.0}, 1.0, {}),
           "memvr": ({"threshold": 0.0}, 1.0, {}), "deco": ({}, 1.0, {}),
           # against plain beam search with the same 5 beams: one forward for the beams plus one per candidate (5)
           "opera": ({}, 6.0, {"num_beams": 5})}
SIZES = {"tiny": {}, "mid": {"text_hidden": 512, "text_layers": 8, "text_heads": 8, "text_kv_heads": 4,
                             "text_intermediate": 1536}}


def _timed(pipe: Pipeline, enc, gen_kwargs: dict) -> float:
    """Wall seconds of ``pipe.answer(enc, gen_kwargs)``."""
    t0 = time.perf_counter()
    pipe.answer(enc, gen_kwargs)
    return time.perf_counter() - t0


MAX_NEW_TOKENS = 64  # new tokens a description: the default and the most this benchmark takes (more is refused)


@torch.inference_mode()
def run(out: str | Path = "runs/bench", batch: int = 4, new_tokens: int = MAX_NEW_TOKENS, pairs: int = 9) -> dict:
    if not 1 <= new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"--new-tokens {new_tokens}: bench baselines measures at most {MAX_NEW_TOKENS} new tokens")
    cfg = world_config()
    images = [render(s, cfg.noise_std) for s in world_scenes(cfg, batch, seed=0)]
    rows = []
    for size, change in SIZES.items():
        preset = replace(PRESETS["tiny-llava"], **change)
        processor = preset_processor(preset)
        model = build_model(preset, processor.tokenizer, seed=0).eval()
        # the call a user makes: Pipeline.answer on an encoded batch, with and without the baseline
        plain = Pipeline.from_model(model, processor)
        enc = plain.encode([plain.chat_prompt(DESCRIBE_PROMPT, 1)] * batch, [[im] for im in images])
        kw = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens}

        plain.answer(enc, kw)  # warm-up
        for name, (settings, design, extra) in METHODS.items():
            method_name = name.split(" ")[0]  # "pai (attention only)" -> pai
            arm = Pipeline.from_model(model, processor, baseline=method_name, baseline_args=settings)
            k_arm = {**kw, **extra}
            arm.answer(enc, k_arm)
            ta, tb = [], []
            for _ in range(pairs):
                ta.append(_timed(plain, enc, k_arm))
                tb.append(_timed(arm, enc, k_arm))
            ratio = statistics.median(b / a for a, b in zip(ta, tb))
            rows.append({"size": size, "method": name, "ratio": ratio, "design": design,
                         "ms_per_token_plain": 1000 * statistics.median(ta) / new_tokens,
                         "ms_per_token": 1000 * statistics.median(tb) / new_tokens,
                         "within_10pct_of_design": ratio <= 1.1 * design, "stats": arm.baseline_stats()})
    print(f"{'size':<6}{'method':<22}{'ms/token plain':>15}{'ms/token':>10}{'ratio':>8}{'design':>8}")
    for r in rows:
        print(f"{r['size']:<6}{r['method']:<22}{r['ms_per_token_plain']:>15.2f}{r['ms_per_token']:>10.2f}"
              f"{r['ratio']:>8.2f}{r['design']:>8.1f}")
    result = {"benchmark": "baselines", "batch": batch, "new_tokens": new_tokens, "pairs": pairs,
              "threads": torch.get_num_threads(), "rows": rows}
    write_result(out, "baselines", result)
    return result
