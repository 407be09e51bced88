"""``keepsight demo``: build the world, train (or reuse) the base, run every experiment, write the report."""

from __future__ import annotations

from ..demo import PROFILES, reproduce, run_demo
from ..determinism import DEFAULT_THREADS
from .options import run_name, threads


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="build the world, train the base, evaluate, write runs/<name>/report.html")
    d.add_argument("--smoke", action="store_true", help="a ~1 minute run with tiny budgets")
    d.add_argument("--profile", default="full", choices=list(PROFILES), help="full (default, about 22 minutes on 2 "
                   "cores from scratch): the base, its diagnosis and multi-turn regime, the PVM arms, the diffusion "
                   "methods; seeds: three base seeds, PVM and bridge arms with 95%% intervals; readings: LIA-MTR's "
                   "readings vs the MLP; diffusion: the varied-description regime on an 8-layer LLaDA-V with every "
                   "MPS / MRS setting; baselines: VCD, PAI, MemVR, DeCo, OPERA beside PVM; control: PVM's mechanism "
                   "control (the image only in PVM's memory, against the matched LoRA); control-grounded: the same on the grounded "
                   "base, 3 seeds, on a prior-balanced yes/no set (about 65 minutes); regime: the regime recipe's base (a "
                   "visual answer falls after the model's own description, the image again recovers it), 3 seeds, every "
                   "PVM arm, the released baselines and the control there (about 110 minutes); extended: a 6-layer base and "
                   "the PVM arms; smoke: tiny budgets (= --smoke)")
    d.add_argument("--runs", default="runs", help="where runs and the model cache live")
    d.add_argument("--name", type=run_name, help="run name (default: the profile); a plain name inside --runs")
    d.add_argument("--retrain", action="store_true", help="ignore the model cache")
    d.add_argument("--threads", type=threads, default=DEFAULT_THREADS,
                   help=f"intra-op threads for every model (default {DEFAULT_THREADS}, as the published results: "
                   "results repeat bit for bit with the same code, package versions, CPU kind and thread count), or "
                   "auto: the cores free when it starts (on a busy machine 1 thread can be several times faster)")
    d.add_argument("--reproduce", action="store_true", help="run the profile from nothing in a new temporary "
                   "directory (or --runs, new or empty) and compare its results.md with the published one "
                   "(docs/results/<profile>.md), printing every number that moved; exit code 1 if any did")
    d.add_argument("--against", help="--reproduce: the results.md to compare with (default: the published one)")
    d.set_defaults(func=run)


def run(args) -> int:
    if args.against and not args.reproduce:
        raise ValueError("--against applies only with --reproduce")
    if args.reproduce:
        if args.retrain or args.name:
            raise ValueError("--reproduce runs from nothing under the profile's name; drop --retrain / --name")
        profile = "smoke" if args.smoke else args.profile
        moved, runs = reproduce(profile, args.against, args.threads,
                                runs_dir=args.runs if args.runs != "runs" else None)
        print(f"\nreproduction of the {profile} profile in {runs}: "
              + ("every number as published" if not moved else f"{len(moved)} lines moved"))
        for line in moved:
            print(f"  {line}")
        return 1 if moved else 0
    run_demo("smoke" if args.smoke else args.profile, runs_dir=args.runs, name=args.name, retrain=args.retrain,
             threads=args.threads)
    return 0
