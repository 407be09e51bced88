"""No command destroys data, and bad inputs are named: one test per data-loss case (the input survives, the
refusal names the conflict), corrupt files named by path, outputs checked before any work."""

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_coco_chair import CAPTIONS, _write_coco, _write_jsonl

from keepsight.cli import main
from keepsight.models import load_checkpoint, load_llada_v
from tiny_checkpoints import save_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def _tree_hash(path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("rel")
    assert main(["world", "build", "--out", str(root / "world"), "--n", "6", "--seed", "1"]) == 0
    save_tiny_checkpoint("tiny-llava", root / "m1", seed=0)
    save_tiny_checkpoint("tiny-llava", root / "m2", seed=1)  # same architecture, other weights
    save_tiny_checkpoint("tiny-llada-v", root / "llada")
    common = ["--data", str(root / "world"), "--steps", "2", "--batch-size", "2"]
    assert main(["pvm", "train", "--model", str(root / "m1"), "--out", str(root / "pvm1"), *common]) == 0
    assert main(["lora", "train", "--model", str(root / "m1"), "--out", str(root / "lora1"), *common]) == 0
    return root


def _error(capsys) -> str:
    """The one error line the last command printed (progress bars of earlier commands aside)."""
    lines = [x for x in capsys.readouterr().err.replace("\r", "\n").splitlines() if x.startswith("keepsight: error:")]
    assert len(lines) == 1, lines
    return lines[0]


# ----------------------------------------------------------------------------- data loss


def test_eval_chair_refuses_to_write_over_its_captions(tmp_path, capsys):
    coco = tmp_path / "coco" / "annotations"
    coco.mkdir(parents=True)
    _write_coco(coco)
    caps = _write_jsonl(tmp_path / "c.jsonl", CAPTIONS)
    before = caps.read_bytes()
    assert main(["eval", "chair", "--captions", str(caps), "--coco", str(coco), "--out", str(caps)]) == 2
    assert "also an input" in _error(capsys)
    assert caps.read_bytes() == before


def test_world_build_overwrite_replaces_only_a_world(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    assert main(["world", "build", "--out", str(mine), "--n", "2", "--overwrite"]) == 2
    assert "not a keepsight world" in _error(capsys)
    assert (mine / "thesis.tex").read_text() == "years of work"
    world = tmp_path / "w"
    assert main(["world", "build", "--out", str(world), "--n", "2"]) == 0
    assert main(["world", "build", "--out", str(world), "--n", "3", "--overwrite"]) == 0  # a world: replaced
    assert len((world / "scenes.jsonl").read_text().splitlines()) == 3


def test_training_output_of_another_request_is_refused_then_replaced_with_overwrite(env, tmp_path, capsys):
    adapter = tmp_path / "a"
    common = ["--data", str(env / "world"), "--out", str(adapter), "--steps", "2", "--batch-size", "2"]
    assert main(["pvm", "train", "--model", str(env / "m1"), *common]) == 0
    before = _tree_hash(adapter)
    assert main(["pvm", "train", "--model", str(env / "m1"), *common]) == 0  # the same request: reused
    assert _tree_hash(adapter) == before
    assert main(["pvm", "train", "--model", str(env / "m2"), *common]) == 2
    err = _error(capsys)
    assert "another request" in err and "base.path" in err and "--overwrite" in err
    assert _tree_hash(adapter) == before
    assert main(["pvm", "train", "--model", str(env / "m1"), *common[:-2], "--batch-size", "3"]) == 2  # other options
    assert "options.batch_size" in _error(capsys)
    assert main(["pvm", "train", "--model", str(env / "m2"), *common, "--overwrite"]) == 0
    summary = json.loads((adapter / "pvm_train.json").read_text())
    assert summary["request"]["base"]["path"] == str((env / "m2").resolve())


@pytest.mark.parametrize("command", [["pvm", "train"], ["lora", "train"], ["bridge", "train", "--phase", "1"]])
def test_autoregressive_training_refuses_a_diffusion_checkpoint(env, tmp_path, capsys, command):
    out = tmp_path / "o"
    assert main([*command, "--model", str(env / "llada"), "--data", str(env / "world"), "--out", str(out),
                 "--steps", "1", "--batch-size", "2"]) == 2
    assert "diffusion checkpoint" in _error(capsys)
    assert not (out / "config.json").exists() and not (out / "pvm.safetensors").exists()


def test_adapters_of_another_model_are_refused(env, capsys):
    for flag, adapter in (("--lora", env / "lora1"), ("--pvm", env / "pvm1")):
        assert main(["world", "eval", "--model", str(env / "m2"), "--data", str(env / "world"), "--limit", "1",
                     flag, str(adapter)]) == 2
        err = _error(capsys)
        assert "does not fit this model" in err and "another model's" in err, err


def test_outputs_that_cannot_be_written_are_refused_before_the_work(env, tmp_path, capsys, monkeypatch):
    from transformers import PreTrainedModel

    from keepsight import demo
    from keepsight.commands import bench

    def work(*args, **kwargs):  # refused before loading or computing anything
        raise AssertionError("work started before the output was checked")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(work))
    monkeypatch.setattr(torch.nn.Module, "__call__", work)
    monkeypatch.setattr(demo, "_run_profile", work)
    for name, (fn, takes) in list(bench.BENCHMARKS.items()):
        monkeypatch.setitem(bench.BENCHMARKS, name, (functools.wraps(fn)(lambda *a, **k: work(*a, **k)), takes))
    model, data = str(env / "m1"), str(env / "world")
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    cases = [
        (["world", "eval", "--model", model, "--data", data, "--out", str(tmp_path / "adir")], "is a directory"),
        (["world", "eval", "--model", model, "--data", data, "--out", str(tmp_path / "afile" / "s.json")], "is a file"),
        (["diagnose", "--model", model, "--data", data, "--out", str(tmp_path / "afile")], "is a file"),
        (["pvm", "train", "--model", model, "--data", data, "--out", str(tmp_path / "afile")], "is a file"),
        (["bench", "scan", "--out", str(tmp_path / "afile")], "is a file"),
        (["demo", "--smoke", "--runs", str(tmp_path / "afile")], "is a file"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in _error(capsys), argv
    assert not list(tmp_path.glob("**/*.tmp"))


def test_a_directory_of_the_users_is_not_written_into(env, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    for argv in (["bridge", "train", "--phase", "1", "--model", str(env / "m1"), "--data", str(env / "world"),
                  "--out", str(mine), "--steps", "1", "--batch-size", "2"],
                 ["diagnose", "--model", str(env / "m1"), "--data", str(env / "world"), "--out", str(mine)]):
        assert main(argv) == 2
        assert "not written by keepsight" in _error(capsys)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_demo_name_stays_inside_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo", "--smoke", "--runs", str(tmp_path / "runs"), "--name", "../../x"])
    assert e.value.code == 2 and "--name" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_world_build_refuses_what_the_disk_cannot_hold(tmp_path, capsys):
    assert main(["world", "build", "--out", str(tmp_path / "huge"), "--n", str(10**12)]) == 2
    assert "GiB on disk" in _error(capsys) and not list(tmp_path.iterdir())


def test_world_build_cleans_up_on_a_signal(tmp_path):
    import shutil

    from keepsight.world import world_config
    from keepsight.world.dataset import scene_bytes

    n = min(100_000, int(0.4 * shutil.disk_usage(tmp_path).free / scene_bytes(world_config())))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "keepsight.cli", "world", "build", "--out", str(tmp_path / "big"),
                             "--n", str(n)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list(tmp_path.glob(".big.tmp*/images/*.png")) and time.time() < deadline:
        time.sleep(0.2)  # until it is writing scenes (streamed: none is held in memory)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []  # neither the world nor its temporary directory


def test_outputs_follow_the_umask(env):
    for path in (env / "world", env / "pvm1", env / "lora1"):
        assert path.stat().st_mode & 0o777 == 0o777 & ~_umask(), path
        for f in path.iterdir():
            if f.is_file():
                assert f.stat().st_mode & 0o777 == 0o666 & ~_umask(), f


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------- corrupt or wrong files


def test_corrupt_weights_are_named(env, tmp_path):
    import shutil

    for name, damage in (("zero", lambda b: b""), ("truncated", lambda b: b[: len(b) // 2]),
                         ("garbage", lambda b: b"not safetensors at all" * 100)):
        d = tmp_path / name
        shutil.copytree(env / "m1", d)
        weights = d / "model.safetensors"
        weights.write_bytes(damage(weights.read_bytes()))
        with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file"):
            load_checkpoint(d, dtype="float32", device="cpu")
    d = tmp_path / "none"
    shutil.copytree(env / "m1", d)
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="holds no model weights"):
        load_checkpoint(d, dtype="float32", device="cpu")


def test_adapter_files_are_checked(env, tmp_path):
    import shutil

    from keepsight.pvm import load_pvm

    model, _ = load_checkpoint(env / "m1", dtype="float32", device="cpu")
    nan = tmp_path / "nan"
    shutil.copytree(env / "pvm1", nan)
    w = load_file(str(nan / "pvm.safetensors"))
    w[sorted(w)[0]] = torch.full_like(w[sorted(w)[0]], float("nan"))
    save_file(w, str(nan / "pvm.safetensors"))
    with pytest.raises(ValueError, match="NaN or inf"):
        load_pvm(model, nan)
    layers = tmp_path / "layers"
    shutil.copytree(env / "pvm1", layers)
    meta = json.loads((layers / "pvm_config.json").read_text())
    meta["layers"] = [0]
    (layers / "pvm_config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="records layers"):
        load_pvm(model, layers)
    (layers / "pvm_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="pvm_config.json is not a valid PVM adapter config"):
        load_pvm(model, layers)
    assert getattr(model, "_keepsight_pvm", None) is None  # left as it was


def test_world_images_are_checked(env, tmp_path, capsys):
    import shutil

    from PIL import Image

    bad = tmp_path / "notimg"
    shutil.copytree(env / "world", bad)
    next((bad / "images").glob("*.png")).write_text("plain text")
    assert main(["world", "eval", "--model", str(env / "m1"), "--data", str(bad)]) == 2
    assert "is not a readable image" in _error(capsys)
    size = tmp_path / "size"
    shutil.copytree(env / "world", size)
    first = next((size / "images").glob("*.png"))
    Image.new("RGB", (32, 32)).save(first)
    assert main(["world", "eval", "--model", str(env / "m1"), "--data", str(size)]) == 2
    assert "is 32x32 pixels but the world" in _error(capsys)


def test_load_llada_v_reads_the_directory_keepsight_saves(env):
    model = load_llada_v(env / "llada")
    again, _ = load_checkpoint(env / "llada", dtype=None, device="cpu")
    for (n, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        assert torch.equal(p, q), n


def test_sampler_checks_positions_and_image_inputs(env):
    from PIL import Image

    from keepsight.data import chat_example
    from keepsight.diffusion import generate

    model, processor = load_checkpoint(env / "llada", dtype="float32", device="cpu")
    enc = processor(text=[chat_example(processor, "describe the image in detail .")],
                    images=[Image.new("RGB", (64, 64))], return_tensors="pt")
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings 1024"):
        generate(model, enc["input_ids"], gen_length=10**6, steps=1)
    with pytest.raises(ValueError, match="pixel_values is None"):
        generate(model, enc["input_ids"], gen_length=4, steps=4)
    for kw, name in (({"temperature": float("nan")}, "temperature"), ({"cfg_scale": float("nan")}, "cfg_scale"),
                     ({"gen_length": 2.5}, "gen_length")):
        with pytest.raises(ValueError, match=name):
            generate(model, enc["input_ids"], pixel_values=enc["pixel_values"], **{"gen_length": 4, "steps": 4, **kw})


def test_nested_probes_are_refused(env):
    from keepsight.probes import VisualAttentionProbe

    model, _ = load_checkpoint(env / "m1", dtype="float32", device="cpu")
    with VisualAttentionProbe(model):
        with pytest.raises(ValueError, match="already recording this model"):
            with VisualAttentionProbe(model):
                pass
    for layers in ([1.5], [], [99]):
        with pytest.raises(ValueError, match="layer"):
            VisualAttentionProbe(model, layers=layers)


@pytest.mark.parametrize("max_length", [19, 24])
def test_a_cut_that_leaves_nothing_to_learn_is_an_error_and_leaves_no_out(env, tmp_path, capsys, max_length):
    """19: the image tokens do not fit; 24: they do, but every answer token is cut. Either way the run fails its
    check before training, names it, and the corrected command can run (no unfinished --out left)."""
    out = tmp_path / "o"
    argv = ["pvm", "train", "--model", str(env / "m1"), "--data", str(env / "world"), "--out", str(out),
            "--steps", "1", "--batch-size", "2", "--max-length", str(max_length)]
    assert main(argv) == 2
    err = capsys.readouterr().err  # after a progress bar, on its line
    assert "keepsight: error: samples [" in err, err
    assert ("image tokens do not fit" if max_length == 19 else "cuts off every answer token") in err, err
    assert not out.exists()
    assert main(argv[:-2]) == 0 and (out / "pvm.safetensors").is_file()


@pytest.mark.parametrize("extra, message", [
    (["--reward", "yesno"], "--reward: not for --stage sft"),
    (["--tasks", "describe"], "--tasks: not for --stage sft"),
    (["--stage", "grpo", "--init", "{pvm1}", "--layers", "1", "--pvm-hidden-size", "8"],
     "--layers, --pvm-hidden-size: not for --stage grpo"),
    (["--stage", "grpo", "--init", "{pvm1}", "--batch-size", "4"], "--batch-size: not for --stage grpo"),
    (["--stage", "grpo", "--init", "{pvm1}", "--reward", "exact"], "--reward scores the rows of your own dataset"),
    (["--init", "{pvm1}"], "--init: not for --stage sft"),
])
def test_options_of_another_stage_or_data_kind_are_refused(env, tmp_path, capsys, extra, message):
    out = tmp_path / "o"
    argv = ["pvm", "train", "--model", str(env / "m1"), "--data", str(env / "world"), "--out", str(out), "--steps", "1",
            *[x.format(pvm1=env / "pvm1") for x in extra]]
    assert main(argv) == 2
    assert message in _error(capsys)
    assert not out.exists()


def test_bench_refuses_options_it_does_not_take(tmp_path, capsys):
    assert main(["bench", "scan", "--out", str(tmp_path / "b"), "--rows", "5", "--batch", "2"]) == 2
    assert "--batch, --rows do not apply to bench scan (it takes none of them)" in _error(capsys)
    assert main(["bench", "data", "--out", str(tmp_path / "b"), "--new-tokens", "5"]) == 2
    assert "--new-tokens do not apply to bench data (it takes --rows, --batch)" in _error(capsys)
    assert not (tmp_path / "b").exists()


def test_a_benchmark_that_fails_its_checks_leaves_no_out(tmp_path, capsys):
    assert main(["bench", "data", "--rows", "1", "--out", str(tmp_path / "b")]) == 2
    assert "--rows 1 is fewer than one batch (--batch 16)" in _error(capsys)
    assert not (tmp_path / "b").exists()


def test_a_checkpoint_save_that_fails_leaves_no_folder_without_weights(env, tmp_path, capsys, monkeypatch):
    from keepsight.train import trainer as trainer_module

    real, calls = trainer_module.save_model, []

    def full_disk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "save_model", full_disk)
    out = tmp_path / "o"
    argv = ["pvm", "train", "--model", str(env / "m1"), "--data", str(env / "world"), "--out", str(out), "--steps", "2",
            "--batch-size", "2", "--train.save_every", "1"]
    assert main(argv) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint-1"]  # the good one, no half one
    monkeypatch.setattr(trainer_module, "save_model", real)
    assert main(argv) == 0 and (out / "pvm.safetensors").is_file()  # resumed from checkpoint-1


def test_a_benchmark_runs_with_its_functions_defaults(tmp_path, monkeypatch):
    """The CLI states no default of its own: an option left out is not passed, so the function's default holds
    (the CLI and the function once disagreed: 64 vs 32 new tokens for baselines, 16 vs 8 for pvm-decode)."""
    import inspect

    from keepsight.commands import bench

    seen = {}
    for name, (fn, takes) in bench.BENCHMARKS.items():
        params = inspect.signature(fn).parameters
        assert all(p in params for p in takes.values()), name  # every option maps to a real parameter
        spy = functools.wraps(fn)(lambda out, _n=name, **kw: seen.__setitem__(_n, kw))  # the help reads its signature
        monkeypatch.setitem(bench.BENCHMARKS, name, (spy, takes))
    assert main(["bench", "baselines", "--out", str(tmp_path / "a")]) == 0 and seen["baselines"] == {}
    assert main(["bench", "pvm-decode", "--out", str(tmp_path / "b"), "--batch", "4"]) == 0
    assert seen["pvm-decode"] == {"batches": 4}
    assert "baselines 64" in " ".join(bench.defaults("new_tokens").split())
