"""PVM's mechanism control: the image withheld from the language model's sequence (``keepsight.models.withhold``), its
embeddings left only in PVM's visual memory.

Three arms answer held-out yes/no and short open questions with the image withheld: the base (its text-only level),
PVM stage 1 trained with the image withheld, and the parameter-matched LoRA trained the same way (it has no path to
the image). The yes/no set is prior-balanced (``keepsight.world.balanced``): each question is asked of its own scene
and of another where the same words have the other answer, so a model that does not see the image scores exactly
0.5 whatever priors it learned, and any arm above that reads the image. PVM must rise above the text-only level
(Wilson intervals apart); the LoRA cannot. Both train on the instruct mix with its yes/no task balanced the same way
(``yes_no_balanced``), so that reading the image is the only way to lower the yes/no loss. The ordinary yes/no set
is scored beside it: there the LoRA rises too, by the priors it learned, which is why it is not the yardstick. The
base with the image is the ceiling. Open answers (exact match, one question of each kind per scene) are the third
lens. ``ablations`` adds PVM arms trained and scored the same way with some block settings changed (e.g. the
released block without its output norm, ``{"pvm_sft_no_output_norm": {"output_norm": False}}``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..fingerprint import digest
from ..metrics import wilson
from ..models import load_checkpoint
from ..models.withhold import image_withheld
from ..pvm import PVMConfig, load_pvm
from ..train.lora_control import LoRATrainConfig, apply_lora, train_lora_control
from ..train.pvm_sft import PVMTrainConfig, train_pvm_sft
from ..world.balanced import balanced_yes_no
from ..world.evaluate import evaluate_open, evaluate_yes_no
from .arm import ExperimentContext

ARMS = ("base_with_image", "base", "pvm_sft", "lora")


@dataclass
class PVMControl:
    pvm: PVMConfig = field(default_factory=PVMConfig)
    # 2,400 steps (a fifth of an epoch of the mix): at 600, PVM stage 1 on the grounded base (seed 2) read the scene
    # in open answers (0.92 against the text-only 0.27) but barely in yes/no (prior-balanced 0.526); at 2,400, 0.592
    sft: PVMTrainConfig = field(default_factory=lambda: PVMTrainConfig(warmup_ratio=0.1, steps=2400))
    lora: LoRATrainConfig = field(default_factory=lambda: LoRATrainConfig(steps=2400))  # the same budget
    # arm name -> PVMConfig fields that differ from ``pvm``: more PVM stage-1 arms, trained and scored the same way
    ablations: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self):
        for arm, overrides in self.ablations.items():
            if not isinstance(arm, str) or arm in ARMS or not re.fullmatch(r"[a-z0-9_]+", arm):
                raise ValueError(f"PVM control ablation {arm!r}: expected a new arm name (lower case, digits, _), "
                                 f"not one of {ARMS}")
            if not isinstance(overrides, dict) or not overrides:
                raise ValueError(f"PVM control ablation {arm!r}: expected the PVMConfig fields it changes "
                                 f"({{field: value}}), got {overrides!r}")
            self.ablated(arm)  # names an unknown PVMConfig field or an invalid value: an error now, not after training

    def ablated(self, arm: str) -> PVMConfig:
        """The block of ablation ``arm``: ``pvm`` with that arm's fields replaced."""
        try:
            return dataclasses.replace(self.pvm, **self.ablations[arm])
        except TypeError as e:
            raise ValueError(f"PVM control ablation {arm!r}: {e}") from None

    def to_dict(self) -> dict:
        return {"pvm": self.pvm.to_dict(), "sft": dataclasses.asdict(self.sft), "lora": dataclasses.asdict(self.lora),
                **({"ablations": self.ablations} if self.ablations else {})}


def _rate(acc: float, n: int) -> dict:
    """An accuracy over ``n`` items with its 95% Wilson interval."""
    low, high = wilson(round(acc * n), n)
    return {"acc": acc, "low": low, "high": high, "n": n}


def _scores(yes_no: dict) -> dict:
    """Overall and per-category yes/no accuracy with 95% Wilson intervals."""
    cats = yes_no["categories"]
    n = sum(v["n"] for v in cats.values())
    return {"all": _rate(yes_no["overall_acc"], n), **{c: _rate(v["acc"], v["n"]) for c, v in sorted(cats.items())}}


def _open_scores(open_acc: dict, n: int) -> dict:
    """Open-answer accuracy per kind (one question of each kind per scene: ``n`` scenes) with 95% Wilson intervals."""
    return {kind: _rate(acc, n) for kind, acc in sorted(open_acc.items())}


def run_pvm_control(exp: PVMControl, ctx: ExperimentContext) -> dict:
    """Train (or reuse) PVM stage 1 and the LoRA with the image withheld, and score the arms (module docstring).
    ``arms``: the prior-balanced yes/no set (the verdict's lens); ``ordinary``: every scene's own yes/no questions;
    ``open``: open answers."""
    model_dir, tc, log = ctx.model_dir, ctx.train_config, ctx.log
    sft_cfg = dataclasses.replace(exp.sft, withhold_image=True)
    lora_cfg = dataclasses.replace(exp.lora, withhold_image=True)
    cache = Path(f"{model_dir}-pvm")
    data_key = "yes_no_balanced"  # the training mix's yes/no task, in the adapters' cache keys
    lora_dir = cache / f"control-lora-{digest([exp.pvm.to_dict(), dataclasses.asdict(lora_cfg), data_key], 12)}"
    train = ctx.scenes()

    def data(seed: int):
        return tc.instruct_mix(train, seed, balanced=True)

    pvm_arms = {"pvm_sft": exp.pvm, **{arm: exp.ablated(arm) for arm in exp.ablations}}
    pvm_dirs, gates = {}, {}
    for arm, block in pvm_arms.items():
        pvm_dirs[arm] = cache / f"control-sft-{digest([block.to_dict(), dataclasses.asdict(sft_cfg), data_key], 12)}"
        log(f"PVM control: {arm}, stage 1 with the image withheld ({sft_cfg.steps} steps) -> {pvm_dirs[arm]}")
        sft = train_pvm_sft(model_dir, data(sft_cfg.seed), pvm_dirs[arm], block, sft_cfg, progress=False)
        gates[arm] = sft.get("after") if sft else None
    log(f"PVM control: the LoRA with the image withheld ({lora_cfg.steps} steps) -> {lora_dir}")
    train_lora_control(model_dir, data(lora_cfg.seed), lora_dir, exp.pvm, lora_cfg, progress=False)
    n = len(ctx.sets.eval)
    balanced = balanced_yes_no(ctx.sets.eval.scenes, ctx.sets.eval.config)
    arms, ordinary = {}, {"base_with_image": _scores(ctx.base["yes_no"])}
    open_arms = {"base_with_image": _open_scores(ctx.base["open"], n)}
    attach = {"base": lambda m: m, **{arm: (lambda m, d=d: load_pvm(m, d)) for arm, d in pvm_dirs.items()},
              "lora": lambda m: apply_lora(m, lora_dir)}
    for arm, put in attach.items():
        model, processor = load_checkpoint(model_dir, dtype=None, device="cpu")
        model = put(model)
        if arm == "base":  # the ceiling: the base with the image, on the same set
            arms["base_with_image"] = _scores(evaluate_yes_no(model, processor, ctx.sets.eval, items=balanced)[0])
        with image_withheld(model):
            arms[arm] = _scores(evaluate_yes_no(model, processor, ctx.sets.eval, items=balanced)[0])
            ordinary[arm] = _scores(evaluate_yes_no(model, processor, ctx.sets.eval)[0])
            open_arms[arm] = _open_scores(evaluate_open(model, processor, ctx.sets.eval), n)
        a, o = arms[arm]["all"], ordinary[arm]["all"]
        log(f"PVM control: arm {arm}, the image withheld: prior-balanced yes/no {a['acc']:.3f} "
            f"[{a['low']:.3f}, {a['high']:.3f}], ordinary yes/no {o['acc']:.3f}")
    text_only = arms["base"]["all"]
    verdict = {arm: {"above_text_only": arms[arm]["all"]["low"] > text_only["high"],
                     "gain": arms[arm]["all"]["acc"] - text_only["acc"]} for arm in (*pvm_arms, "lora")}
    return {"config": exp.to_dict(), "adapters": {**{a: str(d) for a, d in pvm_dirs.items()}, "lora": str(lora_dir)},
            "gates": gates["pvm_sft"], **({"ablation_gates": {a: gates[a] for a in exp.ablations}} if exp.ablations else {}),
            "arms": arms, "ordinary": ordinary, "open": open_arms, "verdict": verdict}
