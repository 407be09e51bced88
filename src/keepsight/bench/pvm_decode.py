"""Per-token cached decode time with and without PVM on a mid-size random Qwen3-VL-shaped model at batch 1, 4
and 8, and the FLOPs of one decode token at Qwen3-VL-8B's shape with and without projecting V once."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import Qwen2VLImageProcessorPil

from ..pvm import PVMConfig, attach_pvm, detach_pvm, pvm_disabled
from ..world.models import PRESETS, build_model, qwen3vl_inputs
from ..world.processor import build_tokenizer
from . import write_result

MID = replace(PRESETS["tiny-qwen3vl"], image_size=256, text_hidden=512, text_layers=12, text_heads=8,
              text_kv_heads=4, text_intermediate=1536)  # 256 visual tokens after the 2x2 merge


# Qwen3-VL-8B's text model (config.json of Qwen/Qwen3-VL-8B-Instruct) and the paper's PVM: 3 layers, d' = 1024
Q3VL_8B = {"layers": 36, "hidden": 4096, "intermediate": 12288, "heads": 32, "kv_heads": 8, "head_dim": 128,
           "vocab": 151936}


def decode_flops(m: dict, context: int) -> float:
    """Multiply-add FLOPs (2 per MAC) of one cached decode token of a dense decoder: every linear layer once, plus
    the attention scores and values over ``context`` cached positions."""
    d, hd = m["hidden"], m["head_dim"]
    attn_proj = d * m["heads"] * hd * 2 + d * m["kv_heads"] * hd * 2  # q, o; k, v
    mlp = 3 * d * m["intermediate"]
    linear = m["layers"] * (attn_proj + mlp) + d * m["vocab"]
    attention = m["layers"] * 2 * context * m["heads"] * hd  # q.k and weights.v
    return 2.0 * (linear + attention)


def pvm_flops(d: int, latent: int, visual: int, layers: int, projected_once: bool) -> float:
    """FLOPs of the PVM branches for one decode token: W_down x, the scores and the weighted sum over M visual
    tokens, W_up; plus W_down V over all M tokens when the projection is recomputed every step."""
    per_layer = d * latent + latent * visual * 2 + latent * d
    if not projected_once:
        per_layer += visual * d * latent
    return 2.0 * layers * per_layer


def _per_token(model, inputs, new_tokens: int) -> float:
    """Seconds per generated token, prefill excluded: (t(N) - t(1)) / (N - 1)."""

    def gen(n: int) -> float:
        t0 = time.perf_counter()
        model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - t0

    return (gen(new_tokens) - gen(1)) / (new_tokens - 1)


@torch.no_grad()
def run(out: str | Path = "runs/bench", batches=(1, 4, 8), new_tokens: int = 64, repeats: int = 9) -> dict:
    """For each batch size, ``repeats`` interleaved pairs (plain, then PVM, on the same inputs): the overhead is
    the median of the pairs' ratios (single-shot ratios swing by +-10% on shared cores)."""
    if new_tokens < 2:
        raise ValueError(f"--new-tokens {new_tokens}: the decode time is measured over new_tokens - 1 cached steps; "
                         "give at least 2")
    batches = (batches,) if isinstance(batches, int) else tuple(batches)
    tok = build_tokenizer()
    model = build_model(MID, tok)
    ip = Qwen2VLImageProcessorPil(min_pixels=MID.image_size**2, max_pixels=MID.image_size**2,
                                  patch_size=MID.patch_size, merge_size=2)
    rng = np.random.default_rng(0)
    attach_pvm(model, PVMConfig())
    with torch.no_grad():
        for branch in model.pvm.values():
            branch.gate.fill_(0.1)
    layers = model._keepsight_pvm.layers
    rows = []
    for batch in batches:
        images = [Image.fromarray(rng.integers(0, 255, (MID.image_size, MID.image_size, 3), dtype=np.uint8))
                  for _ in range(batch)]
        inputs = qwen3vl_inputs(ip, tok, ["<bos>user : <image> describe the image in detail . assistant :"] * batch,
                                images)
        n_visual = int((inputs["input_ids"][0] == tok.image_token_id).sum())
        with pvm_disabled(model):
            _per_token(model, inputs, 4)  # warm-up
        _per_token(model, inputs, 4)
        plain, pvm = [], []
        for _ in range(repeats):
            with pvm_disabled(model):
                plain.append(_per_token(model, inputs, new_tokens))
            pvm.append(_per_token(model, inputs, new_tokens))
        ratios = sorted(b / a - 1 for a, b in zip(plain, pvm))
        rows.append({"batch": batch, "plain_ms_per_token": statistics.median(plain) * 1e3,
                     "pvm_ms_per_token": statistics.median(pvm) * 1e3, "overhead": statistics.median(ratios),
                     "overhead_quartiles": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]]})
    detach_pvm(model)
    big = {"base": decode_flops(Q3VL_8B, context=2000),
           "pvm_projected_once": pvm_flops(4096, 1024, 1000, 3, True),
           "pvm_projected_every_step": pvm_flops(4096, 1024, 1000, 3, False)}
    result = {"benchmark": "pvm-decode", "target_overhead": 0.05, "width": MID.text_hidden,
              "layers": MID.text_layers, "visual_tokens": n_visual, "pvm_layers": layers, "new_tokens": new_tokens,
              "repeats": repeats, "threads": torch.get_num_threads(), "rows": rows,
              "flops_8b_shape": {"context": 2000, "visual_tokens": 1000, "latent": 1024, "pvm_layers": 3, **big}}
    print(f"Qwen3-VL-shaped, width {MID.text_hidden}, {MID.text_layers} layers, {n_visual} visual tokens, "
          f"PVM on layers {layers}; median of {repeats} interleaved pairs")
    print(f"{'batch':>5s} {'base ms/tok':>12s} {'PVM ms/tok':>11s} {'overhead':>9s}  (target <= 5%)")
    for r in rows:
        print(f"{r['batch']:5d} {r['plain_ms_per_token']:12.2f} {r['pvm_ms_per_token']:11.2f} {r['overhead']:+9.1%}")
    print(f"FLOPs per decode token at the Qwen3-VL-8B shape (context 2,000, 1,000 visual tokens, 3 PVM layers, "
          f"d' 1024): base {big['base'] / 1e9:.1f} G; PVM {big['pvm_projected_once'] / 1e9:.3f} G with V projected "
          f"once ({big['pvm_projected_once'] / big['base']:.2%}), {big['pvm_projected_every_step'] / 1e9:.1f} G "
          "projected every step")
    write_result(out, "pvm_decode", result)
    return result
