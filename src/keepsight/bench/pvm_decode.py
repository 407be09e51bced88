"""``keepsight bench pvm-decode``: what PVM's released block costs per decoded token, at batch 1, 4 and 8, three ways:
the base; PVM with the visual memory projected once per request (keepsight); PVM recomputing the reducer and k / v
projections over every visual token at every step (the released code's way). Shapes (``--shape``): ``mid`` (the
default: a Qwen3-VL-shaped text model of width 512 and 12 layers, 256 visual tokens, built at full depth) and
``qwen3-vl-8b`` (Qwen3-VL-8B's full width and vocabulary, 1,024 visual tokens, 4 layers built and the overhead
projected to its 36 from the measured per-layer and LM-head times; about an hour on 2 CPU cores). One prefill per
batch size; each timing is a run of cached decode steps from the same cache (cropped back), the three arms
interleaved in every repeat, the medians of the repeats reported. Beside the wall-time overhead (whose noise on a
shared CPU is larger than the effect), the time spent inside the PVM blocks themselves is clocked (forward hooks) and
reported as a share of the same repeat's base step. FLOPs per decoded token at Qwen3-VL-8B's full depth
are counted from the shapes (``decode_flops``) whatever shape is timed."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

import torch
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from ..metrics.stats import median_ci
from ..pvm import PVMConfig, attach_pvm, pvm_disabled
from . import write_result

# Qwen3-VL-8B's text model (config.json of Qwen/Qwen3-VL-8B-Instruct); the released PVM: 3 blocks, p = 512
Q3VL_8B = {"layers": 36, "hidden": 4096, "intermediate": 12288, "heads": 32, "kv_heads": 8, "head_dim": 128,
           "vocab": 151936}
# a mid-size Qwen3-VL-shaped text model: the LM head's share of a token's FLOPs about the 8B's (a small vocabulary)
MID = {"layers": 12, "hidden": 512, "intermediate": 1536, "heads": 8, "kv_heads": 4, "head_dim": 64, "vocab": 4096}
SHAPES = {"mid": (MID, 12, 256), "qwen3-vl-8b": (Q3VL_8B, 4, 1024)}  # name -> (shape, layers built, visual tokens)
IMAGE_TOKEN = 7  # any id: the visual positions carry its embedding (no vision tower runs)


def shaped_model(layers: int = 4, m: dict = Q3VL_8B) -> Qwen3VLForConditionalGeneration:
    """A random Qwen3-VL with the text shape ``m`` (its width, heads, FFN and vocabulary) and ``layers`` layers."""
    half = m["head_dim"] // 2
    cfg = Qwen3VLConfig(
        text_config=dict(hidden_size=m["hidden"], num_hidden_layers=layers, intermediate_size=m["intermediate"],
                         num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"], head_dim=m["head_dim"],
                         vocab_size=m["vocab"], max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_interleaved": True,
                                          "mrope_section": [half - 2 * (half * 5 // 16), half * 5 // 16,
                                                            half * 5 // 16]}),
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=m["hidden"]),
        image_token_id=IMAGE_TOKEN, video_token_id=8)
    torch.manual_seed(0)
    return Qwen3VLForConditionalGeneration(cfg).eval()


def _decode(model, cache, prefix: int, first: torch.Tensor, mask: torch.Tensor, steps: int) -> tuple[float, list]:
    """Seconds per cached decode step, ``steps`` greedy steps from the cache cropped back to ``prefix`` positions, and
    the tokens they chose."""
    extra = cache.get_seq_length() - prefix
    if extra:
        cache.crop(-extra)  # the steps of the previous run go
    token, m, tokens = first, mask, []
    t0 = time.perf_counter()
    for _ in range(steps):
        m = torch.cat([m, torch.ones(m.shape[0], 1, dtype=m.dtype)], 1)
        logits = model(input_ids=token, attention_mask=m, cache=cache, use_cache=True).logits
        token = logits[:, -1:].argmax(-1)
        tokens.append(token)
    return (time.perf_counter() - t0) / steps, tokens


class _BlockClock:
    """Seconds spent inside the PVM blocks' forwards (forward pre- / post-hooks on each block) while active: PVM's own
    work per step, which wall time per step shows only beside the machine's noise."""

    def __init__(self, blocks):
        self.seconds, self.active, self._t0 = 0.0, False, 0.0
        self.handles = [h for b in blocks for h in (b.register_forward_pre_hook(self._start),
                                                      b.register_forward_hook(self._stop))]

    def _start(self, module, args):
        if self.active:
            self._t0 = time.perf_counter()

    def _stop(self, module, args, output):
        if self.active:
            self.seconds += time.perf_counter() - self._t0


MAX_NEW_TOKENS = 16  # decode steps timed a run: the default and the most this benchmark takes (more is refused)


def decode_flops(m: dict = Q3VL_8B, visual: int = 1024, context: int = 1040, p: int = 512, blocks: int = 3) -> dict:
    """Multiply-adds x 2 per decoded token and row, counted from the shapes: the base text model (every layer's
    projections, attention over ``context`` keys, FFN, LM head) and PVM's ``blocks`` released blocks of latent width
    ``p``: once (text reducer, cross-attention over ``visual`` keys, MLP, expander: the visual side projected once per
    request) and every step (the release also runs the vision reducer and the k / v projections over every visual
    token at every step)."""
    d, hd, heads, kv = m["hidden"], m["head_dim"], m["heads"], m["kv_heads"]
    layer = d * heads * hd * 2 + d * kv * hd * 2 + 2 * heads * hd * context + 3 * d * m["intermediate"]
    base = m["layers"] * layer + d * m["vocab"]
    pvm_heads = p // hd
    pvm_kv = max(1, pvm_heads // max(1, heads // kv))
    mlp = int(p * m["intermediate"] / d)
    once = d * p + p * p * 2 + 2 * pvm_heads * hd * visual + 3 * p * mlp + p * d  # per block
    visual_side = visual * (d * p + 2 * p * pvm_kv * hd)  # vision reducer, k / v projections: per block
    return {"base": 2 * base, "pvm_once": 2 * blocks * once, "pvm_every_step": 2 * blocks * (once + visual_side)}


@torch.inference_mode()
def run(out: str | Path = "runs/bench", batches=(1, 4, 8), new_tokens: int = MAX_NEW_TOKENS, repeats: int = 15,
        shape: str | dict = "mid", visual: int | None = None, layers: int | None = None) -> dict:
    batches = (batches,) if isinstance(batches, int) else tuple(batches)
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"shape {shape!r}: choose from {sorted(SHAPES)}")
        name, (shape, depth, visual_default) = shape, SHAPES[shape]
    else:
        name, depth, visual_default = "custom", 4, 1024
    layers, visual = layers or depth, visual or visual_default
    if new_tokens < 2:
        raise ValueError(f"--new-tokens {new_tokens}: give at least 2 decode steps to time")
    if new_tokens > MAX_NEW_TOKENS:
        raise ValueError(f"--new-tokens {new_tokens}: bench pvm-decode measures at most {MAX_NEW_TOKENS} new tokens")
    if layers < 3:
        raise ValueError(f"layers {layers}: the released PVM takes 3 blocks; give at least 3 layers")
    model = shaped_model(layers, shape)
    pvm_layers = list(range(layers - 3, layers))  # 3 blocks, as released
    attach_pvm(model, PVMConfig(layers=pvm_layers))
    with torch.no_grad():
        for block in model.pvm.values():
            block.gate_alpha.fill_(0.1)
    st = model._keepsight_pvm
    clock = _BlockClock(model.pvm.values())
    cached_cfg, recompute_cfg = st.config, dataclasses.replace(st.config, cache_visual=False)
    rows = []
    for batch in batches:
        g = torch.Generator().manual_seed(batch)
        text = torch.randint(10, min(1000, shape["vocab"]), (batch, 16), generator=g)
        ids = torch.cat([text[:, :4], torch.full((batch, visual), IMAGE_TOKEN), text[:, 4:]], 1)
        mask = torch.ones_like(ids)
        t0 = time.perf_counter()
        prefill = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
        prefill_s = time.perf_counter() - t0
        cache, prefix = prefill.past_key_values, ids.shape[1]
        first = prefill.logits[:, -1:].argmax(-1)
        once_s, _ = _decode(model, cache, prefix, first, mask, 1)  # the one projection of the memory; a warm-up
        with pvm_disabled(model):
            _decode(model, cache, prefix, first, mask, 1)
        times, chosen = {"base": [], "pvm_once": [], "pvm_every_step": []}, {}
        inside = []  # per repeat: seconds a step spent inside the blocks, with the memory projected once
        for _ in range(repeats):
            for arm in times:
                st.config = recompute_cfg if arm == "pvm_every_step" else cached_cfg
                st.enabled = arm != "base"
                clock.seconds, clock.active = 0.0, arm == "pvm_once"
                seconds, chosen[arm] = _decode(model, cache, prefix, first, mask, new_tokens)
                times[arm].append(seconds)
                if clock.active:
                    inside.append(clock.seconds / new_tokens)
            st.config, st.enabled, clock.active = cached_cfg, True, False
        same = all(torch.equal(a, b) for a, b in zip(chosen["pvm_once"], chosen["pvm_every_step"]))
        h = torch.randn(batch, 1, shape["hidden"])
        head_s = statistics.median(_time(lambda h=h: model.lm_head(h)) for _ in range(repeats))
        med = {k: statistics.median(v) for k, v in times.items()}
        # each repeat runs the three arms back to back: its ratios share the machine's state of that moment
        paired = {arm: median_ci([t / b - 1 for b, t in zip(times["base"], times[arm])])
                  for arm in ("pvm_once", "pvm_every_step")}
        own = median_ci([i / b for b, i in zip(times["base"], inside)])  # the blocks' time against the base step
        layer_s = (med["base"] - head_s) / layers
        full = head_s + shape["layers"] * layer_s  # the base step at the real depth
        rows.append({"batch": batch, "visual_tokens": visual, "prefill_s": prefill_s, "same_tokens": same,
                     "first_step_with_projection_s": once_s,
                     **{f"{k}_ms": v * 1e3 for k, v in med.items()},
                     "overhead_once": paired["pvm_once"]["median"],
                     "overhead_once_interval": [paired["pvm_once"]["low"], paired["pvm_once"]["high"]],
                     "overhead_every_step": paired["pvm_every_step"]["median"],
                     "overhead_every_step_interval": [paired["pvm_every_step"]["low"],
                                                      paired["pvm_every_step"]["high"]],
                     "blocks_ms": statistics.median(inside) * 1e3, "blocks_share": own["median"],
                     "blocks_share_interval": [own["low"], own["high"]],
                     "lm_head_ms": head_s * 1e3, "layer_ms": layer_s * 1e3,
                     "projected_36_layers_overhead_once": (med["pvm_once"] - med["base"]) / full,
                     "projected_36_layers_overhead_every_step": (med["pvm_every_step"] - med["base"]) / full})
    flops = decode_flops(Q3VL_8B, 1024, 1024 + 16, 512, 3)  # Qwen3-VL-8B's, as released (p = 512, 3 blocks)
    p = model.pvm[str(pvm_layers[0])].pvm_hidden_size
    # the timed shape's, at its full depth (the prompt, the visual tokens and the new tokens as keys)
    timed = decode_flops(shape, visual, visual + 16 + new_tokens, p, 3)
    result = {"benchmark": "pvm-decode", "target_overhead": 0.05, "shape_name": name, "shape": shape,
              "layers": layers, "visual_tokens": visual, "flops_per_token_qwen3_vl_8b": flops,
              "flops_per_token_timed_shape": timed, "pvm_layers": pvm_layers, "pvm_hidden_size": p,
              "new_tokens": new_tokens, "repeats": repeats, "threads": torch.get_num_threads(), "rows": rows}
    print(f"{name}: Qwen3-VL-shaped text model (width {shape['hidden']}, {layers} layers, vocabulary "
          f"{shape['vocab']:,}), {visual} visual tokens, released PVM blocks on layers {pvm_layers}; ms per cached "
          f"decode step (median of {repeats}); overhead: the median over the {repeats} repeats of each repeat's ratio "
          "to the base (the arms interleaved), with its order-statistic 95% interval; in blocks: ms a step spends "
          "inside the three PVM blocks (memory projected once), and its share of the same repeat's base step")
    print(f"{'batch':>5s} {'base':>7s} {'PVM once':>9s} {'overhead [95% interval]':>27s} {'in blocks':>10s} "
          f"{'share [95% interval]':>27s} {'every step':>11s} {'overhead [95% interval]':>27s}"
          + (f" {str(shape['layers']) + ' layers: once':>16s} {'every step':>11s}" if layers < shape["layers"] else ""))

    def pct(value, interval) -> str:
        spread = "n/a" if interval[0] is None else f"{interval[0]:+.1%}, {interval[1]:+.1%}"
        return f"{value:+.1%} [{spread}]"

    for r in rows:
        print(f"{r['batch']:5d} {r['base_ms']:7.1f} {r['pvm_once_ms']:9.1f} "
              f"{pct(r['overhead_once'], r['overhead_once_interval']):>27s} {r['blocks_ms']:10.2f} "
              f"{pct(r['blocks_share'], r['blocks_share_interval']):>27s} {r['pvm_every_step_ms']:11.1f} "
              f"{pct(r['overhead_every_step'], r['overhead_every_step_interval']):>27s}"
              + (f" {r['projected_36_layers_overhead_once']:+16.1%} {r['projected_36_layers_overhead_every_step']:+11.1%}"
                 if layers < shape["layers"] else ""))
    print(f"FLOPs per decoded token and row at the timed shape ({shape['layers']} layers, {visual} visual tokens, "
          f"p {p}, 3 blocks): base {timed['base'] / 1e6:.1f} M, PVM once +{timed['pvm_once'] / 1e6:.1f} M "
          f"({timed['pvm_once'] / timed['base']:+.1%}), every step +{timed['pvm_every_step'] / 1e6:.1f} M "
          f"({timed['pvm_every_step'] / timed['base']:+.1%})")
    print("FLOPs per decoded token and row at Qwen3-VL-8B (36 layers, 1,024 visual tokens, p 512, 3 blocks): "
          f"base {flops['base'] / 1e9:.2f} G, PVM once +{flops['pvm_once'] / 1e6:.1f} M "
          f"({flops['pvm_once'] / flops['base']:+.2%}), every step +{flops['pvm_every_step'] / 1e9:.2f} G "
          f"({flops['pvm_every_step'] / flops['base']:+.1%})")
    print("target: PVM projected once <= 5% over the base at every batch; the two PVM arms chose the same tokens: "
          + ", ".join(f"batch {r['batch']} {'yes' if r['same_tokens'] else 'NO'}" for r in rows))
    write_result(out, "pvm_decode", result)
    return result


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
