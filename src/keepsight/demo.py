"""``keepsight demo``: build the world, train (or reuse) the base model, evaluate and diagnose it, run each
method's experiment against it (PVM arms, MLP vs LIA-MTR, the masked-diffusion VLM with MPS / MRS), and
write the report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from .atomic import check_output_dir, mark, write_json, write_text
from .determinism import DEFAULT_THREADS, SOURCE_ROOT, configured, cpu_kind, provenance, source_digest
from .experiments.aggregate import aggregate
from .experiments.arm import EvalSets, ExperimentContext, evaluate_arm
from .experiments.baselines import ARMS as BASELINE_ARMS
from .experiments.baselines import BEAM_ARMS, BaselinesExperiment, run_baselines_experiment
from .experiments.bridge import BridgeExperiment, run_bridge_experiment
from .experiments.diffusion import DiffusionExperiment, run_diffusion_experiment
from .experiments.pvm import PVMExperiment, run_pvm_experiment
from .experiments.pvm_control import PVMControl, run_pvm_control
from .fingerprint import digest
from .models import load_checkpoint
from .pvm import PVMConfig
from .report.base import base_sections, diagnosis_section
from .report.baselines import baselines_markdown, baselines_report
from .report.bridge import bridge_markdown, bridge_report
from .report.claims import claims_markdown, claims_section, claims_table
from .report.compare import moved_numbers
from .report.control import control_markdown, control_sections
from .report.diffusion import diffusion_markdown, diffusion_report
from .report.html import write_report
from .report.plots import plot_accuracy_by_index, plot_diagnosis
from .report.pvm import pvm_markdown, pvm_report
from .report.seeds import seeds_markdown, seeds_sections
from .report.summary import summary_markdown
from .train.diffusion import DiffusionTrainConfig
from .train.finetune import FinetuneConfig
from .train.lora_control import LoRATrainConfig
from .train.pvm_grpo import GRPOTrainConfig
from .train.pvm_sft import PVMTrainConfig
from .world.base import BASE_RECIPE, GROUNDED_RECIPE, REGIME_RECIPE, StageConfig, TrainConfig, train_base
from .world.config import WorldConfig, world_config
from .world.dataset import generate_scenes
from .world.render import png_bytes
from .world.tasks import INSTRUCT_TASKS, WorldSamples
from .world.texts import description

TRAIN_SEED, EVAL_SEED, DILUTION_SEED = 1, 2, 3  # disjoint scene streams for train / eval / dilution
RUNS_KIND, RUN_KIND = "runs", "demo-run"  # keepsight's markers in --runs and in each run directory


@dataclass(frozen=True)
class Experiment:
    """One entry of the demo's experiment table: how it runs on the base, and how it is reported."""

    run: Callable[[object, ExperimentContext], dict]  # (its profile config, context) -> results
    report: Callable[[dict, Path], list[tuple[str, str]]]  # (results, run dir) -> HTML sections
    markdown: Callable[[dict], str]  # results -> the printed summary


# name -> entry, in the order the demo runs them; a profile's field of the same name configures each (None: skip)
EXPERIMENTS: dict[str, Experiment] = {
    "pvm": Experiment(run_pvm_experiment, pvm_report, pvm_markdown),
    "bridge": Experiment(run_bridge_experiment, bridge_report, bridge_markdown),
    "diffusion": Experiment(run_diffusion_experiment, diffusion_report, diffusion_markdown),
    "baselines": Experiment(run_baselines_experiment, baselines_report, baselines_markdown),
    "control": Experiment(run_pvm_control, control_sections, control_markdown),
}


# PVM in the experiments: the block as released (keepsight.pvm.block; on the 128-wide base its latent width resolves
# to 32, one head), stage 1 with the release's schedule (cosine, 10% warm-up, one learning rate for every PVM
# parameter, the gate included) at the world's learning rate and budget
PVM_BLOCK = PVMConfig()
PVM_SFT = PVMTrainConfig(warmup_ratio=0.1)

# the PVM arms trained with the regime's own format (describe_ask) beside the instruct mix
REGIME_ASK = PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT, grpo=GRPOTrainConfig(steps=150), train_tasks=("describe_ask",))

# the training-free baselines at their released defaults
RELEASED_BASELINES = {k: BASELINE_ARMS[k] for k in ("vcd", "pai", "memvr", "deco")}

# LIA-MTR's readings of "log-linearly spaced" decays and a "token-wise" gate (LiaMtrConfig.lambda_spacing / gate)
LIA_READINGS = ({}, {"lambda_spacing": "half_life"}, {"gate": "token"}, {"lambda_spacing": "half_life", "gate": "token"})


@dataclass
class DemoProfile:
    name: str
    n_train: int  # training scenes
    n_eval: int  # held-out scenes (mixed object counts): yes/no, open answers, CHAIR
    n_dilution: int  # held-out scenes at a fixed object count: accuracy by index
    train: TrainConfig = field(default_factory=TrainConfig)
    world: WorldConfig = field(default_factory=world_config)
    dilution_objects: int | None = None  # default: the world's max_objects
    seeds: tuple[int, ...] = (0,)  # base model seeds: every experiment runs on the base of each
    pvm: PVMExperiment | None = None  # the PVM arms (None: skip)
    bridge: BridgeExperiment | None = None  # the LIA-MTR vs MLP arms (None: skip)
    diffusion: DiffusionExperiment | None = None  # the masked-diffusion VLM with MPS / MRS (None: skip)
    baselines: BaselinesExperiment | None = None  # VCD / PAI / MemVR / DeCo beside PVM (None: skip)
    control: PVMControl | None = None  # PVM's mechanism control: the image only in PVM's memory (None: skip)


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
            finetune=FinetuneConfig(steps=8, save_every=1000), n_grpo_scenes=16,
        ),
        bridge=BridgeExperiment(),
        diffusion=DiffusionExperiment(train=DiffusionTrainConfig(steps=10, save_every=1000), n_scenes=4,
                                      steps_grid=(4,), sweep_steps=4, sweeps={"lam": [0.3], "beta": [0.1]}),
        baselines=BaselinesExperiment(arms=RELEASED_BASELINES,
                                      beam_arms={"opera": BEAM_ARMS["opera"]}, beam_scenes=2,
                                      pvm=PVMExperiment(sft=PVMTrainConfig(steps=8, save_every=1000)),
                                      timing_scenes=2, timing_repeats=1),
        control=PVMControl(sft=PVMTrainConfig(steps=8, save_every=1000), lora=LoRATrainConfig(steps=8, save_every=1000),
                           ablations={"pvm_sft_no_output_norm": {"output_norm": False}}),
    ),
    # the default (`keepsight demo`, about 30 minutes on 2 cores): the base, its dilution diagnosis and
    # multi-turn regime, the PVM arms (with the LoRA control and full fine-tuning), the diffusion methods
    "full": DemoProfile(name="full", n_train=4000, n_eval=200, n_dilution=150, train=BASE_RECIPE,
                        pvm=PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT, grpo=GRPOTrainConfig(steps=150)),
                        diffusion=DiffusionExperiment(sweeps={})),
    # `--profile seeds`: three base seeds, every comparison with 95% intervals (PVM arms, MLP vs LIA-MTR)
    "seeds": DemoProfile(name="seeds", n_train=4000, n_eval=200, n_dilution=150, train=BASE_RECIPE, seeds=(0, 1, 2),
                         pvm=PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT, grpo=GRPOTrainConfig(steps=150)), bridge=BridgeExperiment()),
    # `--profile readings`: LIA-MTR's readings (lambda spacing x gate) against the MLP on the seed-0 base (shared with
    # the default and seeds profiles: its base and the default reading come from their caches)
    "readings": DemoProfile(name="readings", n_train=4000, n_eval=200, n_dilution=150, train=BASE_RECIPE,
                            bridge=BridgeExperiment(readings=LIA_READINGS)),
    # `--profile diffusion`: the regime where parallel decoding repeats and the model still describes: a 4-layer
    # LLaDA-V trained on fixed and varied descriptions in equal parts (the fixed order teaches what to say; the varied
    # orders leave several right answers per slot, and slots committed together at few steps repeat one of them), on
    # 3 training seeds over the regime base's vision tower (the regime profile's seed-0 base); MPS / MRS at the
    # released settings, every setting the papers ablate and our earlier readings swept at T = 4, where it repeats;
    # MPS's effect on the LM head's input over lam
    "diffusion": DemoProfile(name="diffusion", n_train=4000, n_eval=200, n_dilution=150, train=REGIME_RECIPE,
                             diffusion=DiffusionExperiment(
                                 tasks=("describe", "describe_varied"), seeds=(0, 1, 2),
                                 # blocks of 16 (LLaDA's semi-autoregressive sampling): over the whole window a model
                                 # trained on eos-filled windows commits eos early
                                 block_length=16, sweep_steps=4, steps_grid=(4, 8, 16, 32, 64),
                                 effect_lams=(0.001, 0.01, 0.03, 0.1, 0.3, 1.0),
                                 sweeps={"lam": [0.001, 0.01, 0.03, 0.1, 0.3, 1.0], "k": [1, 2, 3],
                                         "beta": [0.01, 0.1, 0.5, 1.0], "eta": [4.0, 8.0, 12.0],
                                         "tau0": [0.3, 0.6, 0.9],
                                         "schedule": ["sigmoid", "cosine", "exponential", "linear", "power"],
                                         "projection_lam": [0.1, 0.5], "prior": ["vocab_mean", "topk", "random"],
                                         "center": [False, True], "layers": ["final", [-2], [-3, -1]],
                                         "amplitude_beta": [0.01, 0.1, 0.5, 1.0],
                                         "frequency_beta": [0.01, 0.1, 0.5, 1.0]})),
    # `--profile baselines`: VCD, PAI, MemVR and DeCo (released defaults and a stronger setting), plain beam search and
    # OPERA (on 40 scenes), beside PVM stage 1 on
    # the seed-0 base (shared with the other profiles; PVM's adapter is the default profile's)
    "baselines": DemoProfile(name="baselines", n_train=4000, n_eval=200, n_dilution=150, train=BASE_RECIPE,
                             baselines=BaselinesExperiment(pvm=PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT))),
    # `--profile control`: PVM's mechanism control on the seed-0 base (shared with the other profiles): PVM stage 1 and
    # the matched LoRA trained with the image withheld from the language model, scored the same way
    "control": DemoProfile(name="control", n_train=4000, n_eval=200, n_dilution=150, train=BASE_RECIPE,
                           control=PVMControl(pvm=PVM_BLOCK)),
    # `--profile control-grounded`: the same control on the grounded recipe's base, 3 seeds, the released block beside
    # the LoRA; each arm's prior-balanced yes/no against the text-only level
    "control-grounded": DemoProfile(name="control-grounded", n_train=4000, n_eval=200, n_dilution=150,
                                    train=GROUNDED_RECIPE, seeds=(0, 1, 2), control=PVMControl(pvm=PVM_BLOCK)),
    # `--profile regime`: the regime recipe's base (RoPE base 300: a visual answer falls after the model's own
    # description, and the image shown again recovers most of it), 3 seeds; in that regime every PVM arm (with the
    # LoRA control and full fine-tuning) and each training-free baseline at its released defaults; and on the same
    # bases PVM's mechanism control (the image only in PVM's memory)
    "regime": DemoProfile(name="regime", n_train=4000, n_eval=200, n_dilution=150, train=REGIME_RECIPE, seeds=(0, 1, 2),
                          pvm=PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT, grpo=GRPOTrainConfig(steps=150)),
                          baselines=BaselinesExperiment(arms=RELEASED_BASELINES, beam_arms={}, pvm=None),
                          control=PVMControl(pvm=PVM_BLOCK)),
    # `--profile regime-ask`: the regime profile's bases (shared with it, cached), every PVM arm trained with the
    # regime's own format added to the instruct mix: a description, then a question whose answer follows the image
    # (half the descriptions state one object wrongly; "describe_ask"), so that stage 1 has answers after long text
    # that only the image gives
    "regime-ask": DemoProfile(name="regime-ask", n_train=4000, n_eval=200, n_dilution=150, train=REGIME_RECIPE,
                              seeds=(0, 1, 2), pvm=REGIME_ASK),
    # `--profile regime-format`: the same bases, every PVM arm trained on the regime's format alone (describe_ask is
    # 3% of regime-ask's data: 600 steps see about 270 such answers)
    "regime-format": DemoProfile(name="regime-format", n_train=4000, n_eval=200, n_dilution=150, train=REGIME_RECIPE,
                                 seeds=(0, 1, 2), pvm=dataclasses.replace(REGIME_ASK, instruct_mix=False)),
    # `--profile extended`: a 6-layer base (LogitLens has depth to move) and the PVM arms on it; LIA-MTR's readings
    # and the diffusion regime have their own profiles (readings, diffusion)
    "extended": DemoProfile(
        name="extended", n_train=4000, n_eval=200, n_dilution=150,
        # the 6-layer base keeps the instruct mix without count pairs: with them its instruct stage learned
        # not to look (held-out yes/no 0.55, colour / scene / count at chance; docs/results.md), without them
        # it reached 0.81 with every category >= 0.6
        train=dataclasses.replace(BASE_RECIPE, preset="tiny-llava-6l", instruct_tasks=INSTRUCT_TASKS + ("chat",)),
        pvm=PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT, grpo=GRPOTrainConfig(steps=150))),
}


# what each profile runs, as `keepsight demo --help` lists it
PROFILE_HELP = {
    "full": "the default (about 22 minutes on 2 cores from scratch): the base, its diagnosis and multi-turn regime, "
            "the PVM arms, the diffusion methods",
    "seeds": "three base seeds, PVM and bridge arms with 95% intervals",
    "readings": "LIA-MTR's readings vs the MLP",
    "diffusion": "the varied-description regime on a 4-layer LLaDA-V, 3 training seeds, every MPS / MRS setting "
                 "(about 40 minutes)",
    "baselines": "VCD, PAI, MemVR, DeCo, OPERA beside PVM",
    "control": "PVM's mechanism control (the image only in PVM's memory, against the matched LoRA)",
    "control-grounded": "the same on the grounded base, 3 seeds, on a prior-balanced yes/no set (about 65 minutes)",
    "regime": "the regime recipe's base (a visual answer falls after the model's own description, the image again "
              "recovers it), 3 seeds, every PVM arm, the released baselines and the control there (about 110 minutes)",
    "regime-ask": "the regime profile's bases, every PVM arm trained with the regime's format (a description, then a "
                  "question the image answers) added to its data, 3 seeds",
    "regime-format": "the same with every PVM arm trained on the regime's format alone, 3 seeds",
    "extended": "a 6-layer base and the PVM arms",
    "smoke": "tiny budgets (= --smoke)",
}


def cache_key(profile: DemoProfile, seed: int | None = None, environment: dict | None = None) -> str:
    """Hash of everything that determines a trained base model (world, data, training, version, and the
    environment its bits depend on: ``keepsight.determinism.environment()``); ``seed``: the base's model seed
    (default: the profile's first). Every cache of an experiment lives beside its base's, under this key."""
    train = profile.train if seed is None else dataclasses.replace(profile.train, seed=seed)
    return digest({"world": profile.world.to_dict(), "n_train": profile.n_train, "seed": TRAIN_SEED,
                   "train": train.to_dict(), "keepsight": __version__, "environment": environment})


def log(msg: str) -> None:
    print(f"[keepsight demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _eval_sets(profile: DemoProfile) -> EvalSets:
    cfg = profile.world
    eval_set = WorldSamples.from_scenes(cfg, generate_scenes(cfg, profile.n_eval, seed=EVAL_SEED))
    k = profile.dilution_objects or cfg.max_objects
    dil_set = WorldSamples.from_scenes(cfg, generate_scenes(cfg, profile.n_dilution, seed=DILUTION_SEED, n_objects=k))
    return EvalSets(eval_set, dil_set, WorldSamples(cfg, dil_set.scenes[:32], dil_set.images[:32]))


def _run_seed(profile: DemoProfile, seed: int, runs_dir: Path, retrain: bool, sets: EvalSets, scenes,
              environment: dict) -> dict:
    """One base (trained or reused from the cache) and every experiment of the profile on it."""
    t0 = time.time()
    train_cfg = dataclasses.replace(profile.train, seed=seed)
    model_dir = runs_dir / "cache" / f"base-{cache_key(profile, seed, environment)}"
    if retrain and model_dir.exists():
        shutil.rmtree(model_dir)
    timings: dict[str, float] = {}
    if (model_dir / "config.json").is_file():
        log(f"reusing cached base model {model_dir}")
        stages = {s: json.loads((model_dir / "stages" / s / "keepsight_stage.json").read_text())
                  for s in train_cfg.stages}
    else:
        log(f"training the base model (seed {seed}) in {len(train_cfg.stages)} stages -> {model_dir}")
        stages = train_base(model_dir, train_cfg, scenes())
    timings["train_s"] = time.time() - t0
    t1 = time.time()
    model, processor = load_checkpoint(model_dir, dtype=None, device="cpu")
    log(f"evaluating the base model (seed {seed})")
    base = evaluate_arm(model, processor, sets, log)
    timings["eval_s"] = time.time() - t1
    ctx = ExperimentContext(model_dir, train_cfg, profile.world, sets, base, scenes, log)
    done: dict[str, dict] = {}
    for exp_name, experiment in EXPERIMENTS.items():
        exp_cfg = getattr(profile, exp_name)
        if exp_cfg is None:
            continue
        t2 = time.time()
        done[exp_name] = experiment.run(exp_cfg, ctx)
        timings[f"{exp_name}_s"] = time.time() - t2
    samples = [{"id": s.id, "truth": description(s), "generated": g} for s, g in zip(sets.eval.scenes[:6], base["texts"])]
    return {
        "seed": seed,
        "train": train_cfg.to_dict(),
        "model_dir": str(model_dir),
        "base": {"stages": {s: {k2: v.get(k2) for k2 in ("first_loss", "last_loss")} for s, v in stages.items()},
                 **{k2: v for k2, v in base.items() if k2 != "texts"}, "samples": samples},
        **done,
        "timings": {**timings, "total_s": time.time() - t0},
    }


def results_markdown(results: dict, runs_dir: Path) -> str:
    """``results.md``'s tables from ``results.json`` alone (the demo writes it; a saved results.json can be
    rendered again after a report change without re-running anything)."""
    head = provenance_markdown(results)
    summary = (head + "\n" if head else "") + summary_markdown(results)
    for exp_name in EXPERIMENTS:
        if exp_name in results:
            summary += "\n" + EXPERIMENTS[exp_name].markdown(results[exp_name])
    if "aggregate" in results:
        summary += "\n" + seeds_markdown(results["aggregate"])
    return summary + "\n" + claims_markdown(claims_table(results, runs_dir))


def demo_command(profile_name: str, threads: int = DEFAULT_THREADS) -> str:
    """The command line that runs ``profile_name`` (printed beside its results)."""
    return ("keepsight demo" + ("" if profile_name == "full" else f" --profile {profile_name}")
            + ("" if threads == DEFAULT_THREADS else f" --threads {threads}"))


def cache_provenance(model_dirs: list[Path], started: float) -> dict:
    """Which of the caches a run used it trained itself and which it reused, and whether a reused one was trained
    by other code: every summary with a ``provenance`` (``keepsight.train.recipe``) under a base's cache and the
    experiment caches beside it (``<base>-pvm``, ``<base>-bridge``, ...)."""
    here = source_digest()
    trained, reused, other_code = [], [], []
    for model_dir in model_dirs:
        for root in sorted(model_dir.parent.glob(model_dir.name + "*")):
            for f in sorted(root.rglob("*.json")):
                if "checkpoint-" in f.as_posix() or f.stat().st_size > 50_000_000:
                    continue
                try:
                    summary = json.loads(f.read_text())
                except (OSError, ValueError):
                    continue
                prov = summary.get("provenance") if isinstance(summary, dict) else None
                if not isinstance(prov, dict):
                    continue
                name = str(f.parent.relative_to(model_dir.parent))
                if prov.get("finished", 0) >= started:
                    trained.append(name)
                else:
                    reused.append(name)
                    if prov.get("source") != here:
                        other_code.append(name)
    return {"trained": trained, "reused": reused, "reused_from_other_code": other_code,
            "from_nothing": not reused}


def provenance_markdown(results: dict) -> str:
    """The lines printed above a run's tables: the command, the code, the environment, and what was reused."""
    prov = results.get("provenance")
    if not prov:
        return ""
    code, env, caches = prov["code"], prov["environment"], prov["caches"]
    git = code.get("git")
    commit = (f"commit {git['commit'][:12]}" + (" with uncommitted changes" if git["dirty"] else "")) if git else \
        "no git checkout"
    pk = env["packages"]
    reuse = ("every model trained in this run (from nothing)" if caches["from_nothing"] else
             f"{len(caches['reused'])} cached models reused"
             + (f", {len(caches['reused_from_other_code'])} of them trained by other code"
                if caches["reused_from_other_code"] else ", all trained by this code"))
    return (f"Produced by `{prov['command']}` from keepsight {commit} (source {code['source']}); "
            f"{env['threads']} threads, deterministic algorithms {'on' if env['deterministic'] else 'off'}, "
            f"torch {pk['torch']}, transformers {pk['transformers']}, {env['machine']} {env['cpu_capability']}"
            f"{' ' + env['cpu_vendor'] if env.get('cpu_vendor') else ''}; "
            f"{reuse}.\n")


def run_demo(profile_name: str = "full", runs_dir: str | Path = "runs", name: str | None = None,
             retrain: bool = False, threads: int = DEFAULT_THREADS) -> dict:
    """Run the demo; returns the results dict also written to ``runs/<name>/results.json``. With several seeds
    the first seed's results sit at the top level as with one, every seed's under ``seeds``, and the means with
    their 95% intervals (and the verdicts where they separate) under ``aggregate``. ``threads``: the intra-op
    thread count every model is trained and evaluated with (``keepsight.determinism``: results repeat bit for
    bit with the same code, versions, CPU kind and thread count)."""
    if profile_name not in PROFILES:
        raise ValueError(f"unknown demo profile {profile_name!r}; choose from {sorted(PROFILES)}")
    profile = PROFILES[profile_name]
    name = name or profile.name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ValueError(f"--name {name!r}: expected a plain name (letters, digits, . _ -) inside --runs")
    runs_dir = check_output_dir(runs_dir, "--runs", kinds=(RUNS_KIND,),  # earlier versions: no marker, a cache/
                                legacy=lambda p: (p / "cache").is_dir())
    out = check_output_dir(runs_dir / name, "--name", kinds=(RUN_KIND,), legacy=lambda p: (p / "results.json").is_file())
    with configured(threads) as env:
        runs_dir.mkdir(parents=True, exist_ok=True)
        mark(runs_dir, RUNS_KIND)
        out.mkdir(parents=True, exist_ok=True)
        mark(out, RUN_KIND)
        return _run_profile(profile, runs_dir, out, retrain, env, demo_command(profile_name, threads))


def _link_base(out: Path, model_dir: Path) -> None:
    """``<run>/base``: a relative link to the run's (first) base model in the cache, so commands can name it by a
    fixed path (``--model runs/full/base``). Replaced atomically; anything but a link there is left alone."""
    link = out / "base"
    if link.exists() and not link.is_symlink():
        log(f"{link} exists and is not keepsight's link; the base model is {model_dir}")
        return
    tmp = out / f".base.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(model_dir.resolve(), out.resolve()), target_is_directory=True)
    os.replace(tmp, link)


def _run_profile(profile: DemoProfile, runs_dir: Path, out: Path, retrain: bool, env: dict, command: str) -> dict:
    t0 = time.time()
    cfg = profile.world
    cache: list[WorldSamples] = []  # the training scenes, built at most once for every seed

    def training_scenes() -> WorldSamples:
        if not cache:
            log(f"building {profile.n_train} training scenes")
            cache.append(_training_scenes(profile))
        return cache[0]

    sets = _eval_sets(profile)
    runs = [_run_seed(profile, seed, runs_dir, retrain, sets, training_scenes, env) for seed in profile.seeds]
    first = runs[0]
    code = provenance()
    results = {
        "keepsight": __version__,
        "profile": profile.name,
        "world": cfg.to_dict(),
        "provenance": {"command": command, "code": {k: code[k] for k in ("source", "git")}, "environment": env,
                       "caches": cache_provenance([Path(r["model_dir"]) for r in runs], t0)},
        **{k: v for k, v in first.items() if k != "timings"},
        **({"seeds": runs, "aggregate": aggregate(runs)} if len(runs) > 1 else {}),
        "timings": {**first["timings"], "per_seed_s": [r["timings"]["total_s"] for r in runs],
                    "total_s": time.time() - t0},
    }
    write_json(out / "results.json", results)
    _link_base(out, Path(first["model_dir"]))
    base = results["base"]
    k = profile.dilution_objects or cfg.max_objects
    plot = plot_accuracy_by_index(base["dilution"]["by_index"], out / "dilution.png",
                                  f"base model, scenes with {k} objects (n={len(sets.dilution)})")
    diag_plots = plot_diagnosis(base["diagnosis"], out / "diagnosis", f"base model, {k} objects")
    images = {s.id: png_bytes(im) for s, im in zip(sets.eval.scenes[:6], sets.eval.images[:6])}
    sections = base_sections(results, images, plot) + [diagnosis_section(base["diagnosis"], diag_plots)]
    for exp_name in EXPERIMENTS:
        if exp_name in results:
            sections += EXPERIMENTS[exp_name].report(results[exp_name], out)
    if "aggregate" in results:
        sections += seeds_sections(results["aggregate"], out)
    sections.append(claims_section(claims_table(results, runs_dir)))
    summary = results_markdown(results, runs_dir)
    write_report(out / "report.html", f"keepsight demo ({profile.name})", sections, results)
    write_text(out / "results.md", f"# keepsight demo ({profile.name} profile)\n\n{summary}\n")
    print(summary, flush=True)
    log(f"wrote {out / 'results.json'}, {out / 'results.md'} and {out / 'report.html'} in {time.time() - t0:.0f}s")
    return results


def published_results(profile_name: str) -> Path:
    """The committed ``results.md`` of ``profile_name`` in this source checkout for this machine's CPU kind
    (``docs/results/<profile>-<cpu kind>.md``, e.g. ``full-avx512-intel.md``; then ``full-avx512.md``, a page made
    before the vendor was recorded), else ``docs/results/<profile>.md``."""
    root = SOURCE_ROOT.parents[1] / "docs" / "results"
    kind = cpu_kind()
    for name in (f"{profile_name}-{kind}.md", f"{profile_name}-{kind.split('-')[0]}.md", f"{profile_name}.md"):
        path = root / name
        if path.is_file():
            break
    if not path.is_file():
        raise FileNotFoundError(f"no published results for profile {profile_name!r} at {path} (keepsight runs outside "
                                "its source checkout?); pass the file to compare against with --against")
    return path


def reproduce(profile_name: str = "full", against: str | Path | None = None, threads: int = DEFAULT_THREADS,
              runs_dir: str | Path | None = None) -> tuple[list[str], Path]:
    """Run ``profile_name`` from nothing (a new, empty ``runs_dir``; default a temporary directory) and compare its
    ``results.md`` with the published one (``against``; default ``published_results``) number by number. Returns
    the numbers that moved (``keepsight.report.compare.moved_numbers``; empty: reproduced) and the run's
    directory."""
    against = Path(against) if against is not None else published_results(profile_name)
    if not against.is_file():
        raise FileNotFoundError(f"--against {against}: no such file")
    try:
        published = against.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--against {against}: not UTF-8 text (byte {e.start}); give a demo's results.md") from None
    if not published.startswith("# keepsight demo ("):  # checked before a run of up to 30 minutes, not after
        raise ValueError(f"--against {against}: not a keepsight demo results.md (it starts with "
                         f"{published[:40]!r}, not '# keepsight demo (')")
    runs = Path(runs_dir) if runs_dir is not None else Path(tempfile.mkdtemp(prefix="keepsight-reproduce-"))
    if runs.exists() and any(runs.iterdir()):
        raise ValueError(f"--runs {runs}: a reproduction starts from nothing; give a new or empty directory")
    log(f"reproducing {against} from nothing in {runs}")
    run_demo(profile_name, runs_dir=runs, threads=threads)
    fresh = (runs / PROFILES[profile_name].name / "results.md").read_text()
    return moved_numbers(published, fresh), runs


def _training_scenes(profile: DemoProfile) -> WorldSamples:
    return WorldSamples.from_scenes(profile.world, generate_scenes(profile.world, profile.n_train, seed=TRAIN_SEED))
