"""``keepsight bench diffusion``: the LLaDA-style sampler on a random mid-size LLaDA-V-shaped model (width 512, 8
layers), for T in {8, 16, 32, 64} steps: plain, prefix-cached, dual-cached and dual-cached + confidence threshold,
each with and without MPS + MRS (the papers' settings).

Per (T, sampler): model forwards and positions run per answer (the FLOPs proxy: model FLOPs scale with the
positions a forward runs), and time per answer. Each time ratio (MPS + MRS on vs off; a cached sampler vs the
plain one) is the median of ``pairs`` interleaved A/B pairs on the same inputs (single-shot ratios swing by
-10% .. +18% on shared cores). Beside the timings, the deterministic figure: the extra FLOPs of MPS and MRS per
forward against the model's. Goals: MPS + MRS overhead <= 3%; the cached sampler >= 2x fewer model FLOPs per
answer at T = 32 (its recall against the plain sampler is in the demo's diffusion section, on a trained model).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..inference import Pipeline
from ..metrics.stats import median_ci
from ..models import decoder_stack
from ..world import generate_scenes as world_scenes
from ..world import render, world_config
from ..world.models import PRESETS, build_llada_v
from ..world.processor import build_processor
from ..world.texts import DESCRIBE_PROMPT
from . import write_result

# the confidence threshold by Fast-dLLM's rule (top slot + all >= 0.9, until the block is done) and by ours (the
# schedule's count or more, within the step budget)
SAMPLERS = {"plain": {}, "prefix": {"cache": "prefix"}, "dual": {"cache": "dual"},
            "dual+threshold": {"cache": "dual", "threshold": 0.9},
            "dual+threshold (schedule)": {"cache": "dual", "threshold": 0.9, "threshold_rule": "schedule"}}


def _model_flops(model, positions: int, keys: int) -> float:
    """Forward FLOPs of the language model for ``positions`` query positions over ``keys`` keys: 2 per weight per
    position in the decoder's matmuls, plus the attention scores and the weighted sum (4 * d per query-key)."""
    text = model.config.text_config
    lm = decoder_stack(model)  # the text decoder, found through the architecture table
    weights = sum(p.numel() for n, p in lm.named_parameters() if "embed" not in n and p.dim() == 2)
    head = model.lm_head.weight.numel()
    return 2.0 * positions * (weights + head) + 4.0 * positions * keys * text.hidden_size * text.num_hidden_layers


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _median_ratio(a, b, pairs: int) -> tuple[float, float, float]:
    """(median b / a, median a seconds, median b seconds) over ``pairs`` interleaved runs (a, b, a, b, ...)."""
    ta, tb = [], []
    for _ in range(pairs):
        ta.append(_timed(a))
        tb.append(_timed(b))
    return statistics.median(y / x for x, y in zip(ta, tb)), statistics.median(ta), statistics.median(tb)


def _setup(batch: int, gen_length: int, block_length: int):
    """The timed model (a random LLaDA-V, width 512, 8 layers), a batch of describe prompts, the prompt length, MPS +
    MRS at the papers' settings (from the method registry), and ``sample(steps, fixes, **sampler)``: the call a user
    makes (``Pipeline.diffuse``, the sampler settings in place of the pipeline's), the two fixes on or off."""
    processor = build_processor()
    preset = replace(PRESETS["tiny-llava"], text_hidden=512, text_layers=8, text_heads=8, text_kv_heads=4,
                     text_intermediate=1536)
    model = build_llada_v(processor, preset).eval()
    cfg = world_config()
    images = [render(s, cfg.noise_std) for s in world_scenes(cfg, batch, seed=0)]
    plain = Pipeline.from_model(model, processor, gen_length=gen_length, block_length=block_length)
    fixed = Pipeline.from_model(model, processor, gen_length=gen_length, block_length=block_length, mps={}, mrs={})
    enc = plain.encode([plain.chat_prompt(DESCRIBE_PROMPT, 1)] * batch, [[im] for im in images])

    def sample(steps: int, fixes: bool, **kw):
        return (fixed if fixes else plain).diffuse(enc, steps=steps, **kw)

    return model, enc["input_ids"].shape[1], fixed.decoders, sample


@torch.inference_mode()
def run(out: str | Path = "runs/bench", steps_grid=(8, 16, 32, 64), batch: int = 4, gen_length: int = 64,
        pairs: int = 20, block_length: int = 32) -> dict:
    model, P, mps_mrs, sample = _setup(batch, gen_length, block_length)
    mps = mps_mrs.get("mps")

    sample(2, True)  # warm-up
    rows = []
    for steps in steps_grid:
        for name, kw in SAMPLERS.items():
            o = sample(steps, False, **kw)
            fix_ratio, t_off, t_on = _median_ratio(lambda s=steps, k=kw: sample(s, False, **k),
                                                   lambda s=steps, k=kw: sample(s, True, **k), pairs)
            row = {"steps": steps, "sampler": name, "forwards": o.forwards, "positions": o.token_forwards / batch,
                   "s_per_answer": t_off / batch, "s_per_answer_mps_mrs": t_on / batch,
                   "mps_mrs_overhead": fix_ratio - 1}
            if name != "plain":
                speed, _, _ = _median_ratio(lambda s=steps, k=kw: sample(s, False, **k),
                                            lambda s=steps: sample(s, False), max(3, pairs // 4))
                row["plain_time_ratio"] = speed  # plain / this: > 1 is faster
            rows.append(row)
    plain = {r["steps"]: r["positions"] for r in rows if r["sampler"] == "plain"}
    for r in rows:
        r["flops_saving"] = plain[r["steps"]] / r["positions"]
    text = model.config.text_config
    d, k, T = text.hidden_size, mps.k, P + gen_length
    fwd = _model_flops(model, T, T)
    extra = {"mps": 4.0 * k * d * gen_length, "mrs": 2.0 * T * (d // text.num_attention_heads) * 2}  # per forward
    print(f"{'T':>3s} {'sampler':<15s} {'forwards':>8s} {'positions':>10s} {'FLOPs x':>8s} {'s/answer':>9s} "
          f"{'vs plain':>9s} {'MPS+MRS':>8s}")
    for r in rows:
        vs = f"{r['plain_time_ratio']:.2f}x" if "plain_time_ratio" in r else "-"
        print(f"{r['steps']:>3d} {r['sampler']:<15s} {r['forwards']:>8d} {r['positions']:>10.0f} "
              f"{r['flops_saving']:>7.2f}x {r['s_per_answer']:>9.3f} {vs:>9s} {100 * r['mps_mrs_overhead']:>7.1f}%")
    print(f"MPS + MRS extra FLOPs per forward: {100 * (extra['mps'] + extra['mrs']) / fwd:.4f}% of the model's "
          f"({fwd / 1e9:.2f} GFLOPs per row); goal: time overhead <= 3%, cached >= 2x fewer FLOPs at T = 32")
    result = {"benchmark": "diffusion", "batch": batch, "gen_length": gen_length, "block_length": block_length,
              "prompt_length": P, "width": d, "layers": text.num_hidden_layers, "pairs": pairs,
              "threads": torch.get_num_threads(), "target_overhead": 0.03, "rows": rows,
              "flops_per_forward": fwd, "extra_flops_per_forward": extra,
              "extra_flops_share": (extra["mps"] + extra["mrs"]) / fwd}
    write_result(out, "diffusion", result)
    return result


@torch.inference_mode()
def run_overhead(out: str | Path = "runs/bench", steps_grid=(8, 32), samplers=("plain", "dual"), batch: int = 4,
                 gen_length: int = 64, pairs: int = 25, block_length: int = 32) -> dict:
    """``keepsight bench mps-mrs``: MPS + MRS's time overhead alone, the question the full grid's few pairs leave open.
    Per (T, sampler), ``pairs`` interleaved calls without and with the two fixes (the order inside a pair alternates);
    each pair's ratio, and their median with a distribution-free 95% interval (``metrics.stats.median_ci``). The goal
    (<= 3%) is met where the interval's top is at most 3%, missed where its bottom is above, else open."""
    _, _, _, sample = _setup(batch, gen_length, block_length)
    sample(2, True)  # warm-up
    rows = []
    for steps in steps_grid:
        for name in samplers:
            kw = SAMPLERS[name]
            off, on = [], []
            for i in range(pairs):
                for fixes in ((False, True) if i % 2 == 0 else (True, False)):
                    (on if fixes else off).append(_timed(lambda f=fixes, s=steps, k=kw: sample(s, f, **k)))
            ci = median_ci([b / a - 1 for a, b in zip(off, on)])
            verdict = ("met" if ci["high"] is not None and ci["high"] <= 0.03 else
                       "missed" if ci["low"] is not None and ci["low"] > 0.03 else "open")
            rows.append({"steps": steps, "sampler": name, "pairs": pairs, "s_per_answer": statistics.median(off) / batch,
                         "overhead": ci["median"], "low": ci["low"], "high": ci["high"], "coverage": ci["coverage"],
                         "goal": verdict})
    print(f"{'T':>3s} {'sampler':<8s} {'s/answer':>9s} {'MPS+MRS overhead (median, 95% interval)':>40s} {'<= 3%':>7s}")
    for r in rows:
        interval = "-" if r["low"] is None else f"[{100 * r['low']:+.1f}%, {100 * r['high']:+.1f}%]"
        print(f"{r['steps']:>3d} {r['sampler']:<8s} {r['s_per_answer']:>9.3f} {100 * r['overhead']:>+22.1f}% "
              f"{interval:>17s} {r['goal']:>7s}")
    result = {"benchmark": "mps-mrs", "batch": batch, "gen_length": gen_length, "block_length": block_length,
              "threads": torch.get_num_threads(), "target_overhead": 0.03, "rows": rows}
    write_result(out, "mps_mrs", result)
    return result
