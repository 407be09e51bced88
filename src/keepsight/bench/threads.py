"""``keepsight bench threads``: training beside other work. The world base's instruct step (the tiny LLaVA, a batch
of 16 instruct items, forward + backward + AdamW) timed at 1 thread, 2 threads and ``auto`` (the cores free when it
starts) under keepsight's OpenMP wait policy (``keepsight.openmp``: what the ``keepsight`` command chooses when it
starts: idle threads sleep at once where it will run more threads than the cores free, else spin briefly), at 2
threads under the brief spin alone (what a run gets when its neighbour starts after it), and at 2 threads under
libgomp's own (its idle threads spin 300,000 times before they sleep), alone and beside each kind of neighbour: a pure
Python loop (one busy thread), a torch matmul loop at 1 thread (what another keepsight command takes beside a busy one:
``--threads auto``), and one at 2 threads (a program at torch's default on 2 cores).

Each timing runs in its own process (a thread count and OpenMP's pool are per process); the neighbour starts before
it and is killed after, and runs under libgomp's own policy. Rows are interleaved over ``repeats`` rounds; each cell
is the median steps per second, its slowdown against the same setting alone and its speed against libgomp's policy
at 2 threads alone (the default before keepsight set a policy). Why a parallel region collapses: each waits for its
slowest thread, and a thread that shares its core with another process runs a fraction of each time slice; an idle
thread that spins takes the time its partner needs.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..data import VLMCollator
from ..determinism import resolve_threads
from ..openmp import SPINCOUNT, USER_SETTINGS, set_wait_policy
from ..world import generate_scenes, world_config
from ..world.models import build_model, preset_processor
from ..world.tasks import WorldSamples, instruct_data
from . import write_result

NEIGHBOURS = {"none": None, "python loop": ("python",), "torch, 1 thread": ("torch", "1"),
              "torch, 2 threads": ("torch", "2")}
# (threads, OpenMP wait policy) timed: keepsight's at each thread count, its brief spin and libgomp's own at 2 threads
SETTINGS = (("1", "keepsight"), ("2", "keepsight"), ("auto", "keepsight"), ("2", "spin"), ("2", "libgomp"))
REFERENCE = ("2", "libgomp")  # the speed every row is also compared with, alone


def wait_env(policy: str, threads: str = "auto") -> dict:
    """This process's environment with OpenMP's wait policy ``policy``: ``keepsight`` (what the console script chooses
    now for ``threads``: ``keepsight.openmp.set_wait_policy``), ``spin`` (its brief spin whatever the cores free),
    ``libgomp`` (neither variable set: its own default)."""
    env = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}
    if policy == "keepsight":
        set_wait_policy(env, threads=None if threads == "auto" else int(threads))
    elif policy == "spin":
        env["GOMP_SPINCOUNT"] = SPINCOUNT
    return env


def neighbour(kind: str, threads: str = "1") -> None:
    """Busy forever: a pure Python loop (``python``), or a torch matmul loop at ``threads`` threads (``torch``)."""
    if kind == "python":
        while True:
            pass
    torch.set_num_threads(int(threads))
    a = torch.randn(256, 256)
    while True:
        a = (a @ a).tanh_()


def work(threads: str, steps: int) -> None:
    """Print the steps per second of ``steps`` instruct steps at ``threads`` (after 3 warm-up steps), the count used and
    the wait policy run under (``PASSIVE``, ``spin5000``; ``spin`` alone: libgomp's own)."""
    n = resolve_threads(threads if threads == "auto" else int(threads))
    torch.set_num_threads(n)
    config = world_config()
    processor = preset_processor("tiny-llava")
    data = instruct_data(WorldSamples.from_scenes(config, generate_scenes(config, 8, seed=0)))
    batch = VLMCollator(processor)([data[i] for i in range(0, len(data), max(1, len(data) // 16))][:16])
    model = build_model("tiny-llava", processor.tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    wait = os.environ.get("OMP_WAIT_POLICY") or f"spin{os.environ.get('GOMP_SPINCOUNT', '')}"
    print(f"{steps / (time.perf_counter() - t0):.4f} {n} {wait}", flush=True)


def _timed(threads: str, policy: str, kind: tuple | None, steps: int) -> tuple[float, int, str]:
    code = "from keepsight.bench.threads import {0}; {0}({1})"
    busy = None
    if kind is not None:
        busy = subprocess.Popen([sys.executable, "-c", code.format("neighbour", ", ".join(map(repr, kind)))],
                                env=wait_env("libgomp"))
        time.sleep(1.0)
    try:
        out = subprocess.run([sys.executable, "-c", code.format("work", f"{threads!r}, {steps}")], check=True,
                             capture_output=True, text=True, env=wait_env(policy, threads)).stdout.split()
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    return float(out[-3]), int(out[-2]), out[-1]


def run(out: str | Path = "runs/bench", steps: int = 30, repeats: int = 3) -> dict:
    rates: dict[tuple[str, str, str], list[float]] = {}
    used: dict[tuple[str, str, str], set] = {}
    ran: dict[tuple[str, str, str], set] = {}  # the wait policy each timing ran under (keepsight's: chosen at start)
    for _ in range(repeats):
        for name, kind in NEIGHBOURS.items():
            for t, policy in SETTINGS:
                rate, n, wait = _timed(t, policy, kind, steps)
                rates.setdefault((name, t, policy), []).append(rate)
                used.setdefault((name, t, policy), set()).add(n)
                ran.setdefault((name, t, policy), set()).add(wait)
    reference = statistics.median(rates[("none", *REFERENCE)])
    rows = []
    for (name, t, policy), rs in rates.items():
        alone, rate = statistics.median(rates[("none", t, policy)]), statistics.median(rs)
        rows.append({"neighbour": name, "threads": t, "wait": policy, "threads_used": sorted(used[(name, t, policy)]),
                     "ran_under": sorted(ran[(name, t, policy)]), "steps_per_s": rate, "all": rs,
                     "slowdown": alone / rate, "vs_reference": rate / reference})
    print(f"{'neighbour':<18s} {'threads':>7s} {'wait':>9s} {'used':>5s} {'ran under':>14s} {'steps/s':>8s} "
          f"{'slowdown':>9s} {'vs 2 libgomp alone':>19s}")
    for r in rows:
        print(f"{r['neighbour']:<18s} {r['threads']:>7s} {r['wait']:>9s} {'/'.join(map(str, r['threads_used'])):>5s} "
              f"{'/'.join(r['ran_under']):>14s} {r['steps_per_s']:8.2f} {r['slowdown']:8.1f}x "
              f"{r['vs_reference']:18.2f}x")
    result = {"benchmark": "threads", "steps": steps, "repeats": repeats, "spincount": SPINCOUNT, "rows": rows}
    write_result(out, "threads", result)
    return result
