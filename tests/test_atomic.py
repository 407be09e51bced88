"""Nothing a user made is replaced: ownership is checked again when an output is published, a file given as
``--out`` is replaced only when it is keepsight's own unchanged output, and two runs never write one output at once."""

import json
import os
import subprocess
import sys

import pytest

from keepsight import atomic
from keepsight.atomic import atomic_save_dir, check_output_file, lock_output, owned_file, release_outputs
from keepsight.cli import main


@pytest.fixture(autouse=True)
def _release():
    yield
    release_outputs()


def test_a_directory_made_while_the_work_ran_is_kept_and_the_result_put_beside_it(tmp_path):
    out = tmp_path / "D"

    def write(tmp):
        (tmp / "scenes.jsonl").write_text("new")
        out.mkdir()  # the user, meanwhile
        (out / "thesis.txt").write_text("mine")

    with pytest.raises(ValueError, match=r"now holds files keepsight did not write; it was left as it is and the "
                                         r"new output was written to .*D\.keepsight-1"):
        atomic_save_dir(out, write, kind="world")
    assert (out / "thesis.txt").read_text() == "mine"
    assert (tmp_path / "D.keepsight-1" / "scenes.jsonl").read_text() == "new"
    assert not list(tmp_path.glob(".D.tmp*"))


def test_an_output_of_another_kind_or_a_file_is_not_replaced(tmp_path):
    out = tmp_path / "D"
    atomic_save_dir(out, lambda tmp: (tmp / "a").write_text("1"), kind="world")
    atomic_save_dir(out, lambda tmp: (tmp / "a").write_text("2"), kind="world")  # its own kind: replaced
    assert (out / "a").read_text() == "2"
    with pytest.raises(ValueError, match="now holds a keepsight world, not a adapter"):
        atomic_save_dir(out, lambda tmp: (tmp / "b").write_text("x"), kind="adapter")
    f = tmp_path / "F"
    f.write_text("mine")
    with pytest.raises(ValueError, match="is now a file"):
        atomic_save_dir(f, lambda tmp: None, kind="world")
    assert f.read_text() == "mine"


def test_a_file_out_is_replaced_only_when_it_is_keepsights_unchanged_output(tmp_path):
    mine = tmp_path / "results.json"
    mine.write_text("my notes")
    with pytest.raises(ValueError, match="exists and is not an output of keepsight's"):
        check_output_file(mine)
    assert check_output_file(mine, overwrite=True) == mine
    own = tmp_path / "scores.json"
    atomic.write_output_json(own, {"acc": 1}, "scores")
    assert owned_file(own) and check_output_file(own) == own
    own.write_text(json.dumps({"acc": 1, "note": "edited"}))
    assert not owned_file(own)
    with pytest.raises(ValueError, match="or was edited since"):
        check_output_file(own)


def test_eval_score_keeps_a_users_file(tmp_path, capsys):
    pred = tmp_path / "p.jsonl"
    pred.write_text(json.dumps({"answer": "yes", "reference": "yes"}) + "\n")
    mine = tmp_path / "results.json"
    mine.write_text("my notes")
    assert main(["eval", "score", "--pred", str(pred), "--out", str(mine)]) == 2
    assert "--out" in capsys.readouterr().err and mine.read_text() == "my notes"
    assert main(["eval", "score", "--pred", str(pred), "--out", str(tmp_path / "s.json")]) == 0
    assert main(["eval", "score", "--pred", str(pred), "--out", str(tmp_path / "s.json")]) == 0  # its own: again
    assert main(["eval", "score", "--pred", str(pred), "--out", str(mine), "--overwrite"]) == 0
    assert json.loads(mine.read_text())["overall"]["accuracy"] == 1.0
    assert not [p for p in tmp_path.iterdir() if ".keepsight-lock" in p.name]  # released when the command ended


HOLD = """
import sys, time
from keepsight.atomic import lock_output
lock_output(sys.argv[1])
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_writer_of_one_output_is_refused(tmp_path):
    out = tmp_path / "world"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"is being written by another keepsight run \(process {holder.pid}\)"):
            lock_output(out)
        with pytest.raises(ValueError, match="being written by another keepsight run"):
            atomic.check_output_dir(out)
    finally:
        holder.kill()
        holder.wait()
    lock_output(out)  # its process is gone: the lock is taken over
    lock_output(out)  # and this process may take it again
    release_outputs()
    assert not [p for p in tmp_path.iterdir() if ".keepsight-lock" in p.name]
    assert not out.exists()  # checking and locking create nothing at --out
    assert os.listdir(tmp_path) == []
