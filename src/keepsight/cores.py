"""The cores a command may use and those other processes keep busy, read without torch (the console script decides
OpenMP's wait policy from them before torch loads: ``keepsight.openmp``)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

DEFAULT_THREADS = 2  # the intra-op thread count the published results were made with
CPU_QUOTA = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" in microseconds, or "max <period>"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (the machine's count where the OS does not say), capped by
    the container's CPU quota where cgroup v2 sets one (``docker --cpus 2`` on a 16-core host: 2)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = CPU_QUOTA.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def free_cores(samples: int = 3, interval: float = 0.002) -> int:
    """The cores this process may use (``usable_cores``) that no other process keeps busy right now: their number minus
    the runnable threads of other processes (``/proc/loadavg``'s running count less this process's own running
    threads), the most of ``samples`` reads ``interval`` seconds apart (a passing blip does not count); all of them
    where ``/proc`` does not say."""
    cores = usable_cores()
    best = None
    for i in range(samples):
        if i:
            time.sleep(interval)
        try:
            running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
            ours = 0
            for task in Path("/proc/self/task").iterdir():
                try:  # "pid (comm) S ...": the state follows the last ")"
                    ours += (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
                except (OSError, IndexError):
                    pass
        except (OSError, ValueError, IndexError):
            return cores
        free = cores - max(running - max(ours, 1), 0)  # at most cores
        best = free if best is None else max(best, free)
    return max(best, 0)


def keepsight_runs(proc: Path = Path("/proc")) -> dict[int, list[str]]:
    """This user's other running ``keepsight`` commands: pid -> the words after ``keepsight`` on its command line (the
    console script, ``.../bin/keepsight demo ...``), leaving out this process and its ancestors (a command the demo
    itself started is not its neighbour). Empty where ``/proc`` does not say."""
    own = {os.getpid()}
    pid = os.getpid()
    while pid > 1:  # the ancestors, from each one's parent pid ("pid (comm) S ppid ...")
        try:
            pid = int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        own.add(pid)
    runs = {}
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit() and int(p.name) not in own]
    except OSError:
        return runs
    for p in entries:
        try:
            if p.stat().st_uid != os.getuid():
                continue
            words = (p / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone, or not ours to read
            continue
        at = next((i for i, w in enumerate(words[:3]) if Path(w).name == "keepsight"), None)
        if at is not None:
            runs[int(p.name)] = [w for w in words[at + 1:] if w]
    return runs
