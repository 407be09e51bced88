"""The diffusion world experiment: a tiny LLaDA-V-style VLM trained on the world, described with
64-token windows by the LLaDA-style sampler, with and without Mask Prior Suppression and Monotonic RoPE
Scaling (and NTK / YaRN in place of MRS).

MPS and MRS are the released ones (their defaults); the sweeps also run our earlier readings
(``keepsight.diffusion.readings``: MPS as a projection, with its prior directions, centring, layers; MRS's gains on the
pairs' amplitude and frequency, over beta).

Measured per (method, steps T): distinct-2, consecutive repetition ratio, the share of repeated tokens
that are among the uncontextualised mask token's top-10 predictions (the paper: over 95%), CHAIR /
instance hallucination / object recall against the scene graphs, and sampler latency. Plus the cosine of
still-masked final-layer hidden states to the prior subspace per step (with / without MPS) and sweeps of
lam, k, beta, eta, tau0 and the five schedules at one T, and where generation slots attend (key kind,
relative distance, RoPE frequency band; ``keepsight.diffusion.RoPEAttentionProbe``) without MRS and with
MRS at the paper's beta and a strong one. And the fast samplers (``samplers``: the block cache, confidence-threshold
parallel decoding) against the plain sampler at the same block length: forwards and positions run per answer,
time, and what they cost in recall / repetition.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..diffusion import (
    MaskPriorSuppression,
    MPSConfig,
    MRSConfig,
    RoPEBaseline,
    lone_mask_logits,
    prior_cosine,
)
from ..diffusion.mps import released_states
from ..diffusion.readings import MPS_PROJECTION, MRS_GAINS
from ..fingerprint import digest
from ..inference import Decoders, Pipeline
from ..metrics import distinct_n, mean_ci, repetition_ratio
from ..models import decoder_stack, load_checkpoint
from ..probes import RoPEAttentionProbe
from ..train.diffusion import DiffusionTrainConfig, train_diffusion
from ..train.finetune import FinetuneConfig, train_finetune
from ..world.base import llada_v_init
from ..world.chair import chair
from ..world.dataset import generate_scenes as world_scenes
from ..world.tasks import VLMDataset, WorldSamples
from ..world.texts import DESCRIBE_PROMPT
from .arm import ExperimentContext

PAPER = {"repeats_from_mask_prior": 0.95, "mps_lam": 0.1, "mrs": {"beta": 0.01, "eta": 8, "tau0": 0.6}}


@dataclass
class DiffusionExperiment:
    train: DiffusionTrainConfig = field(default_factory=DiffusionTrainConfig)
    n_scenes: int = 48  # held-out scenes (objects per scene: ``n_objects``) described in every run
    n_objects: int = 6  # a 64-token window holds the header and about six objects
    scene_seed: int = 4  # the held-out scenes' seed (disjoint from the demo's train / eval / dilution streams)
    steps_grid: tuple[int, ...] = (4, 8, 16, 32)
    sweep_steps: int = 8  # T for the sweeps and the attention analysis
    attention_betas: tuple[float, ...] = (0.01, 1.0)  # MRS betas in the attention analysis (beside no MRS)
    tasks: tuple[str, ...] = ("describe",)  # training items (VLMDataset tasks); the analyses use descriptions
    # ("describe_varied": many right answers per scene; "describe_phrased": the same phrasings in raster order, so
    # what is said stays fixed by the image and only the words around it vary, the regime where slots committed
    # together at few steps repeat a neighbour's word and the model still describes)
    text_layers: int | None = None  # the diffusion LM's depth (None: the base preset's; MPS's k = 3 needs > 4)
    # where the diffusion VLM's language model, LM head and projector start: None, fresh; "base", the base model's (an
    # autoregressive -> diffusion adaptation, as Dream 7B starts from Qwen2.5: keepsight.world.base.llada_v_init)
    language_model_from: str | None = None
    # with language_model_from "base": the base first fine-tuned on its descriptions (every parameter but the vision
    # tower: keepsight.train.finetune), and the diffusion VLM started from that; the base's descriptions place objects
    # near chance, the fine-tuned one's well above (docs/results.md). None: the base as it is
    base_finetune: FinetuneConfig | None = None
    describe_repeats: int = 1  # repeats of each description among the training items
    varied_repeats: int | None = None  # varied (or phrased) descriptions per scene (None: describe_repeats)
    # a curriculum: the model trained on ``tasks`` is then fine-tuned with ``finetune`` on ``finetune_tasks`` (its
    # seed also draws the varied texts anew); None: one stage
    finetune: DiffusionTrainConfig | None = None
    finetune_tasks: tuple[str, ...] = ("describe_varied",)
    mps: dict = field(default_factory=MPSConfig.paper_defaults)
    mrs: dict = field(default_factory=MRSConfig.paper_defaults)
    sweeps: dict = field(default_factory=lambda: {
        "lam": [0.05, 0.1, 0.3, 0.5, 1.0], "k": [1, 2, 3], "beta": [0.01, 0.1, 0.5, 1.0],
        "eta": [4.0, 8.0, 12.0], "tau0": [0.3, 0.6, 0.9],
        "schedule": ["sigmoid", "cosine", "exponential", "linear", "power"]})
    # the fast samplers, each beside the plain sampler at ``sampler_block`` (keepsight.diffusion.generate)
    samplers: dict = field(default_factory=lambda: {
        "plain": {}, "prefix": {"cache": "prefix"}, "dual": {"cache": "dual"},
        "dual+threshold 0.9": {"cache": "dual", "threshold": 0.9},
        "dual+threshold 0.9 (schedule)": {"cache": "dual", "threshold": 0.9, "threshold_rule": "schedule"}})
    sampler_block: int = 16
    # the block length of every other run (the grid, sweeps, prior cosine, attention): None samples the whole
    # window at once; a block is LLaDA's semi-autoregressive remasking, which a model trained with eos-filled
    # windows needs (over the whole window it commits eos early and stops after the header)
    block_length: int | None = None
    # the diffusion VLM's training seeds (its initialisation, batch order and masking; the vision tower and the
    # held-out scenes are the same for all): every seed runs the grid, the sweeps and MPS's effect, the first one also
    # the fast samplers, the prior cosine and the attention analysis; with several, each metric gets a mean and 95%
    # t interval over them, and each method its paired difference from no method. None: ``train.seed`` alone
    seeds: tuple[int, ...] | None = None
    # MPS's effect on the LM head's input at each of these lam (``mps_effect``: how far it moves the state, how open its
    # gate is, what it does to the mask prior's top tokens); empty: not measured
    effect_lams: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.language_model_from not in (None, "base"):
            raise ValueError(f"language_model_from must be None (a fresh language model) or 'base', got "
                             f"{self.language_model_from!r}")
        if self.base_finetune is not None and self.language_model_from != "base":
            raise ValueError("base_finetune fine-tunes the base the diffusion VLM starts from: it needs "
                             "language_model_from='base'")
        if self.finetune is not None and self.finetune.answer_length != self.train.answer_length:
            raise ValueError(f"finetune.answer_length ({self.finetune.answer_length}) must equal train.answer_length "
                             f"({self.train.answer_length}): both stages train the same window")
        if self.block_length is not None and (self.block_length < 1 or self.train.answer_length % self.block_length):
            raise ValueError(f"block_length {self.block_length} must divide answer_length {self.train.answer_length}")
        if self.seeds is not None:
            self.seeds = tuple(self.seeds)
            if not self.seeds or len(set(self.seeds)) != len(self.seeds):
                raise ValueError(f"seeds must be distinct and at least one, got {self.seeds!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def varied(self) -> bool:
        return bool({"describe_varied", "describe_phrased"} & set(self.tasks + (self.finetune_tasks if self.finetune
                                                                                else ())))

    @property
    def training_seeds(self) -> tuple[int, ...]:
        return self.seeds if self.seeds is not None else (self.train.seed,)


MPS_SWEEP = ("lam", "k")  # sweep parameters of the released MPS
PROJECTION_SWEEP = ("prior", "center", "layers", "projection_lam")  # of our earlier reading of MPS (MPS_PROJECTION)
MRS_MODE_SWEEP = {"amplitude_beta": "amplitude", "frequency_beta": "frequency"}  # our readings of MRS (MRS_GAINS)


class _Runner:
    """The held-out scenes' describe prompts, encoded once, and ``run``: one sampling of them by the world diffusion
    model through ``keepsight.inference.Pipeline`` (its encoding, sampler call and end-of-answer cut), scored."""

    def __init__(self, model, processor, samples: WorldSamples, gen_length: int, varied: bool = False,
                 block_length: int | None = None):
        self.model, self.processor, self.samples, self.gen_length = model, processor, samples, gen_length
        self.varied = varied  # descriptions read with the varied phrasings
        # block_length None: one block over the whole window (the runs that name no sampler)
        self.pipe = Pipeline.from_model(model, processor, gen_length=gen_length, block_length=block_length)
        prompt = self.pipe.chat_prompt(DESCRIBE_PROMPT, 1)
        self.enc = self.pipe.encode([prompt] * len(samples), [[im] for im in samples.images])
        self.prompt_len = self.enc["input_ids"].shape[1]  # same text, same image size: no padding
        tok = processor.tokenizer
        with torch.no_grad():
            self.top10 = set(lone_mask_logits(model, tok.mask_token_id).topk(10).indices.tolist())
        self.top10_tokens = tok.convert_ids_to_tokens(sorted(self.top10))

    def method(self, name: str, mps_kw: dict, mrs_kw: dict, readings: bool = False) -> contextlib.AbstractContextManager:
        """``name`` applied to the runner's model: none, MPS, MRS or both from the method registry (the Pipeline's
        ``Decoders``: MPS fitted on the model, MRS from the first generation column; ``readings``: our earlier
        readings of each in their place), or a RoPE-extension baseline (NTK-aware / YaRN at factor 2, the MRS paper's
        comparison)."""
        if name in ("ntk", "yarn"):
            return RoPEBaseline(name, factor=2.0).apply(self.model)
        mps, mrs = (MPS_PROJECTION, MRS_GAINS) if readings else ("mps", "mrs")
        requests = [(m, kw) for m, label, kw in ((mps, "mps", mps_kw), (mrs, "mrs", mrs_kw)) if name in (label, "both")]
        decoders = Decoders(requests, family="diffusion").prepare(self.model, self.processor.tokenizer)
        return decoders.applied(self.model, self.prompt_len)

    @torch.no_grad()
    def run(self, steps: int, name: str = "none", mps_kw: dict | None = None, mrs_kw: dict | None = None,
            callback=None, sampler: dict | None = None, readings: bool = False) -> dict:
        with self.method(name, mps_kw or {}, mrs_kw or {}, readings):
            t0 = time.perf_counter()
            out = self.pipe.diffuse(self.enc, steps=steps, callback=callback, **(sampler or {}))
            seconds = time.perf_counter() - t0
        texts = self.pipe.texts(out.generated)
        gen = out.generated.tolist()
        eos = self.processor.tokenizer.eos_token_id
        repeats = [b for row in gen for a, b in zip(row, row[1:]) if a == b and b != eos]
        ch = chair(texts, self.samples.scenes, varied=self.varied, cells=self.samples.config.cells)
        return {
            "steps": steps, "method": name, "seconds": seconds, "forwards": out.forwards,
            "positions_per_answer": out.token_forwards / len(texts),
            "distinct_2": distinct_n(texts, 2),
            "repetition_ratio": sum(repetition_ratio(t) for t in texts) / len(texts),
            "repeats": len(repeats),
            "repeats_in_mask_top10": sum(r in self.top10 for r in repeats) / len(repeats) if repeats else None,
            "chair_i": ch["chair_i"], "chair_s": ch["chair_s"], "hallucination_rate": ch["hallucination_rate"],
            "object_recall": ch["object_recall"], "exact_recall": ch["exact_recall"],
            "object_recall_chance": ch["object_recall_chance"],
            "object_recall_above_chance": ch["object_recall"] - ch["object_recall_chance"],
            "example": texts[0],
        }


def prior_cosine_per_step(runner: _Runner, steps: int, mps_kw: dict) -> dict:
    """Mean |cos| of still-masked hidden states to the released MPS's prior subspace (centred on its mu) at every
    sampler step, with and without MPS: the LM head's input, where it acts, captured after its own hook."""
    fitted = MaskPriorSuppression(**mps_kw).fit(runner.model, runner.processor.tokenizer)
    return {name: _cosine_curve(runner, steps, name, mps_kw, fitted.U, fitted.mu) for name in ("none", "mps")}


def _cosine_curve(runner: _Runner, steps: int, name: str, mps_kw: dict, U: torch.Tensor,
                  mu: torch.Tensor) -> list[float]:
    mask_id = runner.processor.tokenizer.mask_token_id
    curve: list[float] = []
    ids_box: dict = {}

    def grab(module, args, kwargs):
        ids_box["ids"] = kwargs.get("input_ids", args[0] if args else None)

    def keep(module, args, output):
        h = output[0] if isinstance(output, tuple) else output  # [B, T, d]
        where = ids_box["ids"] == mask_id  # [B, T]
        if where.any():
            curve.append(float(prior_cosine(h[where].float(), U, mu).abs().mean()))

    handles = [runner.model.register_forward_pre_hook(grab, with_kwargs=True)]
    with runner.method(name, mps_kw, {}):
        handles.append(decoder_stack(runner.model).norm.register_forward_hook(keep))  # after MPS's hook
        try:
            runner.run(steps)
        finally:
            for h in handles:
                h.remove()
    return curve


def attention_by_distance(runner: _Runner, steps: int, mrs_kw: dict, betas) -> dict:
    """``RoPEAttentionProbe`` results (all layers, 3 frequency bands, distance bins of 8) while sampling the
    runner's scenes, with no MRS and with MRS at each beta; each entry also carries recall and CHAIRi."""
    mask_id = runner.processor.tokenizer.mask_token_id
    out = {}
    for label, kw in [("none", None)] + [(f"MRS beta={b:g}", {**mrs_kw, "beta": b}) for b in betas]:
        with RoPEAttentionProbe(runner.model, gen_start=runner.prompt_len, mask_token_id=mask_id) as probe:
            r = runner.run(steps, "none" if kw is None else "mrs", mrs_kw=kw)
        out[label] = {**probe.result(), "mrs": kw, "object_recall": r["object_recall"], "chair_i": r["chair_i"]}
    return out


def mps_effect(runner: _Runner, mps_kw: dict, lams) -> dict:
    """What the released MPS does where it acts, on the sampler's first forward (the runner's prompts, every
    generation slot masked): the fit's state norms (the decoder layers' outputs and the final norm's, for the mean
    input embedding), and per ``lam`` the mean gate ``cos(z, u)``, the move ``|dh| / |h|`` of the LM head's input, the
    probability the mask prior's top-10 tokens get before / after, and the share of slots whose argmax changes."""
    model, tok = runner.model, runner.processor.tokenizer
    fitted = MaskPriorSuppression(**mps_kw).fit(model, tok)
    stack = decoder_stack(model)
    states = released_states(model, stack.embed_tokens.weight.detach().mean(0))  # [L, d]
    n = len(runner.samples)
    ids = torch.cat([runner.enc["input_ids"], torch.full((n, runner.gen_length), tok.mask_token_id)], 1)  # [B, P + G]
    box: dict = {}
    handle = stack.norm.register_forward_hook(lambda module, args, out: box.__setitem__("h", out))
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=runner.enc["pixel_values"])
    finally:
        handle.remove()
    h = box["h"][:, -runner.gen_length:].detach().float()  # [B, G, d]: the LM head's input at the masked slots
    head = model.get_output_embeddings().weight.detach().float()  # [V, d]
    top10 = sorted(runner.top10)
    gate = fitted.released_gate(h)[1]  # [B, G]
    before = (h @ head.T).softmax(-1)  # [B, G, V]
    where = torch.ones(h.shape[:2], dtype=torch.bool)
    rows = []
    for lam in lams:
        fitted.lam = float(lam)
        new = fitted.suppress(h, where)  # [B, G, d]
        after = (new @ head.T).softmax(-1)
        rows.append({"lam": float(lam), "move": float(((new - h).norm(dim=-1) / h.norm(dim=-1)).mean()),
                     "top10_before": float(before[..., top10].sum(-1).mean()),
                     "top10_after": float(after[..., top10].sum(-1).mean()),
                     "argmax_changed": float((before.argmax(-1) != after.argmax(-1)).float().mean())})
    return {"state_norms": states.norm(dim=-1).tolist(), "mu_norm": float(fitted.mu.norm()),
            "h_norm": float(h.norm(dim=-1).mean()), "gate": float(gate.mean()), "by_lam": rows}


METRICS = ("distinct_2", "repetition_ratio", "repeats_in_mask_top10", "chair_i", "hallucination_rate", "object_recall",
           "object_recall_above_chance", "exact_recall")


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def over_seeds(runs: list[dict]) -> dict:
    """Every seed's grid and sweeps as a mean with a 95% t interval per metric, and each method's paired difference
    from no method at the same T (``vs_none``; a sweep's from no method at the sweep's T, where the grid has it)."""
    def cell(rows: list[dict]) -> dict:
        return {m: mean_ci([r[m] for r in rows]) for m in METRICS}

    grids = [{(r["steps"], r["method"]): r for r in run["grid"]} for run in runs]
    keys = list(grids[0])
    grid = [{"steps": t, "method": m, **cell([g[(t, m)] for g in grids])} for t, m in keys]
    vs_none = [{"steps": t, "method": m, **{k: mean_ci([_minus(g[(t, m)][k], g[(t, "none")][k]) for g in grids])
                                             for k in METRICS}}
               for t, m in keys if m != "none" and (t, "none") in grids[0]]
    sweeps = []
    for i, s in enumerate(runs[0]["sweeps"]):
        rows = [run["sweeps"][i] for run in runs]
        t = s["steps"]
        ref = [g.get((t, "none")) for g in grids]
        diff = ({k: mean_ci([_minus(r[k], n[k]) for r, n in zip(rows, ref)]) for k in METRICS} if all(ref) else {})
        sweeps.append({"param": s["param"], "value": s["value"], "steps": t, **cell(rows), "vs_none": diff})
    return {"n": len(runs), "grid": grid, "vs_none": vs_none, "sweeps": sweeps}


def _train_model(exp: DiffusionExperiment, ctx: ExperimentContext, seed: int) -> tuple[Path, dict]:
    """The diffusion VLM of training seed ``seed`` (trained, or reused from the cache): its directory and summary."""
    base_dir, train, log = ctx.model_dir, ctx.scenes(), ctx.log
    cfg = replace(exp.train, seed=seed)
    # training_code 2: batches after the first epoch no longer follow the global RNG (which the masking
    # objective advances), so the same configuration trains a different model than keepsight <= 0.1 did
    spec = {**asdict(cfg), "tasks": list(exp.tasks), "describe_repeats": exp.describe_repeats, "training_code": 2}
    if exp.text_layers is not None:
        spec["text_layers"] = exp.text_layers
    if exp.varied_repeats is not None:
        spec["varied_repeats"] = exp.varied_repeats
    lm_from = base_dir if exp.language_model_from == "base" else None
    if lm_from is not None:
        spec["language_model_from"] = "base"
    if exp.base_finetune is not None:  # one fine-tuned base for every seed
        spec["base_finetune"] = asdict(exp.base_finetune)
        lm_from = Path(f"{base_dir}-diffusion") / f"base-describe-{digest(spec['base_finetune'], 12)}"
        log(f"the base fine-tuned on descriptions ({exp.base_finetune.steps} steps) -> {lm_from}")
        train_finetune(base_dir, VLMDataset(train, ("describe",), exp.base_finetune.seed), lm_from,
                       exp.base_finetune, progress=False)
    key = digest(spec, 12)
    model_dir = Path(f"{base_dir}-diffusion") / f"llada-v-{key}"
    log(f"masked-diffusion VLM ({cfg.steps} steps, seed {seed}) -> {model_dir}")
    data = VLMDataset(train, exp.tasks, cfg.seed, describe_repeats=exp.describe_repeats,
                      varied_repeats=exp.varied_repeats)
    summary = train_diffusion(lambda: llada_v_init(base_dir, cfg.seed, exp.text_layers, language_model_from=lm_from),
                              data, model_dir, cfg, progress=False, source=str(base_dir),
                              language_model_from="" if lm_from is None else str(lm_from))
    if exp.finetune is not None:
        tune = replace(exp.finetune, seed=exp.finetune.seed + seed - exp.train.seed)
        spec["finetune"] = {**asdict(tune), "tasks": list(exp.finetune_tasks)}
        key = digest(spec, 12)
        stage1, model_dir = model_dir, Path(f"{base_dir}-diffusion") / f"llada-v-{key}"
        log(f"  fine-tuned on {list(exp.finetune_tasks)} ({tune.steps} steps) -> {model_dir}")
        data = VLMDataset(train, exp.finetune_tasks, tune.seed, describe_repeats=exp.describe_repeats,
                          varied_repeats=exp.varied_repeats)
        first = summary
        summary = train_diffusion(lambda: load_checkpoint(stage1, dtype=None, device="cpu", expect="diffusion"), data,
                                  model_dir, tune, progress=False, source=str(stage1))
        summary = {**summary, "first_stage": {k: v for k, v in first.items() if k != "log_history"}}
    return model_dir, {k: v for k, v in summary.items() if k != "log_history"}


def _sweeps(runner: _Runner, exp: DiffusionExperiment) -> list[dict]:
    sweeps = []
    T = exp.sweep_steps
    for param, values in exp.sweeps.items():
        for v in values:
            if param in MPS_SWEEP:
                r = runner.run(T, "mps", {**exp.mps, param: v})
            elif param in PROJECTION_SWEEP:
                r = runner.run(T, "mps", {**exp.mps, param.removeprefix("projection_"): v}, readings=True)
            elif param in MRS_MODE_SWEEP:  # our readings of MRS (amplitude: g_i on the logit part; frequency: / g_i)
                r = runner.run(T, "mrs", mps_kw=None, mrs_kw={**exp.mrs, "mode": MRS_MODE_SWEEP[param], "beta": v},
                               readings=True)
            else:
                r = runner.run(T, "mrs", mps_kw=None, mrs_kw={**exp.mrs, param: v})
            sweeps.append({"param": param, "value": v, **{k: r[k] for k in r if k != "example"}})
    return sweeps


def _one_seed(exp: DiffusionExperiment, ctx: ExperimentContext, eval_scenes: WorldSamples, seed: int,
              first: bool) -> dict:
    """One training seed's model and its runs (the first seed's also the fast samplers and the analyses)."""
    log = ctx.log
    model_dir, summary = _train_model(exp, ctx, seed)
    model, processor = load_checkpoint(model_dir, dtype=None, device="cpu")
    runner = _Runner(model, processor, eval_scenes, exp.train.answer_length, exp.varied, exp.block_length)
    grid = []
    for steps in exp.steps_grid:
        for name in ("none", "mps", "mrs", "both", "ntk", "yarn"):
            log(f"  sampling {len(eval_scenes)} descriptions, T = {steps}, {name}")
            grid.append(runner.run(steps, name, exp.mps, exp.mrs))
    out = {"seed": seed, "model_dir": str(model_dir), "training": summary, "mask_prior_top10": runner.top10_tokens,
           "grid": grid, "sweeps": _sweeps(runner, exp)}
    if exp.effect_lams:
        out["mps_effect"] = mps_effect(runner, exp.mps, exp.effect_lams)
    if not first:
        return out
    fast = []
    n_blocks = exp.train.answer_length // exp.sampler_block
    for steps in [t for t in exp.steps_grid if t % n_blocks == 0]:
        for label, kw in exp.samplers.items():
            log(f"  sampling {len(eval_scenes)} descriptions, T = {steps}, {label} sampler (block {exp.sampler_block})")
            r = runner.run(steps, sampler={"block_length": exp.sampler_block, **kw})
            fast.append({"sampler": label, **{k: v for k, v in r.items() if k != "method"}})
    log("  prior cosine per step, with and without MPS")
    cos = prior_cosine_per_step(runner, exp.steps_grid[-1], exp.mps)
    T = exp.sweep_steps
    log(f"  attention by distance and RoPE band, T = {T}, MRS betas {list(exp.attention_betas)}")
    attention = attention_by_distance(runner, T, exp.mrs, exp.attention_betas)
    return {**out, "fast": fast, "prior_cosine": cos, "attention": attention}


SEED_KEYS = ("seed", "model_dir", "training", "grid", "sweeps", "mps_effect")  # what ``seeds`` keeps of each seed


def run_diffusion_experiment(exp: DiffusionExperiment, ctx: ExperimentContext) -> dict:
    """Train (or reuse) the diffusion VLM of each training seed and run the grid, the sweeps and the analyses on
    held-out scenes. The first seed's results sit at the top level; with several seeds, ``seeds`` holds each one's
    and ``over_seeds`` their means and intervals."""
    eval_scenes = WorldSamples.from_scenes(ctx.world, world_scenes(ctx.world, exp.n_scenes, seed=exp.scene_seed,
                                                               n_objects=exp.n_objects))
    runs = [_one_seed(exp, ctx, eval_scenes, seed, i == 0) for i, seed in enumerate(exp.training_seeds)]
    out = {"config": exp.to_dict(), **{k: v for k, v in runs[0].items() if k != "seed"}, "paper": PAPER}
    if len(runs) > 1:
        out["seeds"] = [{k: r[k] for k in SEED_KEYS if k in r} for r in runs]
        out["over_seeds"] = over_seeds(runs)
    return out
