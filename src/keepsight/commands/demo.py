"""``keepsight demo``: build the world, train (or reuse) the base, run every experiment, write the report."""

from __future__ import annotations

from ..demo import PROFILES, run_demo
from .options import run_name


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="build the world, train the base, evaluate, write runs/<name>/report.html")
    d.add_argument("--smoke", action="store_true", help="a ~1 minute run with tiny budgets")
    d.add_argument("--profile", default="full", choices=list(PROFILES), help="full (default, about 22 minutes on 2 "
                   "cores from scratch): the base, its diagnosis and multi-turn regime, the PVM arms, the diffusion "
                   "methods; seeds: three base seeds, PVM and bridge arms with 95%% intervals; readings: LIA-MTR's "
                   "readings vs the MLP; diffusion: the varied-description regime on an 8-layer LLaDA-V with every "
                   "MPS / MRS setting; baselines: VCD, PAI, MemVR, DeCo beside PVM; extended: a 6-layer base and the "
                   "PVM arms; smoke: tiny budgets (= --smoke)")
    d.add_argument("--runs", default="runs", help="where runs and the model cache live")
    d.add_argument("--name", type=run_name, help="run name (default: the profile); a plain name inside --runs")
    d.add_argument("--retrain", action="store_true", help="ignore the model cache")
    d.set_defaults(func=run)


def run(args) -> int:
    run_demo("smoke" if args.smoke else args.profile, runs_dir=args.runs, name=args.name, retrain=args.retrain)
    return 0
