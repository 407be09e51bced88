"""The README's Python examples run as written: the commands its quick start shows are run, then every
```python block, in order, in one namespace (as a reader would type them), on the tiny presets."""

import re
import shlex
from pathlib import Path

import pytest

from keepsight.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "# the Python examples below use these"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_the_quick_start_names_its_commands():
    setup = [b for b in _blocks("bash") if MARKER in b]
    assert len(setup) == 1, "one bash block must carry the marker line"
    assert len(_blocks("python")) >= 4


@pytest.fixture
def registry_kept():
    """The README registers a method: the registry is as it was afterwards."""
    from keepsight.inference import METHODS

    before = dict(METHODS)
    yield
    METHODS.clear()
    METHODS.update(before)


def test_readme_python_blocks_run(tmp_path, monkeypatch, registry_kept):
    monkeypatch.chdir(tmp_path)
    setup = next(b for b in _blocks("bash") if MARKER in b)
    for line in setup.split(MARKER, 1)[1].splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("keepsight "):
            assert main(shlex.split(line)[1:]) == 0, line
    namespace: dict = {}
    for i, block in enumerate(_blocks("python")):
        try:
            exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)  # noqa: S102
        except Exception as e:  # name the block that failed
            pytest.fail(f"README python block {i + 1} failed: {type(e).__name__}: {e}\n{block}")


# ----------------------------------------------------------------------------- the shell commands, walked

REAL = ("/ckpt", "/data")  # a user's checkpoints and data: such commands are for a GPU machine, not walked here
LONG = (("demo",), ("bench",))  # the demo and the benchmarks: minutes to hours (their own tests run them small)
# budget options -> the tiny value the walk uses; options a training command gets when it sets none
TINY = {"--n": "4", "--steps": "1", "--limit": "2", "--num-generations": "2", "--batch-size": "2"}
TRAIN_EXTRA = {("pvm", "train"): ["--steps", "1", "--batch-size", "2"], ("lora", "train"): ["--steps", "1"],
               ("bridge", "train"): ["--steps", "1", "--batch-size", "2"],
               ("diffusion", "train"): ["--steps", "1", "--batch-size", "2", "--answer-length", "8"],
               ("world", "train"): ["--n", "8", "--steps-scale", "0.001", "--batch-size", "2"],
               ("world", "eval"): ["--limit", "2"]}


def shell_commands() -> list[str]:
    """Every command line of the README's bash blocks, in order (continuations joined, comments dropped)."""
    out = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def walked(commands):
    """(argv to run, why not) for each README command: real-use and long commands, and those that read what a
    skipped command would have written, are kept out."""
    skipped_outputs: set[str] = set()
    for words in commands:
        outs = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--out", "--runs")]
        why = None
        if words[0] != "keepsight":
            why = "not keepsight"
        elif any(w.startswith(REAL) for w in words):
            why = "a user's checkpoint or data"
        elif tuple(words[1:2]) in LONG:
            why = "a long run"
        elif any(w.rstrip("/") in skipped_outputs for w in words if w not in outs):
            why = "reads what a skipped command writes"
        if why:
            skipped_outputs.update(o.rstrip("/") for o in outs)
            yield words, why
            continue
        argv = list(words[1:])
        for i, w in enumerate(argv[:-1]):
            if w in TINY:
                argv[i + 1] = TINY[w]
        argv += TRAIN_EXTRA.get(tuple(argv[:2]), [])
        if argv[:2] == ["pvm", "train"] and "grpo" in argv:
            argv += ["--prompts-per-step", "2", "--max-completion-length", "4"]
            argv = [a for i, a in enumerate(argv) if not (a == "--batch-size" or argv[i - 1] == "--batch-size")]
        yield _dedupe(argv), None


def _dedupe(argv: list[str]) -> list[str]:
    """The last value of an option given twice (the walk's budget after the README's)."""
    out, seen = [], {}
    i = 0
    while i < len(argv):
        w = argv[i]
        if w.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--") and w in seen:
            out[seen[w] + 1] = argv[i + 1]
            i += 2
            continue
        if w.startswith("--"):
            seen[w] = len(out)
        out.append(w)
        i += 1
    return out


def test_readme_marks_what_the_walk_leaves_out():
    text = " ".join(README.read_text().split())
    assert "`/ckpt/...` or `/data/...`" in text and "tests/test_readme.py walks" in text
    kinds = [why for _, why in walked(shell_commands())]
    assert kinds.count(None) >= 15  # most commands are walked


def test_readme_shell_commands_run_in_order(tmp_path, monkeypatch, capsys):
    """Every keepsight command of the README, in order, in a fresh directory, with tiny budgets; ``runs/full/base``
    (what ``make demo`` leaves) is a world base trained one step a stage."""
    monkeypatch.chdir(tmp_path)
    assert main(["world", "train", "--out", "runs/full/base", "--n", "8", "--steps-scale", "0.001", "--batch-size",
                 "2"]) == 0
    for argv, why in walked(shell_commands()):
        if why is None:
            code = main(argv)
            assert code == 0, f"keepsight {shlex.join(argv)} exited {code}: {capsys.readouterr().err[-2000:]}"
