"""``keepsight demo``: build the world, train (or reuse) the base, run every experiment, write the report."""

from __future__ import annotations

from ..demo import reproduce, run_demo
from ..determinism import DEFAULT_THREADS
from ..profiles import PROFILE_HELP, PROFILES
from .options import run_name, threads


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="build the world, train the base, evaluate, write runs/<name>/report.html")
    d.add_argument("--smoke", action="store_true", help="a ~1 minute run with tiny budgets")
    d.add_argument("--profile", default="full", choices=list(PROFILES),
                   help="; ".join(f"{name}: {text}" for name, text in PROFILE_HELP.items()).replace("%", "%%"))
    d.add_argument("--runs", default="runs", help="where runs and the model cache live")
    d.add_argument("--name", type=run_name, help="run name (default: the profile); a plain name inside --runs")
    d.add_argument("--retrain", action="store_true", help="ignore the model cache")
    d.add_argument("--threads", type=threads, default=DEFAULT_THREADS,
                   help=f"intra-op threads for every model (default {DEFAULT_THREADS}, as the published results: "
                   "results repeat bit for bit with the same code, package versions, CPU kind and thread count), or "
                   "auto: the cores free when it starts (on a busy machine 1 thread can be several times faster)")
    d.add_argument("--reproduce", action="store_true", help="run the profile from nothing in a new temporary "
                   "directory (or --runs, new or empty) and compare its results.md with the published one "
                   "(docs/results/<profile>.md), printing every number that moved (exit code 1 if any did) and the lines only the fresh run has")
    d.add_argument("--against", help="--reproduce: the results.md to compare with (default: the published one)")
    d.set_defaults(func=run)


def run(args) -> int:
    if args.against and not args.reproduce:
        raise ValueError("--against applies only with --reproduce")
    if args.reproduce:
        if args.retrain or args.name:
            raise ValueError("--reproduce runs from nothing under the profile's name; drop --retrain / --name")
        profile = "smoke" if args.smoke else args.profile
        moved, added, runs = reproduce(profile, args.against, args.threads,
                                       runs_dir=args.runs if args.runs != "runs" else None)
        print(f"\nreproduction of the {profile} profile in {runs}: "
              + ("every number as published" if not moved else f"{len(moved)} lines moved"))
        for line in moved:
            print(f"  {line}")
        if added:
            print(f"{len(added)} lines the published results do not have yet (measures added since; not compared):")
            for line in added:
                print(f"  {line}")
        return 1 if moved else 0
    run_demo("smoke" if args.smoke else args.profile, runs_dir=args.runs, name=args.name, retrain=args.retrain,
             threads=args.threads)
    return 0
