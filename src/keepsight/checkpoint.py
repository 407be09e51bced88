"""Load any local Hugging Face VLM directory keepsight supports, with dtype and device choices.

One code path for tiny world models and real checkpoints (``keepsight ... --model DIR``, the lmms-eval
plugin, the Python API):

- ``checkpoint_kind(dir)`` reads ``config.json`` only: ``llava`` / ``keepsight_llava`` (LLaVA with a keepsight
  bridge) / ``qwen3_vl`` / ``qwen2_5_vl`` (autoregressive VLMs), ``llada_v`` (LLaVA whose text model is
  a LLaDA-style masked-diffusion LM), ``llada_lm`` (text-only LLaDA, incl. OLMo-style LLaDA configs) or
  ``llava_llada`` (LLaDA-V's own config, which names its vision tower by hub id only). Anything else is
  an error naming what is supported.
- ``load_checkpoint(dir, dtype=, device=)`` returns ``(model, processor)`` in eval mode. Safetensors in
  transformers' layout load with the Auto classes; LLaDA / LLaDA-V repository layouts go through
  ``keepsight.diffusion.load_llada_v`` (its key map).
- ``load_processor(dir)``: ``AutoProcessor``. Qwen-VL processors also build a video processor, which needs
  torchvision; where torchvision is missing (the CPU install here) an image-only
  ``QwenImageProcessor`` with the same call signature is built from the directory's tokenizer and
  image processor instead.

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

AUTOREGRESSIVE = ("llava", "keepsight_llava", "qwen3_vl", "qwen2_5_vl")
DIFFUSION = ("llada_v", "llada_lm", "llava_llada")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)


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
    """What a directory holds (see the module docstring); unsupported architectures are a ValueError."""
    raw = read_config(path)
    model_type = raw.get("model_type")
    if "d_model" in raw and model_type in (None, "llada"):
        return "llada_lm"  # OLMo-style LLaDA config
    if model_type == "llada":
        return "llada_lm"
    if model_type == "llava_llada":
        return "llava_llada"
    if model_type == "llava" and (raw.get("text_config") or {}).get("model_type") == "llada":
        return "llada_v"
    if model_type in AUTOREGRESSIVE:
        return model_type
    raise ValueError(f"{path}: unsupported architecture model_type={model_type!r}; keepsight loads "
                     f"{', '.join(AUTOREGRESSIVE)} VLMs and LLaDA-V-style diffusion VLMs (llava with a llada "
                     "text_config, or LLaDA / LLaDA-V checkpoint layouts)")


def _has_hf_layout(path: Path) -> bool:
    """True when the safetensors were written by ``save_pretrained`` (LLaVA's ``model.language_model.*``)."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weights")
    for f in files:
        with safe_open(f, "pt") as fh:
            if any(k.startswith(("model.language_model.", "language_model.model.")) for k in fh.keys()):
                return True
    return False


def load_checkpoint(path: str | os.PathLike, dtype: str | torch.dtype | None = "auto",
                    device: str | torch.device | None = "auto", expect: str | None = None):
    """``(model, processor)`` for a supported directory, on ``device`` in ``dtype``, eval mode.

    ``expect``: ``"autoregressive"`` or ``"diffusion"`` turns loading the other family into a clear error
    (e.g. a LLaDA-V directory given to ``keepsight world eval``)."""
    path = Path(path)
    kind = checkpoint_kind(path)
    family = "diffusion" if kind in DIFFUSION else "autoregressive"
    if expect is not None and expect != family:
        def a(word: str) -> str:
            return ("an " if word[0] in "aeiou" else "a ") + word

        raise ValueError(f"{path} is {a(family)} checkpoint ({kind}); this needs {a(expect)} one")
    dev = resolve_device(device)
    dt = None if dtype is None else resolve_dtype(dtype, dev)  # None: as saved
    if kind == "llava_llada":
        raise ValueError(f"{path}: LLaDA-V's own llava_llada config names its vision tower by hub id only; load it "
                         "with keepsight.diffusion.load_llada_v(dir, config=LlavaConfig(...)) and save_pretrained "
                         "it with its processor")
    if kind == "llada_lm":
        from .diffusion import load_llada_v

        model = load_llada_v(path, dtype=dt)
        from transformers import AutoTokenizer

        return model.to(dev).eval(), AutoTokenizer.from_pretrained(path)
    processor = load_processor(path, kind)
    if kind == "llada_v":
        from transformers import LlavaForConditionalGeneration

        from .diffusion import load_llada_v  # also registers model_type "llada"

        if _has_hf_layout(path):
            model = LlavaForConditionalGeneration.from_pretrained(path, dtype=dt or "auto")
        else:
            model = load_llada_v(path, dtype=dt)
        return model.to(dev).eval(), processor
    from transformers import AutoModelForImageTextToText

    from .bridge import swap  # noqa: F401  (registers model_type keepsight_llava)

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=dt or "auto")
    return model.to(dev).eval(), processor


# ----------------------------------------------------------------------------- processors


def load_processor(path: str | os.PathLike, kind: str | None = None):
    """The directory's processor; an image-only ``QwenImageProcessor`` for Qwen-VL without torchvision."""
    from transformers import AutoProcessor

    path = Path(path)
    kind = kind or checkpoint_kind(path)
    try:
        processor = AutoProcessor.from_pretrained(path)
    except (ImportError, AttributeError, ValueError, OSError) as e:
        if kind in ("qwen3_vl", "qwen2_5_vl"):
            return QwenImageProcessor.from_pretrained(path)
        raise ValueError(f"cannot load a processor from {path}: {type(e).__name__}: {e}") from e
    if getattr(processor, "image_processor", None) is None:
        if kind in ("qwen3_vl", "qwen2_5_vl"):
            return QwenImageProcessor.from_pretrained(path)
        raise ValueError(f"{path} has no image processor ({type(processor).__name__}); save the model's processor "
                         "beside it (processor.save_pretrained)")
    return processor


class QwenImageProcessor:
    """Qwen-VL's processor for images only (what ``Qwen3VLProcessor`` / ``Qwen2_5_VLProcessor`` do for
    images, without their torchvision-backed video half): each image token in the text (the chat template
    writes one per image, between the vision start / end markers) becomes ``grid_t * grid_h * grid_w /
    merge_size**2`` copies; ``mm_token_type_ids`` marks them with 1 (transformers 5 needs it)."""

    def __init__(self, image_processor, tokenizer, image_token: str, chat_template: str | None = None):
        self.image_processor, self.tokenizer, self.image_token = image_processor, tokenizer, image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        self.merge = int(getattr(image_processor, "merge_size", 2))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> QwenImageProcessor:
        from transformers import AutoImageProcessor, AutoTokenizer

        path = Path(path)
        raw = read_config(path)
        tok = AutoTokenizer.from_pretrained(path)
        image_token_id = raw.get("image_token_id", raw.get("image_token_index"))
        if image_token_id is None:
            raise ValueError(f"{path}/config.json names no image_token_id")
        template = None
        jinja = path / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text()
        elif (path / "chat_template.json").is_file():
            template = json.loads((path / "chat_template.json").read_text()).get("chat_template")
        try:
            image_processor = AutoImageProcessor.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path} has no image processor config (preprocessor_config.json): {e}") from e
        return cls(image_processor, tok, tok.convert_ids_to_tokens(int(image_token_id)), template)

    def apply_chat_template(self, messages, **kwargs):
        kwargs.setdefault("chat_template", self.chat_template)
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def __call__(self, text=None, images=None, return_tensors="pt", padding=False, **kwargs):
        texts = [text] if isinstance(text, str) else list(text)
        out = {}
        if images:
            pix = self.image_processor(images=images, return_tensors="pt")
            grid = pix["image_grid_thw"]  # [n_images, 3]
            k, expanded = 0, []
            for t in texts:
                parts = t.split(self.image_token)
                s = parts[0]
                for rest in parts[1:]:
                    if k >= len(grid):
                        raise ValueError(f"more image tokens in the text than images ({len(grid)})")
                    s += self.image_token * (int(grid[k].prod()) // self.merge**2) + rest
                    k += 1
                expanded.append(s)
            if k != len(grid):
                raise ValueError(f"{k} image tokens in the text but {len(grid)} images")
            texts = expanded
            out.update(pixel_values=pix["pixel_values"], image_grid_thw=grid)
        enc = self.tokenizer(texts, return_tensors=return_tensors, padding=padding, **kwargs)
        enc["mm_token_type_ids"] = (enc["input_ids"] == self.image_token_id).long()
        from transformers import BatchFeature

        return BatchFeature({**enc, **out})

    def batch_decode(self, *args, **kwargs):
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.tokenizer.decode(*args, **kwargs)
