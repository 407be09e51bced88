"""How a keepsight command shares the cores: OpenMP's wait policy, set before torch loads its OpenMP runtime (libgomp,
in torch's CPU wheel), which reads it once, and its priority beside a pinned run.

libgomp's idle threads spin for a while before they sleep; at 2 threads on 2 cores beside another busy process a
spinning thread takes the time slice its partner needs to finish the region both wait on, and training collapses
(README, "A busy machine"). So the console script chooses, before torch loads: where the command will run more
threads than there are cores free (a pinned ``--threads`` beside a busy neighbour), its idle threads sleep at once
(``OMP_WAIT_POLICY=PASSIVE``); otherwise they spin briefly (``GOMP_SPINCOUNT``), which keeps most of an idle machine's
speed and yields to a neighbour that starts later. The policy changes how threads wait, never what they compute:
results are the same bits under any setting.

A neighbour that starts after a pinned run (``keepsight demo``, ``world train``) meets its brief spin, and the run
trains about 2.8x slower beside it. So a command that will not itself pin more than one thread, started while a
pinned keepsight run is alive, lowers its own priority (``nice`` ``YIELD_NICE``): the pinned run then trains about 1.8x
slower rather than 2.8x, and the command runs at about 0.6x its own speed while they share the cores (README, "A busy
machine").
``KEEPSIGHT_YIELD=0`` in the environment keeps the usual priority.
"""

from __future__ import annotations

import os
import time

from .cores import DEFAULT_THREADS, free_cores, keepsight_runs

RECHECK_S = 2.0  # seconds between the two reads of the cores free before a pinned run chooses to sleep its threads
SPINCOUNT = "5000"  # spins before an idle OpenMP thread sleeps (libgomp's default: 300,000; README, "A busy machine")
USER_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")  # a user who set either keeps it
YIELD_NICE = 19  # the priority a command takes beside a pinned run (measured: README, "A busy machine")
YIELD_SETTING = "KEEPSIGHT_YIELD"  # "0": a command started beside a pinned run keeps its priority
# the commands whose thread count is pinned unless --threads says otherwise (the published results' count); every
# other command defaults to --threads auto, the cores free when it starts
PINNED_THREADS = {("demo",): DEFAULT_THREADS, ("world", "train"): DEFAULT_THREADS}


def passive_note(threads: int) -> str:
    """What a command started beside busy cores is told: its threads sleep when idle for the whole run."""
    return (f"keepsight: note: fewer than {threads} cores were free when this command started, so its {threads} "
            "threads sleep whenever idle (OMP_WAIT_POLICY=PASSIVE) for the whole run: about 1.7x slower if the cores "
            f"free up; GOMP_SPINCOUNT={SPINCOUNT} in the environment keeps them spinning briefly instead (README, "
            "\"A busy machine\")")


def wait_policy(environ=os.environ) -> str:
    """How this process's OpenMP threads wait, as a run's provenance states it: ``OMP_WAIT_POLICY=...`` or
    ``GOMP_SPINCOUNT=...`` as set (by ``set_wait_policy`` or the user), or libgomp's default where neither is."""
    settings = [f"{name}={environ[name]}" for name in USER_SETTINGS if name in environ]
    return ", ".join(settings) or "libgomp's default"


def requested_threads(argv: list[str]) -> int | None:
    """The intra-op threads the command ``argv`` (the words after ``keepsight``) will run at, read before its parser
    exists: its ``--threads N``, or its pinned default (``PINNED_THREADS``); None where it chooses from the cores free
    (``--threads auto``, the default of the other commands) or the words do not say."""
    for i, word in enumerate(argv):
        value = word.split("=", 1)[1] if word.startswith("--threads=") else (
            argv[i + 1] if word == "--threads" and i + 1 < len(argv) else None)
        if value is not None:
            try:
                return int(value)
            except ValueError:  # auto (or a word the parser will refuse)
                return None
    return next((n for path, n in PINNED_THREADS.items() if tuple(argv[:len(path)]) == path), None)


def set_wait_policy(environ=os.environ, threads: int | None = None, free: int | None = None) -> str | None:
    """Set the wait policy in ``environ`` unless the user set ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``:
    ``OMP_WAIT_POLICY=PASSIVE`` where ``threads`` (``requested_threads``; None: chosen from the cores free) exceeds the
    cores free (``free``, else ``busy_for``: read twice, ``RECHECK_S`` apart), else ``GOMP_SPINCOUNT=SPINCOUNT``.
    Returns the value set ("PASSIVE" or the spin count), or None where the user's setting stands. Effective only before
    torch is imported."""
    if any(name in environ for name in USER_SETTINGS):
        return None
    if threads is not None and (threads > max(free, 1) if free is not None else busy_for(threads)):
        environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return "PASSIVE"
    environ["GOMP_SPINCOUNT"] = SPINCOUNT
    return SPINCOUNT


def busy_for(threads: int, recheck_s: float = RECHECK_S) -> bool:
    """Whether ``threads`` outnumber the cores free now and still ``recheck_s`` seconds later (each read: the most
    cores free over 0.2 s; the second only where the first found too few). The choice holds for the whole run, so a
    neighbour that passes in a moment (the disk catching up after an install, a shell starting) must not make it: on
    cores that then free up, PASSIVE ran the default demo 1.5x slower (README, "A busy machine")."""
    def short() -> bool:
        return threads > max(free_cores(samples=11, interval=0.02), 1)

    if not short():
        return False
    time.sleep(recheck_s)
    return short()


def pinned_runs(runs: dict[int, list[str]] | None = None) -> dict[int, list[str]]:
    """The running keepsight commands (``keepsight_runs``, or ``runs``) that pin more than one intra-op thread: their
    published numbers need those threads, and a neighbour started after them takes their cores."""
    runs = keepsight_runs() if runs is None else runs
    return {pid: words for pid, words in runs.items() if (requested_threads(words) or 0) > 1}


def yield_to_pinned(argv: list[str], environ=os.environ, runs: dict[int, list[str]] | None = None) -> dict:
    """Lower this process's priority to ``YIELD_NICE`` where the command ``argv`` pins at most one thread and a pinned
    keepsight run is alive (``pinned_runs``), unless ``KEEPSIGHT_YIELD=0``. Returns the pinned runs it yielded to
    (empty: it did not)."""
    if environ.get(YIELD_SETTING) == "0" or (requested_threads(argv) or 1) > 1:
        return {}
    pinned = pinned_runs(runs)
    if pinned:
        os.nice(max(YIELD_NICE - os.nice(0), 0))
    return pinned


def yield_note(pinned: dict[int, list[str]]) -> str:
    """What a command that yielded to ``pinned`` is told."""
    runs = "; ".join(f"pid {pid}: keepsight {' '.join(words)}" for pid, words in sorted(pinned.items()))
    return (f"keepsight: note: a pinned keepsight run holds the cores ({runs}), so this command runs at nice "
            f"{YIELD_NICE} while they share the cores (the run then trains about 1.8x slower rather than 2.8x, this "
            f"command at about 0.6x its speed); {YIELD_SETTING}=0 in the environment keeps the usual priority (README, "
            "\"A busy machine\")")
