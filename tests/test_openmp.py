"""``keepsight.openmp``: the console script sets OpenMP's wait policy before torch loads (idle threads sleep at once
where the command will run more threads than the cores free, else spin briefly), and leaves a user's; a command
started beside a pinned keepsight run lowers its priority."""

import argparse
import os
import subprocess
import sys
import time

from keepsight.cli import build_parser
from keepsight.cores import keepsight_runs
from keepsight.openmp import (
    PINNED_THREADS,
    SPINCOUNT,
    YIELD_NICE,
    pinned_runs,
    requested_threads,
    set_wait_policy,
    wait_policy,
)

PROBE = ("import sys, os; assert 'torch' not in sys.modules; sys.argv = ['keepsight', *{argv!r}]; "
         "import keepsight.launch; assert 'torch' in sys.modules; "
         "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))")


def _probe(argv=(), stderr: list | None = None, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    run = subprocess.run([sys.executable, "-c", PROBE.format(argv=list(argv))], env={**clean, **env},
                         capture_output=True, text=True, check=True)
    if stderr is not None:
        stderr.append(run.stderr)
    return run.stdout.strip()


def test_the_console_script_sets_the_policy_before_torch_loads_unless_the_user_did():
    assert _probe(["models"]) == f"{SPINCOUNT} None"  # --threads auto: never more threads than cores free
    said: list = []
    assert _probe(["demo", "--threads", str(10**6)], said) == "None PASSIVE"  # more threads than any machine has free
    assert "OMP_WAIT_POLICY=PASSIVE" in said[0] and "for the whole run" in said[0]  # a choice for the run: told
    assert _probe(["models"], said) == f"{SPINCOUNT} None" and "PASSIVE" not in said[1]
    assert _probe(["demo", "--threads", str(10**6)], GOMP_SPINCOUNT="300000") == "300000 None"
    assert _probe(OMP_WAIT_POLICY="ACTIVE") == "None ACTIVE"


def test_set_wait_policy_on_a_mapping():
    env: dict = {}
    assert set_wait_policy(env) == SPINCOUNT and env == {"GOMP_SPINCOUNT": SPINCOUNT}
    env = {}
    assert set_wait_policy(env, threads=2, free=2) == SPINCOUNT and env == {"GOMP_SPINCOUNT": SPINCOUNT}
    env = {}  # a pinned 2 threads beside a busy neighbour on 2 cores: sleep, do not spin
    assert set_wait_policy(env, threads=2, free=1) == "PASSIVE" and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {}  # one thread always has a core's time slices to itself: it spins
    assert set_wait_policy(env, threads=1, free=0) == SPINCOUNT
    assert requested_threads(["demo", "--threads", "+3"]) == 3 and requested_threads(["demo", "--threads", "²"]) is None
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert set_wait_policy(env, threads=2, free=0) is None and env == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_a_run_states_how_its_threads_waited():
    env: dict = {}
    assert wait_policy(env) == "libgomp's default"
    set_wait_policy(env, threads=2, free=1)
    assert wait_policy(env) == "OMP_WAIT_POLICY=PASSIVE"
    assert wait_policy({"GOMP_SPINCOUNT": SPINCOUNT}) == f"GOMP_SPINCOUNT={SPINCOUNT}"


def test_the_threads_a_command_will_run_at_are_read_from_its_words():
    assert requested_threads(["demo"]) == 2 and requested_threads(["demo", "--profile", "regime"]) == 2
    assert requested_threads(["world", "train", "--out", "w"]) == 2
    assert requested_threads(["demo", "--threads", "1"]) == 1 and requested_threads(["eval", "pope", "--threads=3"]) == 3
    assert requested_threads(["demo", "--threads", "auto"]) is None and requested_threads(["world", "eval"]) is None
    assert requested_threads([]) is None


def _leaves(parser, path=()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _leaves(child, (*path, name))


def test_the_pinned_commands_are_those_whose_parser_pins_the_threads():
    pinned = {}
    for path, parser in _leaves(build_parser()):
        action = parser._option_string_actions.get("--threads")
        if action is not None and action.default != "auto":
            pinned[path] = action.default
    assert pinned == PINNED_THREADS


def test_a_neighbour_that_passes_in_a_moment_does_not_make_a_run_sleep(monkeypatch):
    """The choice holds for the whole run (libgomp reads it once): the cores free are read again ``RECHECK_S`` later
    before a pinned run sleeps its threads, and only a neighbour still there makes it."""
    import types

    import keepsight.openmp as omp

    slept: list = []
    monkeypatch.setattr(omp, "time", types.SimpleNamespace(sleep=slept.append))
    reads = iter([1, 2])  # one core busy at the first read, both free at the second
    monkeypatch.setattr(omp, "free_cores", lambda **kw: next(reads))
    assert not omp.busy_for(2) and slept == [omp.RECHECK_S]
    env: dict = {}
    reads = iter([1, 2])
    assert set_wait_policy(env, threads=2) == SPINCOUNT and env == {"GOMP_SPINCOUNT": SPINCOUNT}
    reads = iter([1, 1])  # still there: sleep
    assert set_wait_policy(env := {}, threads=2) == "PASSIVE" and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    slept.clear()
    reads = iter([2])  # free at once: no second read, no wait
    assert not omp.busy_for(2) and slept == []


def test_the_keepsight_commands_running_are_read_from_proc(tmp_path):
    def process(pid, *words):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(w.encode() for w in words) + b"\0")

    process(100, "/x/.venv/bin/python3.11", "/x/.venv/bin/keepsight", "demo", "--profile", "regime")
    process(101, "/x/.venv/bin/keepsight", "eval", "pope", "--threads", "1")
    process(102, "/usr/bin/python3", "-c", "print('keepsight demo')")  # the word in an argument is not the command
    process(103, "/bin/bash")
    process(os.getpid(), "/x/.venv/bin/keepsight", "demo")  # this process is never its own neighbour
    (tmp_path / "self").mkdir()
    runs = keepsight_runs(tmp_path)
    assert runs == {100: ["demo", "--profile", "regime"], 101: ["eval", "pope", "--threads", "1"]}
    assert pinned_runs(runs) == {100: ["demo", "--profile", "regime"]}
    assert pinned_runs({7: ["world", "train", "--threads", "1"], 8: ["eval", "generate", "--threads", "2"]}) == {
        8: ["eval", "generate", "--threads", "2"]}


LAUNCH = "import os, sys; sys.argv = ['keepsight', *{argv!r}]; import keepsight.launch; print(os.nice(0))"
YIELD = "import os; from keepsight.openmp import yield_to_pinned; yield_to_pinned({argv!r}); print(os.nice(0))"


def test_a_command_started_beside_a_pinned_run_yields_to_it(tmp_path):
    """A live pinned run (a process whose command line is ``keepsight demo``) makes a later command that pins at most
    one thread take ``YIELD_NICE`` and say so; ``KEEPSIGHT_YIELD=0`` and a pinned command itself keep their priority."""
    script = tmp_path / "keepsight"
    script.write_text("import time\ntime.sleep(120)\n")
    clean = {k: v for k, v in os.environ.items() if k != "KEEPSIGHT_YIELD"}

    def nice(argv, probe=YIELD, **env):  # the priority a command takes, in a process of its own
        run = subprocess.run([sys.executable, "-c", probe.format(argv=list(argv))], env={**clean, **env},
                             capture_output=True, text=True, check=True)
        return int(run.stdout.split()[-1]) - os.nice(0), run.stderr

    assert nice(["models"])[0] == 0  # nothing pinned runs
    run = subprocess.Popen([sys.executable, str(script), "demo", "--profile", "regime"])
    try:
        deadline = time.time() + 10
        while run.pid not in keepsight_runs() and time.time() < deadline:
            time.sleep(0.05)
        lowered, said = nice(["models"], LAUNCH)  # the console script yields before torch loads, and says so
        assert lowered == max(YIELD_NICE - os.nice(0), 0)
        assert f"pid {run.pid}: keepsight demo --profile regime" in said and f"nice {YIELD_NICE}" in said
        assert nice(["eval", "pope", "--threads", "1"])[0] == lowered
        assert nice(["models"], KEEPSIGHT_YIELD="0") == (0, "")
        assert nice(["world", "train", "--out", "w"])[0] == 0  # a pinned run never yields
    finally:
        run.kill()
        run.wait()
