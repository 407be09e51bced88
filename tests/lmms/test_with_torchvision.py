"""Paths that need torchvision (present in .venv-lmms, absent from the CPU install): Qwen-VL directories
load with their real processor class, and PVM stage 2 (TRL's GRPO needs a ProcessorMixin) runs on one."""

import importlib.util

import pytest

if importlib.util.find_spec("torchvision") is None:  # never a silent skip: this directory needs it
    raise ImportError("tests/lmms needs torchvision; run `make test-lmms` (it builds .venv-lmms)")

from keepsight.cli import main
from keepsight.models import load_checkpoint
from tiny_checkpoints import save_tiny_checkpoint

pytestmark = pytest.mark.lmms


@pytest.mark.parametrize("name", ["tiny-qwen3vl", "tiny-qwen25vl"])
def test_pvm_sft_then_grpo_on_a_qwen_directory(name, tmp_path):
    from transformers import ProcessorMixin

    model_dir = save_tiny_checkpoint(name, tmp_path / "m")
    _, processor = load_checkpoint(model_dir, dtype="fp32", device="cpu")
    assert isinstance(processor, ProcessorMixin)  # the real Qwen processor, not the image-only fallback
    assert main(["world", "build", "--out", str(tmp_path / "data"), "--n", "4", "--seed", "1"]) == 0
    common = ["--model", str(model_dir), "--data", str(tmp_path / "data")]
    assert main(["pvm", "train", "--stage", "sft", *common, "--out", str(tmp_path / "s1"), "--steps", "1",
                 "--batch-size", "2"]) == 0
    assert main(["pvm", "train", "--stage", "grpo", *common, "--init", str(tmp_path / "s1"), "--out",
                 str(tmp_path / "s2"), "--steps", "1", "--num-generations", "2", "--prompts-per-step", "1",
                 "--max-completion-length", "4"]) == 0
    assert (tmp_path / "s2" / "pvm.safetensors").is_file()
