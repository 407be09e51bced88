"""Threads on a busy machine: the cores other processes keep busy are seen, ``--threads auto`` leaves them alone, a
thread count above the free cores is warned about, and every command takes ``--threads``."""

import argparse
import subprocess
import sys
import time

import pytest
import torch

from keepsight.cli import build_parser, main
from keepsight.cores import free_cores, usable_cores
from keepsight.determinism import busy_note, resolve_threads

pytestmark = pytest.mark.skipif(usable_cores() < 2, reason="needs 2 cores: one for a busy neighbour, one for us")


@pytest.fixture
def neighbour():
    """A process that keeps one core busy (a pure Python loop, always runnable) for the test's duration."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.3)
    yield proc
    proc.kill()
    proc.wait()


def test_a_busy_neighbour_takes_a_core(neighbour):
    cores = usable_cores()
    assert free_cores() <= cores - 1
    assert resolve_threads("auto") == max(1, min(cores - 1, torch.get_num_threads()))
    note = busy_note(cores)
    assert note is not None and f"of the {cores} cores are free" in note and "--threads" in note


def test_idle_cores_and_explicit_counts():
    assert resolve_threads(3) == 3
    for bad in (0, -1, 2.5, "two"):
        with pytest.raises(ValueError, match="threads"):
            resolve_threads(bad)
    assert busy_note(1, free=1) is None
    assert "share the cores" in busy_note(usable_cores() + 1, free=usable_cores())


def test_every_command_takes_threads():
    def leaves(parser, path):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield path, parser
        for action in subs:
            for name, child in action.choices.items():
                yield from leaves(child, path + [name])

    found = list(leaves(build_parser(), []))
    assert len(found) >= 15
    for path, parser in found:
        action = parser._option_string_actions.get("--threads")
        assert action is not None, f"keepsight {' '.join(path)} has no --threads"
        assert action.type("auto") == "auto" and action.type("1") == 1
        with pytest.raises(argparse.ArgumentTypeError, match="or auto"):
            action.type("0")
    fixed = {" ".join(p): parser.get_default("threads") for p, parser in found if parser.get_default("threads") != "auto"}
    assert fixed == {"world train": 2, "demo": 2}  # the commands whose results are pinned bit for bit


def test_the_command_warns_and_gives_the_thread_count_back(neighbour, capsys):
    before = torch.get_num_threads()
    assert main(["models", "--threads", str(usable_cores())]) == 0
    assert "keepsight: warning:" in capsys.readouterr().err
    assert torch.get_num_threads() == before
    assert main(["models", "--threads", "1"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_container_quota_caps_the_cores(tmp_path, monkeypatch):
    from keepsight import cores

    affinity = usable_cores()
    quota = tmp_path / "cpu.max"
    monkeypatch.setattr(cores, "CPU_QUOTA", quota)
    assert usable_cores() == affinity  # no cgroup file: the affinity
    quota.write_text("max 100000\n")
    assert usable_cores() == affinity
    quota.write_text("150000 100000\n")  # 1.5 CPUs: 2 threads may run, at a share
    assert usable_cores() == min(affinity, 2)
    quota.write_text("50000 100000\n")
    assert usable_cores() == 1 and resolve_threads("auto") == 1
