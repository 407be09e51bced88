"""``keepsight demo``: build the world, train (or reuse) the base, run every experiment, write the report."""

from __future__ import annotations

from ..demo import run_demo
from .options import run_name


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="build the world, train the base, evaluate, write runs/<name>/report.html")
    d.add_argument("--smoke", action="store_true", help="a ~1 minute run with tiny budgets")
    d.add_argument("--profile", default="full", help="full | smoke")
    d.add_argument("--runs", default="runs", help="where runs and the model cache live")
    d.add_argument("--name", type=run_name, help="run name (default: the profile); a plain name inside --runs")
    d.add_argument("--retrain", action="store_true", help="ignore the model cache")
    d.set_defaults(func=run)


def run(args) -> int:
    run_demo("smoke" if args.smoke else args.profile, runs_dir=args.runs, name=args.name, retrain=args.retrain)
    return 0
