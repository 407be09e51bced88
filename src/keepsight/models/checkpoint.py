"""Load any local Hugging Face VLM directory keepsight supports, with dtype and device choices.

One code path for tiny world models and real checkpoints (``keepsight ... --model DIR``, the lmms-eval
plugin, the Python API):

- ``checkpoint_kind(dir)`` reads ``config.json`` only and names its kind in the architecture table
  (``keepsight.models.arch``): ``llava`` / ``keepsight_llava`` / ``qwen3_vl`` / ``qwen2_5_vl``
  (autoregressive VLMs), ``llada_v`` / ``llada_lm`` / ``llava_llada`` / ``lavida`` (masked-diffusion). Anything
  else is an error naming what is supported.
- ``load_checkpoint(dir, dtype=, device=)`` returns ``(model, processor)`` in eval mode. Safetensors in
  transformers' layout load with the Auto classes (after ``register_model_types()``); LLaDA / LLaDA-V
  repository layouts (LaViDa's release too: ``keepsight.models.lavida``) go through
  ``keepsight.models.llada.load_llada_v`` (its key map); a directory in a method's layout loads through the reader
  that method's package declares (``keepsight.models.layouts``: the released PVM layout, ``text_config.pvm_layers``
  and ``pvm_block.*`` weights, loads its backbone's class with the released blocks attached, without the
  directory's own Python files).
- ``load_processor(dir)``: ``AutoProcessor``; where the table names a fallback and the directory's own processor
  cannot be built (its video half needs torchvision, which the CPU install lacks), that image-only processor
  (``keepsight.models.processors.QwenImageProcessor``, ``keepsight.models.image_only``).

dtype: ``auto`` (bf16 on a CUDA device that supports it, else fp16 on CUDA, fp32 on CPU), ``float32`` /
``fp32``, ``bfloat16`` / ``bf16``, ``float16`` / ``fp16``, or ``None``: the dtype the checkpoint was saved
in (transformers' own default; what the training commands use). device: ``auto`` (``cuda`` when present, else
``cpu``), ``cpu``, ``cuda``, ``cuda:N``, ``mps``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import (
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
)

from .arch import ARCHITECTURES, arch_spec, kind_of, supported
from .image_only import IMAGE_ONLY
from .lavida import LavidaForConditionalGeneration, is_release, release_config, release_processor
from .layouts import layout_of
from .llada import load_llada_v
from .llada_official import UNUSED_KEYS, official_config, official_processor
from .processors import QwenImageProcessor
from .registry import register_model_types
from .weights import check_finite_weights, check_weights

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")  # a saved processor's / image processor's
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# a row's processor_fallback -> the class that builds it from a directory (when the directory's own cannot be built)
FALLBACKS = {"QwenImageProcessor": QwenImageProcessor, **IMAGE_ONLY}


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """``auto`` -> cuda when available (``cuda:$LOCAL_RANK`` under a launcher), else cpu; checks availability."""
    if isinstance(name, torch.device):
        name = str(name)
    name = "auto" if name in (None, "") else str(name).strip()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device must be auto, cpu, cuda, cuda:N or mps, got {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available here; use --device cpu (or auto)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} asked for, but MPS is not available here")
    return device


def resolve_dtype(name: str | torch.dtype | None = "auto", device: torch.device | None = None) -> torch.dtype:
    """A dtype name (``DTYPE_CHOICES``) -> torch dtype; ``auto`` depends on ``device`` (see the module doc)."""
    if isinstance(name, torch.dtype):
        return name
    name = "auto" if name in (None, "") else str(name).strip().lower()
    if name == "auto":
        if device is not None and device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {name!r}")
    return DTYPES[name]


def read_config(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    cfg = path / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(f"{path} holds no model: config.json is missing")
    try:
        return json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg} is not valid JSON: {e}") from None


def checkpoint_kind(path: str | os.PathLike) -> str:
    """What a directory holds (its kind in ``keepsight.models.arch``); unsupported ones are a ValueError."""
    try:
        kind = kind_of(read_config(path))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    if ARCHITECTURES[kind].family == "text":
        raise ValueError(f"{path}: unsupported architecture model_type={kind!r} (a text-only language model); "
                         f"{supported()}")
    return kind


def load_checkpoint(path: str | os.PathLike, dtype: str | torch.dtype | None = "auto",
                    device: str | torch.device | None = "auto", expect: str | None = None):
    """``(model, processor)`` for a supported directory, on ``device`` in ``dtype``, eval mode.

    ``expect``: ``"autoregressive"`` or ``"diffusion"`` turns loading the other family into a clear error
    (e.g. a LLaDA-V directory given to ``keepsight world eval``)."""
    path = Path(path)
    kind = checkpoint_kind(path)
    spec = ARCHITECTURES[kind]
    if expect is not None and expect != spec.family:
        def a(word: str) -> str:
            return ("an " if word[0] in "aeiou" else "a ") + word

        raise ValueError(f"{path} is {a(spec.family)} checkpoint ({kind}); this needs {a(expect)} one")
    if not spec.loadable:
        raise ValueError(f"{path}: {spec.note or f'{kind} directories cannot be loaded'}")
    dev = resolve_device(device)
    dt = None if dtype is None else resolve_dtype(dtype, dev)  # None: as saved
    register_model_types()
    if kind == "llada_lm":
        check_weights(path)
        model = load_llada_v(path, dtype=dt)  # its weights checked there
        return model.to(dev).eval(), AutoTokenizer.from_pretrained(path)
    check_weights(path)
    if kind == "llava_llada":  # LLaDA-V as shipped: config, processor and key names from its own layout
        config = official_config(read_config(path), path)
        model = load_llada_v(path, config=config, drop=UNUSED_KEYS, dtype=dt)
        return model.to(dev).eval(), official_processor(path, config)
    if kind == "lavida" and is_release(read_config(path)):  # LaViDa as released: OLMo-style LLaDA, LLaVA's names
        config = release_config(read_config(path), path)
        model = load_llada_v(path, config=config, dtype=dt, model_class=LavidaForConditionalGeneration)
        return model.to(dev).eval(), release_processor(path, config)
    processor = load_processor(path, kind)
    config = read_config(path)
    if kind == "llada_v":
        model = load_llada_v(path, dtype=dt)
    else:
        layout = layout_of(config)  # a method's layout (PVM as released: its blocks attached, no remote code run)
        if layout is not None:
            model = layout.load(path, config, dt)
        else:
            model = AutoModelForImageTextToText.from_pretrained(path, dtype=dt or "auto")
        check_finite_weights(model, path)
    return model.to(dev).eval(), processor


# ----------------------------------------------------------------------------- processors


def load_processor(path: str | os.PathLike, kind: str | None = None):
    """The directory's processor; the table's fallback (image-only Qwen-VL) where AutoProcessor cannot build it."""
    path = Path(path)
    spec = arch_spec(kind or checkpoint_kind(path))
    if not any((path / f).is_file() for f in PROCESSOR_FILES):
        tokenizer = "" if any((path / f).is_file() for f in TOKENIZER_FILES) else " (nor a tokenizer)"
        raise ValueError(
            f"{path} has no processor{tokenizer}: none of {', '.join(PROCESSOR_FILES)} is there, and a "
            f"{spec.kind} processor's image settings (sizes, normalisation, tiling) cannot be read from config.json. "
            "Many fine-tuned checkpoints are shipped without one: save the processor of the checkpoint it was "
            "fine-tuned from beside the weights (from Python: AutoProcessor.from_pretrained(BASE).save_pretrained("
            f"'{path}')) and load again")
    register_model_types()  # the image-only processors, where torchvision is missing
    fallback = FALLBACKS.get(spec.processor_fallback)
    try:
        processor = AutoProcessor.from_pretrained(path)
    except (ImportError, AttributeError, ValueError, OSError, TypeError) as e:
        if fallback is not None:
            return fallback.from_pretrained(path)
        raise ValueError(f"cannot load a processor from {path}: {type(e).__name__}: {e}") from e
    if getattr(processor, "image_processor", None) is None:
        if fallback is not None:
            return fallback.from_pretrained(path)
        raise ValueError(f"{path} has no image processor ({type(processor).__name__}); save the model's processor "
                         "beside it (processor.save_pretrained)")
    return processor
