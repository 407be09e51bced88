"""The control arm for PVM: a parameter-matched LoRA (PEFT) trained on the same data with the same budget.

If PVM's gains were only "more trainable parameters", a LoRA of the same size on the same decoder layers
would match them. The LoRA targets the attention and FFN projections of the layers PVM uses; its rank is
the one whose parameter count is nearest PVM's. Saved in PEFT's own format (``adapter_config.json`` +
``adapter_model.safetensors``), written atomically, plus ``lora_train.json``.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..checks import layer_indices
from ..data import VLMCollator
from ..fingerprint import data_fingerprint, dir_fingerprint
from ..models import arch_info, load_checkpoint
from ..models.arch import check_method, signature, signature_mismatch
from ..models.weights import check_weights
from ..models.withhold import withhold_image
from ..pvm import PVMConfig, build_block
from .recipe import Recipe, publish_directory, run_recipe
from .trainer import TrainOptions

SUMMARY_FILE = "lora_train.json"


@dataclass(kw_only=True)
class LoRATrainConfig(TrainOptions):
    steps: int = 600  # the same budget as PVM stage 1
    lr: float = 1e-3
    batch_size: int = 16
    # PVM's mechanism control: the image's tokens masked out of the language model's attention while training
    # (keepsight.models.withhold); a LoRA has no other way to the image
    withhold_image: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.withhold_image, bool):
            raise ValueError(f"withhold_image must be true or false, got {self.withhold_image!r}")


def pvm_parameter_count(model: nn.Module, config: PVMConfig) -> int:
    """Parameters PVM with ``config`` would add to ``model`` (without attaching it)."""
    info = arch_info(model)
    layers = config.resolve_layers(len(info.layers))
    return sum(sum(p.numel() for p in build_block(info.layer_config(i), config).parameters()) for i in layers)


def lora_targets(model: nn.Module, layers: list[int]) -> list[str]:
    """Full module names of the attention / FFN projections (the table row's ``lora_targets``) of the given decoder
    layers. A layer without some of them as ``nn.Linear`` (a linear-attention layer of a hybrid stack, fused MoE
    experts) is named in a warning: the control adapts fewer kinds of module there than on a dense layer."""
    info = arch_info(model)
    check_method(model, "lora")
    projections = info.spec.lora_targets
    names = {id(m): n for n, m in model.named_modules()}
    out, found = [], {}
    for i in layer_indices("layers", layers, len(info.layers), from_end=False):
        found[i] = set()
        for sub, mod in info.layers[i].named_modules():
            leaf = sub.split(".")[-1]
            if isinstance(mod, nn.Linear) and leaf in projections:
                out.append(f"{names[id(info.layers[i])]}.{sub}")
                found[i].add(leaf)
    if not out:
        raise ValueError(f"no {projections} linear layers found in decoder layers {layers}")
    short = {i: sorted(missing) for i, got in found.items() if (missing := set(projections) - got)}
    if short:
        warnings.warn("the LoRA control adapts only some of the table's projections here (no nn.Linear of that name "
                      "in the layer): " + "; ".join(f"layer {i} lacks {', '.join(m)}" for i, m in short.items()),
                      stacklevel=2)
    return out


def matched_rank(model: nn.Module, targets: list[str], n_params: int) -> tuple[int, int]:
    """The LoRA rank whose parameter count over ``targets`` is nearest ``n_params`` (>= 1); returns
    (rank, parameters at that rank)."""
    mods = dict(model.named_modules())
    per_rank = sum(mods[t].in_features + mods[t].out_features for t in targets)
    rank = max(1, round(n_params / per_rank))
    return rank, rank * per_rank


class LoRARecipe(Recipe):
    """Base model + a LoRA on PVM's layers with PVM's (nearest) parameter count; only ``lora_*`` trains."""

    summary_file = SUMMARY_FILE
    marker_file = "adapter_config.json"
    kind = "lora-adapter"

    def __init__(self, model_dir, dataset, pvm_config: PVMConfig | None, options: LoRATrainConfig):
        super().__init__(options)
        self.model_dir, self.data, self.pvm_config = Path(model_dir), dataset, pvm_config or PVMConfig()

    def request(self) -> dict:
        return {"base": dir_fingerprint(self.model_dir), "pvm": self.pvm_config.to_dict(),
                "data": data_fingerprint(self.data)}

    def load(self):
        from peft import LoraConfig, get_peft_model  # optional dependency (the `train` extra)

        model, processor = load_checkpoint(self.model_dir, dtype=None, device="cpu", expect="autoregressive")
        self.signature = signature(model)
        self.layers = self.pvm_config.resolve_layers(len(arch_info(model).layers))
        self.target_params = pvm_parameter_count(model, self.pvm_config)
        targets = lora_targets(model, self.layers)
        self.rank, self.n_params = matched_rank(model, targets, self.target_params)
        if self.options.withhold_image:
            withhold_image(model)
        torch.manual_seed(self.options.seed)
        lora = LoraConfig(r=self.rank, lora_alpha=2 * self.rank, lora_dropout=0.0, target_modules=targets, bias="none")
        model = get_peft_model(model, lora)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        if trainable != self.n_params:
            raise RuntimeError(f"LoRA has {trainable} trainable parameters, expected {self.n_params}")
        return model, processor

    def trainable(self, name: str) -> bool:
        return "lora_" in name

    def dataset(self, processor):
        return self.data

    def collator(self, processor):
        return VLMCollator(processor, self.options.max_length, self.options.skip_bad_rows)

    def summarise(self, model, processor, logs):
        return {"base": str(self.model_dir), "base_signature": self.signature, "layers": self.layers,
                "rank": self.rank, "lora_parameters": self.n_params, "pvm_parameters": self.target_params}

    def publish(self, model, processor, out, summary):
        publish_directory(out, self.summary_file, summary, model, "",
                          lambda tmp, sd: model.save_pretrained(tmp, state_dict=sd), kind=self.kind)


def train_lora_control(model_dir: str | os.PathLike, dataset, out: str | os.PathLike,
                       pvm_config: PVMConfig | None = None, cfg: LoRATrainConfig | None = None,
                       stop_after: int | None = None, progress: bool = True, grad_accum: int = 1,
                       overwrite: bool = False) -> dict | None:
    """Train a LoRA matched to the PVM that ``pvm_config`` would add (same layers, nearest size) on ``dataset``
    (``Sample``s). ``cfg.batch_size`` is the global batch (see ``run_trainer``); only the main process writes."""
    recipe = LoRARecipe(model_dir, dataset, pvm_config, cfg or LoRATrainConfig())
    return run_recipe(recipe, out, stop_after, progress, grad_accum, overwrite)


def apply_lora(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """The base ``model`` with the LoRA in ``directory`` merged into its weights (a plain HF model again)."""
    from peft import PeftModel  # optional dependency (the `train` extra)

    directory = Path(directory)
    config = directory / "adapter_config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{directory} is not a LoRA adapter: adapter_config.json is missing")
    try:
        json.loads(config.read_text())
    except ValueError as e:
        raise ValueError(f"{config} is not valid JSON ({e})") from None
    weights = [directory / n for n in ("adapter_model.safetensors", "adapter_model.bin") if (directory / n).is_file()]
    if not weights:
        raise FileNotFoundError(f"{directory} is not a LoRA adapter: adapter_model.safetensors is missing")
    if weights[0].suffix == ".safetensors":
        check_weights(directory, [weights[0]])
    summary = directory / SUMMARY_FILE
    if summary.is_file():  # trained by keepsight: it records the base it fits (keepsight >= 0.2)
        try:
            recorded = json.loads(summary.read_text()).get("base_signature")
        except (ValueError, AttributeError) as e:
            raise ValueError(f"{summary} is corrupt ({type(e).__name__}: {e})") from None
        detail = signature_mismatch(recorded, model) if recorded else None
        if detail:
            raise ValueError(f"LoRA adapter {directory} does not fit this model ({detail})")
    try:
        return PeftModel.from_pretrained(model, str(directory)).merge_and_unload().eval()
    except (RuntimeError, ValueError, KeyError) as e:  # shape mismatches, missing target modules
        raise ValueError(f"LoRA adapter {directory} does not fit this model ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:300]})") from None
