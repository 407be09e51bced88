"""The control arm for PVM: a parameter-matched LoRA (PEFT) trained on the same data with the same budget.

If PVM's gains were only "more trainable parameters", a LoRA of the same size on the same decoder layers
would match them. The LoRA targets the attention and FFN projections of the layers PVM uses; its rank is
the one whose parameter count is nearest PVM's. Saved in PEFT's own format (``adapter_config.json`` +
``adapter_model.safetensors``), written atomically, plus ``lora_train.json``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..atomic import write_json
from ..probes.arch import arch_info
from ..pvm import PVMBranch, PVMConfig
from ..world.data import VLMCollator, VLMDataset, WorldSamples
from ..world.distributed import batch_layout, gather_state_dict, main_process_writes
from ..world.evaluate import load_vlm
from ..world.train import StageConfig, atomic_save_dir, run_trainer

SUMMARY_FILE = "lora_train.json"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoRATrainConfig:
    steps: int = 600  # the same budget as PVM stage 1
    lr: float = 1e-3
    batch_size: int = 16
    seed: int = 0
    save_every: int = 200

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


def pvm_parameter_count(model: nn.Module, config: PVMConfig) -> int:
    """Parameters PVM with ``config`` would add to ``model`` (without attaching it)."""
    info = arch_info(model)
    hidden = info.language_model.config.hidden_size
    layers = config.resolve_layers(len(info.layers))
    return len(layers) * sum(p.numel() for p in PVMBranch(hidden, config).parameters())


def lora_targets(model: nn.Module, layers: list[int]) -> list[str]:
    """Full module names of the attention / FFN projections of the given decoder layers."""
    info = arch_info(model)
    names = {id(m): n for n, m in model.named_modules()}
    out = []
    for i in layers:
        if not 0 <= i < len(info.layers):
            raise ValueError(f"layer {i} out of range for a model with {len(info.layers)} decoder layers")
        for sub, mod in info.layers[i].named_modules():
            if isinstance(mod, nn.Linear) and sub.split(".")[-1] in PROJECTIONS:
                out.append(f"{names[id(info.layers[i])]}.{sub}")
    if not out:
        raise ValueError(f"no {PROJECTIONS} linear layers found in decoder layers {layers}")
    return out


def matched_rank(model: nn.Module, targets: list[str], n_params: int) -> tuple[int, int]:
    """The LoRA rank whose parameter count over ``targets`` is nearest ``n_params`` (>= 1); returns
    (rank, parameters at that rank)."""
    mods = dict(model.named_modules())
    per_rank = sum(mods[t].in_features + mods[t].out_features for t in targets)
    rank = max(1, round(n_params / per_rank))
    return rank, rank * per_rank


def train_lora_control(model_dir: str | os.PathLike, samples: WorldSamples, out: str | os.PathLike,
                       pvm_config: PVMConfig | None = None, cfg: LoRATrainConfig | None = None,
                       stop_after: int | None = None, progress: bool = True, grad_accum: int = 1) -> dict | None:
    """Train a LoRA matched to the PVM that ``pvm_config`` would add (same layers, nearest size).
    ``cfg.batch_size`` is the global batch (see ``run_trainer``); only the main process writes."""
    from peft import LoraConfig, get_peft_model

    out = Path(out)
    if (out / SUMMARY_FILE).is_file() and (out / "adapter_config.json").is_file():
        return json.loads((out / SUMMARY_FILE).read_text())
    cfg = cfg or LoRATrainConfig()
    pvm_config = pvm_config or PVMConfig()
    model, processor = load_vlm(model_dir)
    layers = pvm_config.resolve_layers(len(arch_info(model).layers))
    target_params = pvm_parameter_count(model, pvm_config)
    targets = lora_targets(model, layers)
    rank, n_params = matched_rank(model, targets, target_params)
    torch.manual_seed(cfg.seed)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets, bias="none")
    model = get_peft_model(model, lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable != n_params:
        raise RuntimeError(f"LoRA has {trainable} trainable parameters, expected {n_params}")
    data = VLMDataset(samples, VLMDataset.TASKS, cfg.seed, describe_repeats=3)
    model.train()
    logs, step = run_trainer(model, data, VLMCollator(processor), StageConfig(cfg.steps, cfg.lr, cfg.batch_size),
                             out / "checkpoints", cfg.seed, cfg.save_every, stop_after, progress,
                             grad_accum=grad_accum)
    if step < cfg.steps:
        return None
    losses = [h["loss"] for h in logs if "loss" in h]
    summary = {"base": str(model_dir), "train": asdict(cfg), "batch_layout": batch_layout(cfg.batch_size, grad_accum),
               "layers": layers, "rank": rank,
               "lora_parameters": n_params, "pvm_parameters": target_params,
               "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
               "log_history": logs}

    sd = gather_state_dict(model)  # None unless FSDP-sharded

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=sd)
        write_json(tmp / SUMMARY_FILE, summary)

    main_process_writes(atomic_save_dir, out, write)  # replaces ``out`` (and its checkpoints) in one rename
    return summary


def apply_lora(model: nn.Module, directory: str | os.PathLike) -> nn.Module:
    """The base ``model`` with the LoRA in ``directory`` merged into its weights (a plain HF model again)."""
    from peft import PeftModel

    directory = Path(directory)
    if not (directory / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{directory} is not a LoRA adapter: adapter_config.json is missing")
    return PeftModel.from_pretrained(model, str(directory)).merge_and_unload().eval()
