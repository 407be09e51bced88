import json
import subprocess
import sys

import pytest

from keepsight.cli import main


def test_world_build_cli(tmp_path, capsys):
    assert main(["world", "build", "--out", str(tmp_path / "w"), "--n", "4", "--seed", "3", "--objects", "5"]) == 0
    lines = (tmp_path / "w" / "scenes.jsonl").read_text().splitlines()
    assert len(lines) == 4
    assert all(len(json.loads(line)["scene"]["objects"]) == 5 for line in lines)
    assert len(list((tmp_path / "w" / "images").glob("*.png"))) == 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["world", "build", "--out", "{tmp}/w", "--n", "2", "--image-size", "16"], "too small for grid"),
        (["world", "build", "--out", "{tmp}/w", "--n", "2", "--objects", "40"], "out of range"),
        (["world", "build", "--out", "{tmp}/w", "--n", "2", "--max-objects", "30"], "exceeds the 16 cells"),
        (["world", "train", "--preset", "tiny-gpt", "--out", "{tmp}/m"], "unknown preset 'tiny-gpt'"),
        (["world", "train", "--out", "{tmp}/m", "--data", "{tmp}/missing"], "does not exist"),
        (["world", "eval", "--model", "{tmp}", "--data", "{tmp}"], "world.json is missing"),
    ],
)
def test_cli_errors_are_clear(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("keepsight: error:") and message in err


def test_console_script_is_installed(tmp_path):
    out = subprocess.run([sys.executable, "-m", "keepsight.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "demo" in out.stdout and "world" in out.stdout
