"""``keepsight demo``: build the world, train (or reuse) the base model, evaluate and diagnose it, run each
method's experiment against it (PVM arms, MLP vs LIA-MTR, the masked-diffusion VLM with MPS / MRS), and
write the report.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from .atomic import write_json
from .experiments.bridge import BridgeExperiment, run_bridge_experiment
from .experiments.diffusion import DiffusionExperiment, run_diffusion_experiment
from .experiments.pvm import PVMExperiment, run_pvm_experiment
from .report.html import fmt, img_tag, table, write_report
from .report.plots import plot_accuracy_by_index, plot_arms_by_index, plot_diagnosis
from .report.summary import summary_markdown
from .train.diffusion import DiffusionTrainConfig
from .train.lora_control import LoRATrainConfig
from .train.pvm_grpo import GRPOTrainConfig
from .train.pvm_sft import PVMTrainConfig
from .world.config import WorldConfig, world_config
from .world.data import WorldSamples
from .world.dataset import generate
from .world.render import png_bytes
from .world.train import StageConfig, TrainConfig, train_base

TRAIN_SEED, EVAL_SEED, DILUTION_SEED = 1, 2, 3  # disjoint scene streams for train / eval / dilution


@dataclass
class DemoProfile:
    name: str
    n_train: int  # training scenes
    n_eval: int  # held-out scenes (mixed object counts): yes/no, open answers, CHAIR
    n_dilution: int  # held-out scenes at a fixed object count: accuracy by index
    train: TrainConfig = field(default_factory=TrainConfig)
    world: WorldConfig = field(default_factory=world_config)
    dilution_objects: int | None = None  # default: the world's max_objects
    pvm: PVMExperiment | None = None  # the PVM arms (None: skip)
    bridge: BridgeExperiment | None = None  # the LIA-MTR vs MLP arms (None: skip)
    diffusion: DiffusionExperiment | None = None  # the masked-diffusion VLM with MPS / MRS (None: skip)


PROFILES = {
    "smoke": DemoProfile(
        name="smoke", n_train=160, n_eval=16, n_dilution=16,
        train=TrainConfig(
            lm=StageConfig(20, 3e-3, 16), vision=StageConfig(20, 2e-3, 16),
            align=StageConfig(10, 2e-3, 16), instruct=StageConfig(20, 1e-3, 16), save_every=10,
        ),
        pvm=PVMExperiment(
            sft=PVMTrainConfig(steps=8, save_every=1000), lora=LoRATrainConfig(steps=8, save_every=1000),
            grpo=GRPOTrainConfig(steps=2, num_generations=2, prompts_per_step=2, max_completion_length=24,
                                 save_every=1000),
            n_grpo_scenes=16,
        ),
        bridge=BridgeExperiment(),
        diffusion=DiffusionExperiment(train=DiffusionTrainConfig(steps=10, save_every=1000), n_scenes=4,
                                      steps_grid=(4,), sweep_steps=4, sweeps={"lam": [0.3], "beta": [0.1]}),
    ),
    "full": DemoProfile(
        name="full", n_train=4000, n_eval=200, n_dilution=150,
        train=TrainConfig(
            lm=StageConfig(250, 3e-3, 32), vision=StageConfig(400, 2e-3, 32),
            align=StageConfig(200, 2e-3, 16), instruct=StageConfig(4000, 2e-3, 16), save_every=200,
        ),
        pvm=PVMExperiment(grpo=GRPOTrainConfig(steps=150)),
        bridge=BridgeExperiment(),
        diffusion=DiffusionExperiment(),
    ),
}


def cache_key(profile: DemoProfile) -> str:
    """Hash of everything that determines the trained base model (world, data, training, version)."""
    blob = json.dumps(
        {"world": profile.world.to_dict(), "n_train": profile.n_train, "seed": TRAIN_SEED,
         "train": profile.train.to_dict(), "keepsight": __version__},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def log(msg: str) -> None:
    print(f"[keepsight demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_demo(profile_name: str = "full", runs_dir: str | Path = "runs", name: str | None = None,
             retrain: bool = False) -> dict:
    """Run the demo; returns the results dict also written to ``runs/<name>/results.json``."""
    if profile_name not in PROFILES:
        raise ValueError(f"unknown demo profile {profile_name!r}; choose from {sorted(PROFILES)}")
    from .experiments.arm import EvalSets, evaluate_arm
    from .report.bridge import bridge_markdown, bridge_sections
    from .report.diffusion import diffusion_markdown, diffusion_sections, plot_attention
    from .report.pvm import pvm_markdown, pvm_sections
    from .world.evaluate import load_vlm

    profile = PROFILES[profile_name]
    runs_dir = Path(runs_dir)
    out = runs_dir / (name or profile.name)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    timings: dict[str, float] = {}
    cfg = profile.world

    key = cache_key(profile)
    model_dir = runs_dir / "cache" / f"base-{key}"
    if retrain and model_dir.exists():
        shutil.rmtree(model_dir)
    train = None
    if (model_dir / "config.json").is_file():
        log(f"reusing cached base model {model_dir}")
        stages = {s: json.loads((model_dir / "stages" / s / "keepsight_stage.json").read_text())
                  for s in ("lm", "vision", "align", "instruct")}
    else:
        log(f"building {profile.n_train} training scenes")
        train = _training_scenes(profile)
        log(f"training the base model in 4 stages -> {model_dir}")
        stages = train_base(model_dir, profile.train, train)
    timings["train_s"] = time.time() - t0

    t1 = time.time()
    model, processor = load_vlm(model_dir)
    eval_set = WorldSamples.from_scenes(cfg, generate(cfg, profile.n_eval, seed=EVAL_SEED))
    k = profile.dilution_objects or cfg.max_objects
    dil_set = WorldSamples.from_scenes(cfg, generate(cfg, profile.n_dilution, seed=DILUTION_SEED, n_objects=k))
    sets = EvalSets(eval_set, dil_set, WorldSamples(cfg, dil_set.scenes[:32], dil_set.images[:32]))
    log("evaluating the base model")
    base = evaluate_arm(model, processor, sets, log)
    timings["eval_s"] = time.time() - t1

    pvm = None
    if profile.pvm is not None:
        t2 = time.time()
        train = train if train is not None else _training_scenes(profile)
        pvm = run_pvm_experiment(profile.pvm, model_dir, train, sets, base, log)
        timings["pvm_s"] = time.time() - t2
    bridge = None
    if profile.bridge is not None:
        t3 = time.time()
        train = train if train is not None else _training_scenes(profile)
        bridge = run_bridge_experiment(profile.bridge, model_dir, profile.train, train, sets, base, log)
        timings["bridge_s"] = time.time() - t3
    diffusion = None
    if profile.diffusion is not None:
        t4 = time.time()
        train = train if train is not None else _training_scenes(profile)
        dx = profile.diffusion
        d_set = WorldSamples.from_scenes(cfg, generate(cfg, dx.n_scenes, seed=DILUTION_SEED + 1,
                                                       n_objects=dx.n_objects))
        diffusion = run_diffusion_experiment(dx, model_dir, train, d_set, log)
        timings["diffusion_s"] = time.time() - t4

    samples = [
        {"id": s.id, "truth": t, "generated": g}
        for s, t, g in zip(eval_set.scenes[:6], _truths(eval_set)[:6], base["texts"])
    ]
    results = {
        "keepsight": __version__,
        "profile": profile.name,
        "world": cfg.to_dict(),
        "train": profile.train.to_dict(),
        "model_dir": str(model_dir),
        "base": {
            "stages": {s: {k2: v.get(k2) for k2 in ("first_loss", "last_loss")} for s, v in stages.items()},
            **{k2: v for k2, v in base.items() if k2 != "texts"},
            "samples": samples,
        },
        **({"pvm": pvm} if pvm else {}),
        **({"bridge": bridge} if bridge else {}),
        **({"diffusion": diffusion} if diffusion else {}),
        "timings": {**timings, "total_s": time.time() - t0},
    }
    write_json(out / "results.json", results)
    plot = plot_accuracy_by_index(base["dilution"]["by_index"], out / "dilution.png",
                                  f"base model, scenes with {k} objects (n={len(dil_set)})")
    diag_plots = plot_diagnosis(base["diagnosis"], out / "diagnosis", f"base model, {k} objects")
    sections = _base_sections(results, eval_set, plot) + [_diagnosis_section(base["diagnosis"], diag_plots)]
    summary = summary_markdown(results)
    if pvm:
        arm_plot = plot_arms_by_index({a: v["dilution"]["by_index"] for a, v in pvm["arms"].items()},
                                      out / "pvm_by_index.png", f"exact accuracy by index, {k} objects")
        sections += pvm_sections(pvm, arm_plot)
        summary += "\n" + pvm_markdown(pvm)
    if bridge:
        sections += bridge_sections(bridge)
        summary += "\n" + bridge_markdown(bridge)
    if diffusion:
        att_plot = plot_attention(diffusion["attention"], out / "diffusion_attention.png")
        sections += diffusion_sections(diffusion, att_plot)
        summary += "\n" + diffusion_markdown(diffusion)
    write_report(out / "report.html", f"keepsight demo ({profile.name})", sections, results)
    print(summary, flush=True)
    log(f"wrote {out / 'results.json'} and {out / 'report.html'} in {time.time() - t0:.0f}s")
    return results


def _training_scenes(profile: DemoProfile) -> WorldSamples:
    return WorldSamples.from_scenes(profile.world, generate(profile.world, profile.n_train, seed=TRAIN_SEED))


def _truths(samples: WorldSamples) -> list[str]:
    from .world.texts import description

    return [description(s) for s in samples.scenes]


def _base_sections(results: dict, eval_set: WorldSamples, plot: Path) -> list[tuple[str, str]]:
    b = results["base"]
    yn = b["yes_no"]["categories"]
    yn_rows = [[c, v["n"], v["acc"], v["acc_plus"], v["score"]] for c, v in yn.items()]
    yn_rows.append(["total (MME score)", "", b["yes_no"]["overall_acc"], "", b["yes_no"]["total"]])
    ch = b["descriptions"]["chair"]
    chair_rows = [[k, ch[k]] for k in ("chair_i", "chair_s", "recall", "hallucination_rate",
                                       "attribute_error_rate", "object_recall", "exact_recall")]
    dil = b["dilution"]
    idx_rows = [[r["index"] + 1, r["n"], r["named"], r["colour"], r["shape"], r["size"], r["exact"],
                 r["colour_counter_prior"], r["shape_counter_prior"]] for r in dil["by_index"]]
    samples = ""
    by_id = {s.id: (s, im) for s, im in zip(eval_set.scenes, eval_set.images)}
    for smp in b["samples"]:
        _, im = by_id[smp["id"]]
        samples += (f"<div class=s>{img_tag(png_bytes(im), smp['id'])}<div><p><b>truth</b>: {fmt(smp['truth'])}"
                    f"</p><p><b>generated</b>: {fmt(smp['generated'])}</p></div></div>")
    stage_rows = [[s, v["first_loss"], v["last_loss"]] for s, v in b["stages"].items()]
    t = results["timings"]
    return [
        ("Base model", f"<p>Model: <code>{fmt(results['model_dir'])}</code>; train {t['train_s']:.0f}s, "
                       f"eval {t['eval_s']:.0f}s.</p>" + table(["stage", "first loss", "last loss"], stage_rows)),
        ("Yes/no by category (held out)", table(["category", "n", "acc", "acc+", "score"], yn_rows)),
        ("Open answers (exact match)", table(["kind", "acc"], [[k, v] for k, v in b["open"].items()])),
        ("Descriptions: CHAIR against the scene graph", table(["metric", "value"], chair_rows)),
        (f"Dilution: accuracy by object index ({dil['n_objects']} objects per scene)",
         img_tag(plot.read_bytes(), "accuracy by index")
         + table(["index", "n", "named", "colour", "shape", "size", "exact", "colour (counter-prior)",
                  "shape (counter-prior)"], idx_rows)
         + f"<p>Least-squares slope per index step: exact {fmt(dil['slope_exact'], 4)}, colour "
           f"{fmt(dil['slope_colour'], 4)}, counter-prior colour {fmt(dil['slope_colour_counter_prior'], 4)}.</p>"),
        ("Samples", samples),
    ]


def _diagnosis_section(diag: dict, plots: dict[str, Path]) -> tuple[str, str]:
    n = len(diag["slope_by_layer"])
    rows = [[f"layer {i}", diag["slope_by_layer"][i], diag["tvr_by_layer"][i][-1], diag["top1_agree_by_layer"][i],
             diag["kl_by_layer"][i]] for i in range(n)]
    body = (
        f"<p>Generating the long description for {diag['n_samples']} scenes (greedy, up to "
        f"{diag['max_new_tokens']} tokens). Omega_V against the number of text tokens t in context: "
        f"fitted log-log slope <b>{fmt(diag['slope'])}</b> (paper: about -1); TVR plateau (median of the "
        f"last quarter of steps) <b>{fmt(diag['tvr_plateau'], 1)}</b> (paper: near 1e2); mean LogitLens "
        f"convergence layer {fmt(diag['convergence_layer_mean'], 2)} of {n}.</p>"
        + "".join(img_tag(p.read_bytes(), name) for name, p in plots.items())
        + table(["layer", "Omega_V slope", "TVR at last step", "LogitLens top-1 agreement", "KL(final||layer)"],
                rows)
    )
    return ("Dilution diagnostics: visual attention mass, TVR, LogitLens", body)
