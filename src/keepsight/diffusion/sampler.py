"""LLaDA-style sampler for masked-diffusion LMs and VLMs (the LLaDA sampler, as the MPS / MRS paper uses it).

The prompt ``[B, P]`` is followed by ``gen_length`` mask slots. The slots are decoded block by block
(``block_length``, left to right); each block gets ``steps // n_blocks`` steps and each step commits a
share of the block's masked slots (spread as evenly as possible, earlier steps take the remainder; or by one of
LaViDa's noise schedules, ``schedule="shift"`` etc.: ``transfer_schedule``). LaViDa's ``step_ratio`` r is
``steps = int(gen_length / n_blocks * r) * n_blocks`` here.
Every step is one full bidirectional forward (no cache; ``pixel_values`` go in on every forward). At
each still-masked slot of the current block the model's token is chosen (argmax, or Gumbel-max at
``temperature > 0``) and scored (``low_confidence``: softmax probability of the chosen token under the
untempered, guided logits; ``random``: uniform noise); the top-k scored slots are committed.

Fast decoding (ours, after the ideas Fast-dLLM published; no code taken): ``cache="prefix"`` runs a full
forward at each block's first step that records the keys / values of everything before the block
(``keepsight.models.llada.BlockKV``); the block's later steps forward only the block and the slots after it,
attending to the recorded prefix. ``cache="dual"`` also records the slots after the block and forwards the
block alone. The recorded keys are those of the sequence as it was at the refresh, so later steps are an
approximation (``refresh_every=k`` refreshes every k steps; ``refresh_every=1`` is the plain sampler).
``cache="prompt"`` is LaViDa's Prefix-DLM (its ``llada_generate(prefix_lm=True)``; its paper, Sec. 3.3): one forward
over the prompt alone records its keys / values, never refreshed, and every step forwards the generation slots only
(positions from ``P`` on), attending to the prompt's keys and to each other. The prompt never sees the answer, in
every step alike, so this is a model of its own (LaViDa trains for it) rather than an approximation of the plain one.
``threshold``: confidence-aware parallel decoding, by one of two rules (``threshold_rule``). ``"fast-dllm"`` (the
default; Fast-dLLM's ``llada/generate.py`` ``get_transfer_index``): each step commits the block's most confident
masked slot and every other masked slot whose confidence is at least the threshold, and the block's steps go on
until it is done: ``steps`` sets no budget (Fast-dLLM's scripts pass threshold 0.9). ``"schedule"`` (our earlier
reading): each step commits the schedule's count or, if more, every slot whose confidence exceeds the threshold,
within the block's ``steps // n_blocks`` steps; a block whose slots are all committed ends early
(``threshold=1.0`` commits exactly the schedule: the plain sampler). The two agree when ``steps = gen_length``
and no confidence equals the threshold. Cached steps check "block done" before their forward (Fast-dLLM's later
version; its first release ran one more forward per block). ``DiffusionOutput.forwards`` / ``token_forwards``
count the model calls and the positions they ran.
Classifier-free guidance and the cache do not combine (an error); MRS with ``segments`` other than "all"
reads column indices and needs ``cache="none"``.

Choices (ours): bad arguments are ``ValueError``s, never silently adjusted. By default the mask token is never
predicted (its logit is -inf), so a committed slot never stays masked; ``ban_mask=False`` is the released samplers'
way (LLaDA's and LaViDa's ``generate.py``): the mask competes in the argmax and in the softmax that scores
confidence, and a slot whose argmax is the mask is committed as the mask, so it stays masked. Padded prompts get position ids
``cumsum(attention_mask) - 1`` (left or right padding both work). ``cfg_scale == 0`` skips the
unconditional pass entirely (exactly no guidance); with ``cfg_scale > 0`` the unconditional pass masks
every non-pad prompt token, image tokens included, and therefore gets no ``pixel_values``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..checks import number
from ..methods import register_method
from ..models.arch import check_length
from ..models.llada import BlockKV

REMASKING = ("low_confidence", "random")
CACHES = ("none", "prefix", "dual", "prompt")
# the sampler's settings a user picks beyond the step schedule (``keepsight eval --sampler.FIELD``, lmms-eval's
# ``sampler_FIELD=``); the schedule (gen_length, steps, block_length), temperature, guidance and remasking have their
# own options, the banned ids and the mask id come from the model
USER_SETTINGS = ("cache", "threshold", "threshold_rule", "refresh_every", "schedule", "shift", "ban_mask")
THRESHOLD_RULES = ("fast-dllm", "schedule")
# how a block's masked slots are spread over its steps: "even" (LLaDA's get_num_transfer_tokens), or one of LaViDa's
# noise schedules (its llada/generate.py get_num_transfer_tokens_sch: "shift", its default in predict.py and the COCO
# evaluation, "logit_normal", "cosine", "linear")
SCHEDULES = ("even", "shift", "logit_normal", "cosine", "linear")


@dataclass
class StepTrace:
    """What one denoising step did. Lists are per batch row; positions index the full sequence."""

    block: int
    step: int  # global step index, 0-based
    positions: list[list[int]]
    tokens: list[list[int]]
    confidences: list[list[float]]
    n_masked: list[int]  # generation slots still masked after this step


@dataclass
class DiffusionOutput:
    sequences: torch.Tensor  # [B, P + G] prompt + generated ids
    prompt_length: int
    trace: list[StepTrace] = field(default_factory=list)
    forwards: int = 0  # model calls (a guided step counts two)
    token_forwards: int = 0  # positions those calls ran, summed (B x their length): the FLOPs proxy

    @property
    def generated(self) -> torch.Tensor:  # [B, G]
        return self.sequences[:, self.prompt_length:]


def resolve_mask_token_id(model=None, tokenizer=None, mask_token_id: int | None = None) -> int:
    """The mask token id: explicit, else the tokenizer's, else ``config.mask_token_id`` (or the text
    config's). ``ValueError`` when none has one."""
    if mask_token_id is not None:
        return int(mask_token_id)
    if tokenizer is not None and getattr(tokenizer, "mask_token_id", None) is not None:
        return int(tokenizer.mask_token_id)
    config = getattr(model, "config", None)
    for cfg in (config, getattr(config, "text_config", None)):
        if getattr(cfg, "mask_token_id", None) is not None:
            return int(cfg.mask_token_id)
    raise ValueError("no mask token: the tokenizer has no mask_token and the model config no mask_token_id; "
                     "a masked-diffusion sampler needs one (pass mask_token_id=)")


def transfer_schedule(n_masked: torch.Tensor, steps: int, schedule: str = "even", shift: float = 3.0) -> torch.Tensor:
    """Tokens to commit per step: ``[B]`` masked counts -> ``[B, steps]``, rows sum to ``n_masked``. ``"even"``: as
    even as possible (the first ``n % steps`` steps take one extra). Otherwise LaViDa's: the schedule's sigma on
    ``linspace(0, 1, steps + 1)`` (float32) times ``n``, truncated, differenced, at least one a step; what that
    overshoots is taken back one at a time from the first steps holding more than one, cycling; then the order is
    reversed. ``"shift"``: ``sigma(t) = shift t / (1 + (shift - 1) t)`` (``shift`` > 1 commits few slots first,
    < 1 many); ``"logit_normal"``: the normal CDF of logit(t); ``"cosine"``: ``1 - (1 + cos(pi t)) / 2``;
    ``"linear"``: ``sigma(t) = t``."""
    if schedule == "even":
        base, rem = n_masked // steps, n_masked % steps  # [B], [B]
        extra = torch.arange(steps, device=n_masked.device)[None] < rem[:, None]  # [B, steps]
        return base[:, None] + extra.long()
    t = torch.linspace(0, 1, steps + 1)  # [steps + 1]
    if schedule == "shift":
        sigma = shift * t / (1 + (shift - 1) * t)
    elif schedule == "logit_normal":
        sigma = 0.5 * (1 + torch.erf(torch.log(t / (1 - t)) / torch.sqrt(torch.tensor(2.0))))
    elif schedule == "cosine":  # the release takes the cosine with numpy (float32), the rest with torch
        sigma = 1 - 0.5 * (1 + torch.from_numpy(np.cos((np.pi * t).numpy())))
    elif schedule == "linear":
        sigma = t
    else:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    rows = []
    for n in n_masked.tolist():
        counts = (sigma * torch.tensor([n])).to(torch.int64)  # [steps + 1]: committed after each step
        counts = (counts[1:] - counts[:-1]).clamp(min=1)  # [steps]
        over, j = int(counts.sum()) - n, 0
        while over > 0:  # steps <= n, so some step holds more than one while anything is over
            j %= steps
            if counts[j] > 1:
                counts[j] -= 1
                over -= 1
            j += 1
        rows.append(counts.flip(-1))
    return torch.stack(rows).to(n_masked.device)


def guided_logits(cond: torch.Tensor, uncond: torch.Tensor, cfg_scale: float) -> torch.Tensor:
    """Classifier-free guidance: ``uncond + (cfg_scale + 1) * (cond - uncond)``."""
    return uncond + (cfg_scale + 1.0) * (cond - uncond)


def _check(gen_length, steps, block_length, temperature, cfg_scale, remasking):
    gen_length, steps = number("gen_length", gen_length, 1, integer=True), number("steps", steps, 1, integer=True)
    block_length = number("block_length", block_length, 1, integer=True)
    if gen_length % block_length:
        raise ValueError(f"block_length {block_length} must be >= 1 and divide gen_length {gen_length}")
    if steps > gen_length:
        raise ValueError(f"steps {steps} exceed gen_length {gen_length}: a step commits at least one token, so at "
                         "most gen_length steps can commit anything")
    n_blocks = gen_length // block_length
    if steps % n_blocks:
        raise ValueError(f"steps {steps} must be divisible by the number of blocks {n_blocks} "
                         f"(gen_length {gen_length} / block_length {block_length})")
    if remasking not in REMASKING:
        raise ValueError(f"remasking must be one of {REMASKING}, got {remasking!r}")
    number("temperature", temperature, 0.0)
    number("cfg_scale", cfg_scale, 0.0)
    return n_blocks, steps // n_blocks


@dataclass(frozen=True)
class SamplerConfig:
    """The sampler's settings (see the module docstring), checked when made: a bad value is a ValueError naming it.

    ``generate(model, ids, config=SamplerConfig(gen_length=64, steps=64))``, or the same fields as keywords."""

    gen_length: int  # mask slots after the prompt
    steps: int  # denoising steps in all (split evenly over the blocks)
    block_length: int | None = None  # semi-autoregressive block (None: one block of gen_length)
    temperature: float = 0.0  # Gumbel temperature of the token choice (0: argmax)
    cfg_scale: float = 0.0  # classifier-free guidance (0: no unconditional pass)
    remasking: str = "low_confidence"  # which slots a step commits: "low_confidence" | "random"
    suppress_token_ids: tuple[int, ...] = ()  # ids never generated (their logits -inf at the slots)
    mask_token_id: int | None = None  # default: the model config's
    cache: str = "none"  # "none" | "prefix" | "dual" (fast decoding) | "prompt" (LaViDa's Prefix-DLM)
    threshold: float | None = None  # confidence-aware parallel decoding
    refresh_every: int | None = None  # cached: refresh the recorded keys every k steps
    threshold_rule: str = "fast-dllm"  # "fast-dllm" | "schedule"
    schedule: str = "even"  # slots per step: "even" (LLaDA) | "shift" | "logit_normal" | "cosine" | "linear" (LaViDa)
    shift: float = 3.0  # schedule="shift": LaViDa's schedule_kwargs shift (its default 3; its COCO evaluation 0.33)
    ban_mask: bool = True  # the mask's logit -inf (ours); False: it competes, as released (keepsight eval: False on LaViDa)

    def __post_init__(self) -> None:
        if self.cache not in CACHES:
            raise ValueError(f"cache must be one of {CACHES}, got {self.cache!r}")
        threshold = self.threshold
        if threshold is not None:
            number("threshold", threshold, 0.0, 1.0, open_low=True)  # a confidence
            if self.remasking != "low_confidence":
                raise ValueError("threshold compares the model's confidence: it needs remasking='low_confidence'")
        if self.threshold_rule not in THRESHOLD_RULES:
            raise ValueError(f"threshold_rule must be one of {THRESHOLD_RULES}, got {self.threshold_rule!r}")
        if self.refresh_every is not None:
            object.__setattr__(self, "refresh_every", number("refresh_every", self.refresh_every, 1, integer=True))
            if self.cache in ("none", "prompt"):
                raise ValueError("refresh_every refreshes the cache: it needs cache='prefix' or 'dual' (with "
                                 "cache='none' every step is a full forward already; cache='prompt' records the "
                                 "prompt once, which no step changes)")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        number("shift", self.shift, 0.0, open_low=True)
        if not isinstance(self.ban_mask, bool):
            raise ValueError(f"ban_mask must be true or false, got {self.ban_mask!r}")
        if not self.ban_mask and self.until_done:
            raise ValueError("ban_mask=False lets a step commit the mask (the slot stays masked), so threshold_rule "
                             "'fast-dllm', which runs a block until no slot is masked, might never end; use "
                             "threshold_rule='schedule' or ban_mask=True")
        if self.schedule != "even" and self.until_done:
            raise ValueError(f"schedule {self.schedule!r} spreads a step budget; threshold_rule 'fast-dllm' sets none "
                             "(each block runs until it is done): use threshold_rule='schedule' or no threshold")
        if self.cache != "none" and self.cfg_scale > 0:
            raise ValueError("classifier-free guidance (cfg_scale > 0) does not combine with the cache; use "
                             "cache='none'")
        block_length = self.gen_length if self.block_length is None else self.block_length
        _check(self.gen_length, self.steps, block_length, self.temperature, self.cfg_scale, self.remasking)
        object.__setattr__(self, "block_length", int(block_length))
        object.__setattr__(self, "suppress_token_ids", tuple(int(i) for i in self.suppress_token_ids))

    @property
    def n_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.n_blocks

    @property
    def until_done(self) -> bool:
        """Fast-dLLM's rule: no step budget, each block's steps go on until it is done."""
        return self.threshold is not None and self.threshold_rule == "fast-dllm"


def user_settings(settings: dict | None) -> dict:
    """``settings`` (fields of ``USER_SETTINGS``) checked as ``SamplerConfig`` checks them, before any model loads:
    an unknown field or a bad value is a ValueError naming it."""
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(USER_SETTINGS))
    if unknown:
        raise ValueError(f"unknown sampler setting(s) {unknown}; known: {list(USER_SETTINGS)}")
    SamplerConfig(gen_length=1, steps=1, **settings)
    return settings


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    pixel_values: torch.Tensor | None = None,
    config: SamplerConfig | None = None,
    *,
    generator: torch.Generator | None = None,
    trace: bool = False,
    callback: Callable[[StepTrace, torch.Tensor], None] | None = None,
    model_kwargs: dict | None = None,
    **settings,
) -> DiffusionOutput:
    """Decode ``config.gen_length`` tokens after ``input_ids [B, P]`` in ``config.steps`` denoising steps.

    ``config``: a ``SamplerConfig``; ``settings`` (its fields as keywords) make one, or override the given one's.
    ``model``: a ``LladaForMaskedDiffusion`` or a LLaVA with a Llada language model (anything called as
    ``model(input_ids=, attention_mask=, [position_ids=], [pixel_values=]).logits -> [B, T, V]``).
    ``mask_token_id`` defaults to the model config's. ``suppress_token_ids`` get -inf logits at the
    generation slots (LLaDA-V suppresses eos/pad/header ids). ``generator`` drives the Gumbel and
    random-remasking noise, so outputs depend only on it. ``trace=True`` fills ``output.trace`` with one
    ``StepTrace`` per step; ``callback(step_trace, x)`` is called after every step with the ids ``[B, T]``.
    ``model_kwargs`` go to the conditional forward (e.g. ``image_sizes``). ``cache`` ("none" | "prefix" |
    "dual"), ``refresh_every``, ``threshold`` and ``threshold_rule``: fast decoding, see the module docstring.
    """
    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(SamplerConfig)})
    if unknown:
        raise TypeError(f"generate() got unexpected keyword argument(s) {unknown}")
    cfg = SamplerConfig(**settings) if config is None else dataclasses.replace(config, **settings)
    gen_length, steps_per_block, n_blocks = cfg.gen_length, cfg.steps_per_block, cfg.n_blocks
    block_length, temperature, cfg_scale, remasking = cfg.block_length, cfg.temperature, cfg.cfg_scale, cfg.remasking
    cache, threshold, refresh_every, until_done = cfg.cache, cfg.threshold, cfg.refresh_every, cfg.until_done
    suppress_token_ids = cfg.suppress_token_ids
    mask_id = resolve_mask_token_id(model, mask_token_id=cfg.mask_token_id)
    reader = getattr(model, "_keepsight_reads_columns", None)
    if cache != "none" and reader:
        raise ValueError(f"{reader} reads column indices, which the cached sampler's windowed forwards do not keep; "
                         "use cache='none' (or MRS segments='all')")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, P], got shape {tuple(input_ids.shape)}")
    B, P = input_ids.shape
    check_length(model, gen_length, "gen_length", prompt=P)
    image_token = getattr(getattr(model, "config", None), "image_token_id", None)
    if pixel_values is None and image_token is not None and bool((input_ids == image_token).any()):
        raise ValueError("the prompt holds image tokens but pixel_values is None: the image slots would never be "
                         "filled; pass the processor's pixel_values")
    device = input_ids.device
    x = torch.cat([input_ids, input_ids.new_full((B, gen_length), mask_id)], dim=1)  # [B, T = P + G]
    am = None
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} "
                             f"!= input_ids shape {tuple(input_ids.shape)}")
        am = torch.cat([attention_mask.long(), attention_mask.new_ones((B, gen_length)).long()], dim=1)  # [B, T]
    cond_kwargs = dict(model_kwargs or {})
    if pixel_values is not None:
        cond_kwargs["pixel_values"] = pixel_values
    base_kwargs = {}
    if am is not None:
        base_kwargs["attention_mask"] = am
        if not bool(am.all()):
            base_kwargs["position_ids"] = (am.cumsum(-1) - 1).clamp(min=0)  # [B, T]
    suppress = torch.tensor(sorted({*map(int, suppress_token_ids), *([mask_id] if cfg.ban_mask else [])}),
                            dtype=torch.long, device=device)
    vocab = model.get_output_embeddings().weight.shape[0]
    if suppress.numel() and (int(suppress.min()) < 0 or int(suppress.max()) >= vocab):
        raise ValueError(f"suppress_token_ids / mask_token_id {suppress.tolist()} must lie in [0, {vocab})")
    if cfg_scale > 0:
        prompt_real = am[:, :P].bool() if am is not None else torch.ones_like(input_ids, dtype=torch.bool)

    T = P + gen_length
    kv = BlockKV() if cache != "none" else None
    positions = base_kwargs.get("position_ids", torch.arange(T, device=device)[None])  # [B|1, T]
    key_mask_full = am if am is not None else torch.ones(B, T, dtype=torch.long, device=device)  # [B, T]
    records: list[StepTrace] = []
    step = forwards = token_forwards = 0
    if cache == "prompt":  # the prompt alone, once: its keys never see a generation slot
        kv.record(torch.ones(P, dtype=torch.bool, device=device), key_mask_full[:, :P])
        model(input_ids=x[:, :P], **{k: v[:, :P] for k, v in base_kwargs.items()}, **cond_kwargs, cache=kv)
        forwards, token_forwards = forwards + 1, token_forwards + B * P
    for b in range(n_blocks):
        lo, hi = P + b * block_length, P + (b + 1) * block_length  # current block [lo, hi)
        schedule = transfer_schedule((x[:, lo:hi] == mask_id).sum(1), steps_per_block, cfg.schedule,
                                     cfg.shift)  # [B, steps_per_block]
        end = hi if cache == "dual" else T  # the query window of cached steps: [lo, end)
        s = 0
        while s < steps_per_block or until_done:
            if threshold is not None and not bool((x[:, lo:hi] == mask_id).any()):
                break  # every slot of the block is committed: its remaining steps are saved
            if kv is None:
                logits = model(input_ids=x, **base_kwargs, **cond_kwargs).logits[:, lo:hi]  # [B, L, V]
                forwards, token_forwards = forwards + 1, token_forwards + B * T
            elif cache == "prompt":  # every generation slot, on the prompt's recorded keys
                window = {"attention_mask": key_mask_full[:, P:], "position_ids": positions[:, P:]}
                logits = model(input_ids=x[:, P:], **window, cache=kv.read()).logits[:, lo - P: hi - P]
                forwards, token_forwards = forwards + 1, token_forwards + B * gen_length
            elif s == 0 or (refresh_every is not None and s % refresh_every == 0):
                cols = torch.arange(T, device=device)
                keep = (cols < lo) | (cols >= end)  # [T]: what the window's steps will read from the record
                kv.record(keep, key_mask_full[:, keep])
                logits = model(input_ids=x, **base_kwargs, **cond_kwargs, cache=kv).logits[:, lo:hi]
                forwards, token_forwards = forwards + 1, token_forwards + B * T
            else:
                window = {"attention_mask": key_mask_full[:, lo:end],
                          "position_ids": positions[:, lo:end]}
                logits = model(input_ids=x[:, lo:end], **window, cache=kv.read()).logits[:, : hi - lo]
                forwards, token_forwards = forwards + 1, token_forwards + B * (end - lo)
            if cfg_scale > 0:
                uncond_x = x.clone()
                uncond_x[:, :P][prompt_real] = mask_id
                uncond = model(input_ids=uncond_x, **base_kwargs).logits[:, lo:hi]  # [B, L, V]
                logits = guided_logits(logits, uncond, cfg_scale)
                forwards, token_forwards = forwards + 1, token_forwards + B * T
            logits = logits.double()
            logits[..., suppress] = float("-inf")
            if temperature > 0:  # Gumbel-max: argmax(l / T + g) samples softmax(l / T)
                u = _rand(logits.shape, generator, device)
                expo = -torch.log(u.clamp_min(1e-300))  # Exp(1) noise, > 0
                gumbel = -torch.log(expo.clamp_min(1e-300))  # Gumbel(0, 1)
                pred = (logits / temperature + gumbel).argmax(-1)  # [B, L]
            else:
                pred = logits.argmax(-1)  # [B, L]
            if remasking == "low_confidence":
                conf = logits.softmax(-1).gather(-1, pred[..., None])[..., 0]  # [B, L]
            else:
                conf = _rand(pred.shape, generator, device)
            masked = x[:, lo:hi] == mask_id  # [B, L]
            score = torch.where(masked, conf, torch.full_like(conf, float("-inf")))
            rec = StepTrace(b, step, [], [], [], [])
            if until_done:  # the most confident slot, and every other at or above the threshold
                above = ((score >= threshold) & masked).sum(1)  # [B]
                counts = torch.minimum(masked.sum(1), above.clamp(min=1))
            elif threshold is not None:
                above = ((score > threshold) & masked).sum(1)  # [B]
                counts = torch.minimum(masked.sum(1), torch.maximum(schedule[:, s], above))
            else:
                counts = schedule[:, s]
            for r in range(B):
                k = int(counts[r])
                idx = torch.topk(score[r], k).indices if k else _empty_index(device)  # [k] within the block
                x[r, lo + idx] = pred[r, idx]
                rec.positions.append((lo + idx).tolist())
                rec.tokens.append(pred[r, idx].tolist())
                rec.confidences.append(conf[r, idx].tolist())
                rec.n_masked.append(int((x[r, P:] == mask_id).sum()))
            if trace:
                records.append(rec)
            if callback is not None:
                callback(rec, x)
            step, s = step + 1, s + 1
    return DiffusionOutput(sequences=x, prompt_length=P, trace=records, forwards=forwards,
                           token_forwards=token_forwards)


def _empty_index(device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.long, device=device)


def _rand(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Uniform float64 noise drawn on the generator's device (so a seed means the same on any device)."""
    where = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=where).to(device)


# the Pipeline's decoding settings (keepsight.inference.settings.DecodeSettings) that only this sampler takes
SCHEDULE_SETTINGS = ("steps", "gen_length", "block_length", "cfg_scale", "remasking")
# the Pipeline settings of this sampler and of the diffusion decoding methods: method="diffusion" alone takes them
DIFFUSION_SETTINGS = ("mps", "mrs", "decoding", *SCHEDULE_SETTINGS, "sampler")


def _diffusion_checkpoint(spec, kind: str, where) -> None:
    if not spec.loadable:
        raise ValueError(f"{where}: {spec.note}")
    if not spec.vlm:
        raise ValueError(f"{where} is a text-only LLaDA language model; lmms-eval tasks need a VLM (LLaVA with a "
                         "llada text model)")


# the model-side method: keepsight.inference.Pipeline(method="diffusion") decodes a masked-diffusion VLM with this
# sampler and the diffusion decoding methods
register_method("diffusion", stage="load", family="diffusion",
                needs="a masked-diffusion VLM (LLaVA with a llada text model, or a LLaDA-V checkpoint)",
                takes=DIFFUSION_SETTINGS, check=_diffusion_checkpoint)
