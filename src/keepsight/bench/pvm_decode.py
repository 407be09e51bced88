"""Per-token cached decode time with and without PVM on a mid-size random Qwen3-VL-shaped model."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import Qwen2VLImageProcessorPil

from ..pvm import PVMConfig, attach_pvm, detach_pvm
from ..world.models import PRESETS, build_model, qwen3vl_inputs
from ..world.processor import build_tokenizer
from . import write_result

MID = replace(PRESETS["tiny-qwen3vl"], image_size=256, text_hidden=512, text_layers=12, text_heads=8,
              text_kv_heads=4, text_intermediate=1536)  # 256 visual tokens after the 2x2 merge


def _decode_time(model, inputs, new_tokens: int, repeats: int) -> float:
    """Seconds per generated token, prefill excluded: (t(N) - t(1)) / (N - 1), best of ``repeats``."""

    def gen(n: int) -> float:
        t0 = time.perf_counter()
        model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - t0

    best = float("inf")
    for _ in range(repeats):
        best = min(best, (gen(new_tokens) - gen(1)) / (new_tokens - 1))
    return best


@torch.no_grad()
def run(out: str | Path = "runs/bench", batch: int = 4, new_tokens: int = 64, repeats: int = 3) -> dict:
    if new_tokens < 2:
        raise ValueError(f"--new-tokens {new_tokens}: the decode time is measured over new_tokens - 1 cached steps; "
                         "give at least 2")
    tok = build_tokenizer()
    model = build_model(MID, tok)
    ip = Qwen2VLImageProcessorPil(min_pixels=MID.image_size**2, max_pixels=MID.image_size**2,
                                  patch_size=MID.patch_size, merge_size=2)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (MID.image_size, MID.image_size, 3), dtype=np.uint8))
              for _ in range(batch)]
    inputs = qwen3vl_inputs(ip, tok, ["<bos>user : <image> describe the image in detail . assistant :"] * batch,
                            images)
    n_visual = int((inputs["input_ids"][0] == tok.image_token_id).sum())
    _decode_time(model, inputs, 4, 1)  # warm-up
    plain = _decode_time(model, inputs, new_tokens, repeats)
    attach_pvm(model, PVMConfig())
    with torch.no_grad():
        for branch in model.pvm.values():
            branch.gate.fill_(0.1)
    layers = model._keepsight_pvm.layers
    pvm = _decode_time(model, inputs, new_tokens, repeats)
    detach_pvm(model)
    result = {"benchmark": "pvm-decode", "target_overhead": 0.05, "width": MID.text_hidden,
              "layers": MID.text_layers, "visual_tokens": n_visual, "pvm_layers": layers, "batch": batch,
              "new_tokens": new_tokens, "threads": torch.get_num_threads(), "plain_ms_per_token": plain * 1e3,
              "pvm_ms_per_token": pvm * 1e3, "overhead": pvm / plain - 1}
    print(f"Qwen3-VL-shaped, width {MID.text_hidden}, {MID.text_layers} layers, {n_visual} visual tokens, "
          f"PVM on layers {layers}, batch {batch}")
    print(f"{'':8s} {'ms/token':>9s}")
    print(f"{'base':8s} {plain * 1e3:9.2f}")
    print(f"{'+ PVM':8s} {pvm * 1e3:9.2f}   overhead {result['overhead']:+.1%} (target <= 5%)")
    write_result(out, "pvm_decode", result)
    return result
