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


def test_readme_python_blocks_run(tmp_path, monkeypatch):
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
