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
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .atomic import check_output_dir, mark, write_json, write_text
from .determinism import DEFAULT_THREADS, SOURCE_ROOT, configured, cpu_kind, provenance, source_digest
from .experiments.aggregate import aggregate
from .experiments.arm import EvalSets, ExperimentContext, evaluate_arm
from .experiments.baselines import run_baselines_experiment
from .experiments.bridge import run_bridge_experiment
from .experiments.diffusion import run_diffusion_experiment
from .experiments.pvm import run_pvm_experiment
from .experiments.pvm_control import run_pvm_control
from .fingerprint import digest
from .models import load_checkpoint
from .openmp import wait_policy
from .profiles import PROFILES, DemoProfile
from .report.base import base_sections, diagnosis_section
from .report.baselines import baselines_markdown, baselines_report
from .report.bridge import bridge_markdown, bridge_report
from .report.claims import claims_markdown, claims_section, claims_table
from .report.compare import compare_numbers
from .report.control import control_markdown, control_sections
from .report.diffusion import diffusion_markdown, diffusion_report
from .report.html import write_report
from .report.plots import plot_accuracy_by_index, plot_diagnosis
from .report.pvm import pvm_markdown, pvm_report
from .report.seeds import seeds_markdown, seeds_sections
from .report.summary import summary_markdown
from .world.base import train_base
from .world.dataset import generate_scenes
from .world.render import png_bytes
from .world.tasks import WorldSamples
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
    waits = f"OpenMP threads wait: {prov['openmp']}; " if prov.get("openmp") else ""  # runs before it: not recorded
    return (f"Produced by `{prov['command']}` from keepsight {commit} (source {code['source']}); "
            f"{env['threads']} threads, deterministic algorithms {'on' if env['deterministic'] else 'off'}, "
            f"torch {pk['torch']}, transformers {pk['transformers']}, {env['machine']} {env['cpu_capability']}"
            f"{' ' + env['cpu_vendor'] if env.get('cpu_vendor') else ''}; "
            f"{waits}{reuse}.\n")


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
                       "openmp": wait_policy(), "caches": cache_provenance([Path(r["model_dir"]) for r in runs], t0)},
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
              runs_dir: str | Path | None = None) -> tuple[list[str], list[str], Path]:
    """Run ``profile_name`` from nothing (a new, empty ``runs_dir``; default a temporary directory) and compare its
    ``results.md`` with the published one (``against``; default ``published_results``) number by number. Returns
    the numbers that moved and the lines the fresh run adds (``keepsight.report.compare.compare_numbers``; no moved
    number: reproduced) and the run's directory."""
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
    return *compare_numbers(published, fresh), runs


def _training_scenes(profile: DemoProfile) -> WorldSamples:
    return WorldSamples.from_scenes(profile.world, generate_scenes(profile.world, profile.n_train, seed=TRAIN_SEED))
