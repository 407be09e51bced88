"""Nothing is lost under signals, symlinks and reruns: a publish killed at any step leaves the old or the new output
whole (and the next run puts it back in place), --overwrite keeps the old output until the new one is complete,
an input inside --out is refused, file outputs keep their kind, one output spelled two ways takes one lock."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from keepsight.atomic import (
    atomic_save_dir,
    check_output_dir,
    lock_output,
    release_outputs,
    write_output_json,
    write_text,
)
from keepsight.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

N_FILES = 12

# a child publishes "new" over "old" and signals itself after the k-th rename of the publish (k = 0: half-way
# through writing the new output); the renames are atomic_save_dir's own
CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from keepsight import atomic
    from keepsight.cli import _terminate
    out, k, sig = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    signal.signal(signal.SIGTERM, _terminate)
    real, count = os.replace, [0]
    def counted(a, b):  # the publish's own renames: tmp -> .new-, out -> .old-, .new- -> out
        real(a, b)
        if Path(b).name.startswith("." + out.name + ".new-") or Path(b) == out or Path(a) == out:
            count[0] += 1
            if count[0] == k:
                os.kill(os.getpid(), sig)
    os.replace = counted
    def write(tmp):
        for i in range({n}):
            (tmp / f"f{{i}}").write_text("new")
            if k == 0 and i == {n} // 2:
                os.kill(os.getpid(), sig)
    atomic.atomic_save_dir(out, write, kind="thing")
""").format(n=N_FILES)


def _whole(path) -> str | None:
    """"old" / "new" when ``path`` holds that whole output, else None."""
    if not path.is_dir():
        return None
    texts = {(path / f"f{i}").read_text() if (path / f"f{i}").is_file() else None for i in range(N_FILES)}
    return texts.pop() if len(texts) == 1 and None not in texts else None


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("step", [0, 1, 2, 3], ids=["writing", "after-new-named", "after-old-moved", "after-new-in"])
def test_a_publish_killed_at_any_step_leaves_the_old_or_the_new_output_whole(tmp_path, sig, step):
    out = tmp_path / "out"
    atomic_save_dir(out, lambda t: [(t / f"f{i}").write_text("old") for i in range(N_FILES)], kind="thing")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), str(step), str(int(sig))], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (-sig, 128 + sig), proc.stderr
    states = {p.name: _whole(p) for p in tmp_path.iterdir() if p.is_dir()}
    assert {"old", "new"} & set(states.values()), states  # right after the kill: one of them whole, somewhere
    check_output_dir(out, kinds=("thing",))  # the next run on --out finishes or undoes the publish
    release_outputs()
    assert _whole(out) in ("old", "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no leftovers
    if step == 0:
        assert _whole(out) == "old"  # the new output was not finished: the old one stays
    if step == 3:
        assert _whole(out) == "new"  # already in place
    # after the old output moved aside: SIGKILL leaves the finished new one to be put in place; SIGTERM may be taken
    # by another thread while the main one holds it back, and then the publish rolls back to the old one


def test_a_temporary_file_never_takes_a_name_a_users_file_holds(tmp_path):
    mine = tmp_path / "p.jsonl.tmp"
    mine.write_text("the user's")
    write_text(tmp_path / "p.jsonl", "keepsight's")
    assert mine.read_text() == "the user's" and (tmp_path / "p.jsonl").read_text() == "keepsight's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl", "p.jsonl.tmp"]


def test_one_output_spelled_through_a_symlink_takes_the_same_lock(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    lock_output(tmp_path / "link" / "w")
    code = ("import sys; from keepsight.atomic import lock_output\n"
            "try:\n    lock_output(sys.argv[1])\nexcept ValueError as e:\n    print(e); sys.exit(3)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(real / "w")], env=env, capture_output=True,
                              text=True, timeout=60)
    finally:
        release_outputs()
    assert proc.returncode == 3 and "being written by another keepsight run" in proc.stdout


def _error(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.replace("\r", "\n").splitlines() if x.startswith("keepsight: error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_file_output_of_another_kind_is_not_replaced(tmp_path, capsys):
    preds = tmp_path / "p.jsonl"
    write_output_json(preds, {"answers": 1}, "predictions")
    before = preds.read_bytes()
    scored = tmp_path / "s.jsonl"
    scored.write_text(json.dumps({"id": "a", "answer": "yes", "label": "yes", "category": "c"}) + "\n")
    for extra in ([], ["--overwrite"]):
        assert main(["eval", "score", "--pred", str(scored), "--out", str(preds), *extra]) == 2
        assert "is a keepsight predictions file, not scores" in _error(capsys)
    assert preds.read_bytes() == before


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from tiny_checkpoints import save_tiny_checkpoint

    root = tmp_path_factory.mktemp("pub")
    assert main(["world", "build", "--out", str(root / "world"), "--n", "6", "--seed", "1"]) == 0
    save_tiny_checkpoint("tiny-llava", root / "m1", seed=0)
    save_tiny_checkpoint("tiny-llava", root / "m2", seed=1)
    return root


def _tree(path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_overwrite_refuses_an_out_that_holds_the_commands_input(env, tmp_path, capsys):
    out = tmp_path / "a"
    common = ["--steps", "2", "--batch-size", "2", "--out", str(out)]
    assert main(["pvm", "train", "--model", str(env / "m1"), "--data", str(env / "world"), *common]) == 0
    import shutil

    shutil.copytree(env / "world", out / "mydata")  # the user keeps the data beside the adapter
    before = _tree(out)
    assert main(["pvm", "train", "--model", str(env / "m2"), "--data", str(out / "mydata"), *common,
                 "--overwrite"]) == 2
    assert "an input of this command" in _error(capsys)
    assert _tree(out) == before


def test_overwrite_keeps_the_old_adapter_until_the_new_one_is_complete(env, tmp_path, capsys):
    from keepsight.models import load_checkpoint
    from keepsight.pvm import load_pvm

    out = tmp_path / "a"
    common = ["--data", str(env / "world"), "--steps", "4", "--batch-size", "2", "--train.save_every", "1", "--out", str(out)]
    assert main(["pvm", "train", "--model", str(env / "m1"), *common]) == 0
    old = (out / "pvm.safetensors").read_bytes()
    # the new run stops half-way (as a killed one would): the old adapter is still there, whole and usable
    assert main(["pvm", "train", "--model", str(env / "m2"), *common, "--overwrite", "--stop-after", "2"]) == 0
    assert (out / "pvm.safetensors").read_bytes() == old
    assert json.loads((out / "pvm_train.json").read_text())["request"]["base"]["path"] == str((env / "m1").resolve())
    model, _ = load_checkpoint(env / "m1", dtype=None, device="cpu")
    load_pvm(model, out)
    # without --overwrite the old output is still refused; with it, the new run resumes and replaces it
    assert main(["pvm", "train", "--model", str(env / "m2"), *common]) == 2
    assert "another request" in _error(capsys)
    assert main(["pvm", "train", "--model", str(env / "m2"), *common, "--overwrite"]) == 0
    summary = json.loads((out / "pvm_train.json").read_text())
    assert summary["request"]["base"]["path"] == str((env / "m2").resolve())
    assert not (out / "checkpoints").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_world_train_overwrite_keeps_the_old_base_until_the_new_one_is_complete(env, tmp_path):
    out = tmp_path / "t"
    common = ["--out", str(out), "--n", "8", "--steps-scale", "0.001", "--batch-size", "2"]
    assert main(["world", "train", *common]) == 0
    old = (out / "model.safetensors").read_bytes()
    request = (out / "keepsight_request.json").read_bytes()
    assert main(["world", "train", *common, "--seed", "1", "--overwrite", "--stage", "lm"]) == 0
    assert (out / "model.safetensors").read_bytes() == old  # one stage of the new base: the old one is untouched
    assert (out / "keepsight_request.json").read_bytes() == request
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".t.replacing-")]
    assert main(["world", "train", *common, "--seed", "1", "--overwrite"]) == 0  # resumes, then replaces
    assert (out / "model.safetensors").read_bytes() != old
    assert json.loads((out / "train_config.json").read_text())["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_eval_pope_replaces_its_out_whole_and_only_with_overwrite(tmp_path, capsys):
    from test_pope import _line

    questions = tmp_path / "coco_pope_random.json"
    questions.write_text("".join(_line(k + 1, f"COCO_val2014_{k:012d}.jpg", "Is there a dog in the image?", label)
                                 + "\n" for k, label in enumerate(["yes", "no"])))
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"question_id": k, "answer": "yes"}) + "\n" for k in (1, 2)))
    out = tmp_path / "pope"
    args = ["eval", "pope", "--questions", str(questions), "--answers", str(answers), "--out", str(out)]
    assert main(args) == 0
    (out / "answers.jsonl").write_text("an earlier --model run's answers\n")  # as a --model run leaves them
    first = _tree(out)
    assert main(args) == 2
    assert "--overwrite" in _error(capsys) and _tree(out) == first
    assert main([*args, "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [".keepsight", "questions.jsonl", "scores.json"]
    bad = tmp_path / "bad"
    assert main(["eval", "pope", "--questions", str(questions), "--answers", str(tmp_path / "nope.jsonl"),
                 "--out", str(bad)]) == 2
    assert not bad.exists()  # a failed run leaves nothing behind
