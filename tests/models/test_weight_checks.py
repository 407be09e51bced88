"""Every loader checks what it loads: a checkpoint whose file is intact but holds NaN / inf (bytes overwritten in the
middle, a diverged run), a released-layout PVM checkpoint with a NaN block, a LLaDA-V with a NaN tensor, an adapter of
integer tensors: each is an error naming the file and the tensor, never a model that answers without a word."""

import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from keepsight.models import load_checkpoint, load_llada_v
from keepsight.pvm import PVMConfig, attach_pvm, load_pvm, save_pvm
from keepsight.pvm.layout import save_released
from tiny_checkpoints import save_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def _poison(path, key_part: str, value=float("nan")) -> str:
    """Set one element of the first tensor whose name holds ``key_part`` to ``value``; returns the tensor's name."""
    w = load_file(str(path))
    key = next(k for k in sorted(w) if key_part in k and w[k].is_floating_point())
    w[key].view(-1)[0] = value
    save_file(w, str(path), metadata={"format": "pt"})
    return key


def test_bytes_overwritten_inside_a_weight_file_are_named(tmp_path):
    d = save_tiny_checkpoint("tiny-llava", tmp_path / "m")
    weights = d / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        n_header = 8 + int.from_bytes(weights.read_bytes()[:8], "little")
        assert f.keys()
    data = bytearray(weights.read_bytes())
    middle = n_header + (len(data) - n_header) // 2
    data[middle:middle + 4096] = b"\xff" * 4096  # 0xffffffff is a NaN in every float width
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"/m: weights .* hold NaN or inf"):
        load_checkpoint(d, dtype=None, device="cpu")


def test_a_nan_weight_is_named_with_its_tensor(tmp_path):
    d = save_tiny_checkpoint("tiny-llava", tmp_path / "m")
    key = _poison(d / "model.safetensors", "layers.1.mlp", float("inf"))
    with pytest.raises(ValueError, match="hold NaN or inf") as e:
        load_checkpoint(d, dtype=None, device="cpu")
    assert "layers.1.mlp" in str(e.value) and str(d) in str(e.value), (key, str(e.value))


def test_a_released_pvm_checkpoint_with_a_nan_block_is_refused(tmp_path, capfd, caplog):
    base = save_tiny_checkpoint("tiny-llava", tmp_path / "base")
    model, processor = load_checkpoint(base, dtype="float32", device="cpu")
    attach_pvm(model, PVMConfig(layers=[1]))
    out = save_released(model, tmp_path / "released", processor)
    capfd.readouterr()
    caplog.clear()
    with caplog.at_level("WARNING"):
        load_checkpoint(out, dtype="float32", device="cpu")
    printed = capfd.readouterr()
    # keepsight reads the blocks itself: transformers does not report them as UNEXPECTED
    assert "pvm_block" not in printed.out + printed.err + caplog.text
    _poison(out / "model.safetensors", "pvm_block")
    with pytest.raises(ValueError, match="pvm.*hold NaN or inf"):
        load_checkpoint(out, dtype="float32", device="cpu")


def test_a_llada_v_with_a_nan_tensor_is_refused(tmp_path):
    d = save_tiny_checkpoint("tiny-llada-v", tmp_path / "llada")
    _poison(next(d.glob("*.safetensors")), "layers.0")
    with pytest.raises(ValueError, match="hold NaN or inf"):
        load_checkpoint(d, dtype=None, device="cpu")
    with pytest.raises(ValueError, match="hold NaN or inf"):
        load_llada_v(d)


def test_an_adapter_of_integer_tensors_is_refused(tmp_path):
    base = save_tiny_checkpoint("tiny-llava", tmp_path / "base")
    model, _ = load_checkpoint(base, dtype="float32", device="cpu")
    attach_pvm(model, PVMConfig(layers=[1]))
    adapter = save_pvm(model, tmp_path / "a")
    w = load_file(str(adapter / "pvm.safetensors"))
    save_file({k: v.to(torch.int32) for k, v in w.items()}, str(adapter / "pvm.safetensors"))
    fresh, _ = load_checkpoint(base, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="not floating point"):
        load_pvm(fresh, adapter)
    shutil.rmtree(adapter)
