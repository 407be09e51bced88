"""``keepsight bench threads``: training beside other work. The world base's instruct step (the tiny LLaVA, a batch
of 16 instruct items, forward + backward + AdamW) timed at 1 thread, 2 threads and ``auto`` (the cores free when it
starts) under keepsight's OpenMP wait policy (``keepsight.openmp``: what the ``keepsight`` command chooses when it
starts: idle threads sleep at once where it will run more threads than the cores free, else spin briefly), at 2
threads under the brief spin alone (what a run gets when its neighbour starts after it), and at 2 threads under
libgomp's own (its idle threads spin 300,000 times before they sleep), alone and beside each kind of neighbour: a pure
Python loop (one busy thread), a torch matmul loop at 1 thread (what another keepsight command takes beside a busy one:
``--threads auto``), the same at nice ``YIELD_NICE`` (what a keepsight command started beside a pinned run takes:
``keepsight.openmp.yield_to_pinned``), and one at 2 threads (a program at torch's default on 2 cores). Each neighbour
also reports its own speed beside each timing, against its speed alone.

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
from ..openmp import SPINCOUNT, USER_SETTINGS, YIELD_NICE, set_wait_policy
from ..world import generate_scenes, world_config
from ..world.models import build_model, preset_processor
from ..world.tasks import WorldSamples, instruct_data
from . import write_result

NEIGHBOURS = {"none": None, "python loop": ("python",), "torch, 1 thread": ("torch", "1"),
              f"torch, 1 thread, nice {YIELD_NICE}": ("torch", "1", str(YIELD_NICE)),
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


def neighbour(kind: str, threads: str = "1", nice: str = "0") -> None:
    """Busy forever at ``nice``: a pure Python loop (``python``), or a torch matmul loop at ``threads`` threads
    (``torch``); every 1,000 (Python) or 20 (torch) iterations it prints its count and ``time.monotonic()``."""
    os.nice(int(nice))
    count, every = 0, 1000 if kind == "python" else 20
    a = None
    if kind != "python":
        torch.set_num_threads(int(threads))
        a = torch.randn(256, 256)
    while True:
        if a is None:
            for _ in range(1000):
                pass
        else:
            a = (a @ a).tanh_()
        count += 1
        if count % every == 0:
            print(count, time.monotonic(), flush=True)


def work(threads: str, steps: int) -> None:
    """Print the steps per second of ``steps`` instruct steps at ``threads`` (after 3 warm-up steps), the count used,
    the wait policy run under (``PASSIVE``, ``spin5000``; ``spin`` alone: libgomp's own) and the timed span's start
    and end (``time.monotonic()``, the clock the neighbour prints)."""
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
    t0 = time.monotonic()
    for _ in range(steps):
        step()
    t1 = time.monotonic()
    wait = os.environ.get("OMP_WAIT_POLICY") or f"spin{os.environ.get('GOMP_SPINCOUNT', '')}"
    print(f"{steps / (t1 - t0):.4f} {n} {wait} {t0:.6f} {t1:.6f}", flush=True)


CODE = "from keepsight.bench.threads import {0}; {0}({1})"


def _start(kind: tuple) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CODE.format("neighbour", ", ".join(map(repr, kind)))],
                            env=wait_env("libgomp"), stdout=subprocess.PIPE, text=True)


def _rate(busy: subprocess.Popen, t0: float, t1: float) -> float:
    """Stop the neighbour ``busy`` and return its iterations per second over ``[t0, t1]`` (from its printed counts:
    the first and last report inside the span)."""
    busy.kill()
    out, _ = busy.communicate()
    lines = out.split("\n")[:-1]  # "count time" per line; what follows the last newline was cut short by the kill
    marks = [(int(c), float(t)) for c, t in (line.split() for line in lines)]
    inside = [m for m in marks if t0 <= m[1] <= t1]
    if len(inside) < 2:
        return float("nan")
    (c0, s0), (c1, s1) = inside[0], inside[-1]
    return (c1 - c0) / (s1 - s0)


def _alone(kind: tuple, seconds: float = 5.0) -> float:
    """The neighbour's own speed with the cores to itself (over ``seconds`` after a second's start)."""
    busy = _start(kind)
    time.sleep(seconds + 1.0)
    now = time.monotonic()
    return _rate(busy, now - seconds, now)


def _timed(threads: str, policy: str, kind: tuple | None, steps: int) -> tuple[float, int, str, float | None]:
    """One timing (steps/s, threads used, policy run under) and the neighbour's speed over it (None: no neighbour)."""
    busy = _start(kind) if kind is not None else None
    if busy is not None:
        time.sleep(1.0)
    try:
        out = subprocess.run([sys.executable, "-c", CODE.format("work", f"{threads!r}, {steps}")], check=True,
                             capture_output=True, text=True, env=wait_env(policy, threads)).stdout.split()
    except BaseException:
        if busy is not None:
            busy.kill()
            busy.wait()
        raise
    t0, t1 = float(out[-2]), float(out[-1])
    return float(out[-5]), int(out[-4]), out[-3], (_rate(busy, t0, t1) if busy is not None else None)


def run(out: str | Path = "runs/bench", steps: int = 30, repeats: int = 3) -> dict:
    rates: dict[tuple[str, str, str], list[float]] = {}
    used: dict[tuple[str, str, str], set] = {}
    ran: dict[tuple[str, str, str], set] = {}  # the wait policy each timing ran under (keepsight's: chosen at start)
    beside: dict[tuple[str, str, str], list[float]] = {}  # the neighbour's speed over each timing
    alone: dict[str, list[float]] = {}  # each neighbour's speed with the cores to itself
    for _ in range(repeats):
        for name, kind in NEIGHBOURS.items():
            if kind is not None:
                alone.setdefault(name, []).append(_alone(kind))
            for t, policy in SETTINGS:
                rate, n, wait, its = _timed(t, policy, kind, steps)
                rates.setdefault((name, t, policy), []).append(rate)
                used.setdefault((name, t, policy), set()).add(n)
                ran.setdefault((name, t, policy), set()).add(wait)
                if its is not None:
                    beside.setdefault((name, t, policy), []).append(its)
    reference = statistics.median(rates[("none", *REFERENCE)])
    rows = []
    for (name, t, policy), rs in rates.items():
        own, rate = statistics.median(rates[("none", t, policy)]), statistics.median(rs)
        its = beside.get((name, t, policy))
        rows.append({"neighbour": name, "threads": t, "wait": policy, "threads_used": sorted(used[(name, t, policy)]),
                     "ran_under": sorted(ran[(name, t, policy)]), "steps_per_s": rate, "all": rs,
                     "slowdown": own / rate, "vs_reference": rate / reference,
                     "neighbour_speed": statistics.median(its) / statistics.median(alone[name]) if its else None})
    print(f"{'neighbour':<26s} {'threads':>7s} {'wait':>9s} {'used':>5s} {'ran under':>14s} {'steps/s':>8s} "
          f"{'slowdown':>9s} {'vs 2 libgomp alone':>19s} {'neighbour vs alone':>19s}")
    for r in rows:
        its = "" if r["neighbour_speed"] is None else f"{r['neighbour_speed']:.2f}x"
        print(f"{r['neighbour']:<26s} {r['threads']:>7s} {r['wait']:>9s} {'/'.join(map(str, r['threads_used'])):>5s} "
              f"{'/'.join(r['ran_under']):>14s} {r['steps_per_s']:8.2f} {r['slowdown']:8.1f}x "
              f"{r['vs_reference']:18.2f}x {its:>19s}")
    result = {"benchmark": "threads", "steps": steps, "repeats": repeats, "spincount": SPINCOUNT,
              "neighbours_alone": {name: statistics.median(v) for name, v in alone.items()}, "rows": rows}
    write_result(out, "threads", result)
    return result
