import json
import subprocess
import sys

import pytest
import torch

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
        (["world", "train", "--out", "{tmp}/m", "--n", "4", "--stage", "ground"], "no ground stage"),
        (["world", "eval", "--model", "{tmp}", "--data", "{tmp}"], "world.json is missing"),
    ],
)
def test_cli_errors_are_clear(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    # the error line (on a busy machine a warning about free cores may come first)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("keepsight: error:")]
    assert len(errors) == 1 and message in errors[0]


def test_console_script_is_installed(tmp_path):
    out = subprocess.run([sys.executable, "-m", "keepsight.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "demo" in out.stdout and "world" in out.stdout


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    from keepsight.world.models import build_model
    from keepsight.world.processor import build_processor

    d = tmp_path_factory.mktemp("base")
    processor = build_processor()
    build_model("tiny-llava", processor.tokenizer).save_pretrained(d)
    processor.save_pretrained(d)
    assert main(["world", "build", "--out", str(d / "data"), "--n", "6", "--seed", "1"]) == 0
    return d


def test_training_commands_under_accelerate_launch(tiny_base, tmp_path):
    """PVM stages 1 and 2, the LoRA control and bridge phase 1 run as `accelerate launch -m keepsight.cli ...`."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "keepsight.cli"]
    common = ["--model", str(tiny_base), "--data", str(tiny_base / "data")]
    runs = [
        ["pvm", "train", "--stage", "sft", *common, "--out", str(tmp_path / "s1"), "--steps", "2", "--batch-size", "2"],
        ["pvm", "train", "--stage", "grpo", *common, "--init", str(tmp_path / "s1"), "--out", str(tmp_path / "s2"),
         "--steps", "1", "--num-generations", "2", "--prompts-per-step", "1", "--max-completion-length", "4"],
        ["lora", "train", *common, "--out", str(tmp_path / "l"), "--steps", "2", "--batch-size", "2"],
        ["bridge", "train", "--phase", "1", *common, "--out", str(tmp_path / "b1"), "--steps", "2", "--batch-size", "2"],
    ]
    for argv in runs:
        out = subprocess.run(launch + argv, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "s2" / "pvm.safetensors").is_file() and (tmp_path / "s2" / "pvm_grpo.json").is_file()
    assert (tmp_path / "l" / "adapter_model.safetensors").is_file()
    assert json.loads((tmp_path / "b1" / "config.json").read_text())["bridge"]["kind"] == "lia_mtr"
    assert main(["world", "eval", *common, "--pvm", str(tmp_path / "s2"), "--lora", str(tmp_path / "l")]) == 2


def test_grpo_needs_its_stage1_adapter(tiny_base, tmp_path, capsys):
    argv = ["pvm", "train", "--stage", "grpo", "--model", str(tiny_base), "--data", str(tiny_base / "data"),
            "--out", str(tmp_path / "g")]
    assert main(argv) == 2
    assert "needs --init" in capsys.readouterr().err
    assert main(argv + ["--init", str(tmp_path / "missing")]) == 2
    assert "is not a PVM adapter" in capsys.readouterr().err


def test_bridge_train_errors(tiny_base, tmp_path, capsys):
    common = ["--model", str(tiny_base), "--data", str(tiny_base / "data")]
    assert main(["bridge", "train", "--phase", "2", *common, "--out", str(tmp_path / "p2")]) == 2
    assert "has no bridge" in capsys.readouterr().err
    assert main(["bridge", "train", "--phase", "1", *common, "--out", str(tmp_path / "p1"), "--bridge", "qformer"]) == 2
    assert "unknown bridge kind 'qformer'" in capsys.readouterr().err


def test_diffusion_train_needs_a_world_base(tiny_base, tmp_path, capsys):
    argv = ["diffusion", "train", "--base", str(tmp_path), "--data", str(tiny_base / "data"), "--out", str(tmp_path / "d")]
    assert main(argv) == 2
    assert "no finished vision stage" in capsys.readouterr().err


def test_dtype_device_and_precision_options(tiny_base, tmp_path, capsys, monkeypatch):
    """Inference commands load --model in --dtype on --device; training commands take --precision / --device."""
    from safetensors.torch import load_file
    from transformers import Trainer

    import keepsight.train.distributed as wd

    seen = []
    original = Trainer.training_step

    def spy(self, model, inputs, *args, **kwargs):  # what the Trainer's accelerator really does
        seen.append((self.args.bf16, self.accelerator.mixed_precision, self.accelerator.native_amp))
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(Trainer, "training_step", spy)

    common = ["--model", str(tiny_base), "--data", str(tiny_base / "data")]
    assert main(["world", "eval", *common, "--limit", "2", "--dtype", "bf16", "--device", "cpu",
                 "--out", str(tmp_path / "e.json")]) == 0
    assert "CHAIRi" in capsys.readouterr().out and (tmp_path / "e.json").is_file()
    assert main(["world", "eval", *common, "--limit", "4", "--balanced", "--withhold-image"]) == 0
    assert "prior-balanced yes/no" in capsys.readouterr().out
    argv = ["pvm", "train", "--stage", "sft", *common, "--out", str(tmp_path / "bf16"), "--steps", "2",
            "--batch-size", "2", "--precision", "bf16", "--device", "cpu"]
    assert main(argv) == 0
    assert seen and set(seen) == {(True, "bf16", True)}  # bf16 autocast on the CPU, every step
    adapter = load_file(tmp_path / "bf16" / "pvm.safetensors")
    assert {t.dtype for t in adapter.values()} == {torch.float32}  # fp32 master weights under bf16 autocast
    assert main(argv[:-3] + ["fp16", "--device", "cpu"]) == 2
    assert "fp16 mixed precision needs a GPU" in capsys.readouterr().err
    assert wd.trainer_placement()["bf16"] is False  # the options end with the command
    if not torch.cuda.is_available():
        assert main(argv[:-1] + ["cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
        assert main(["world", "eval", *common, "--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
    assert main(["world", "eval", "--model", str(tmp_path), *common[2:]]) == 2  # no config.json
    assert "config.json is missing" in capsys.readouterr().err
