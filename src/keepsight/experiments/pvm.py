"""The PVM world experiment: arms from one base, same data, same step budget.

- ``base``: the world's base model;
- ``pvm_sft``: + PVM, stage 1 (SFT, backbone frozen);
- ``lora``: + a LoRA with PVM's layers and (nearest) parameter count, the same SFT data and steps: the
  control for "just more trainable parameters";
- ``pvm_grpo``: + PVM, stage 1 then stage 2 (GRPO with verifiable world rewards);
- ``full_ft``: every parameter but the tower fine-tuned on the same data (the upper reference);

and the history regime's oracle: the base asked with the image re-inserted just before the question.

Adapters are cached next to the base (their directory names hash their configs), so a rerun only
evaluates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..fingerprint import digest
from ..models import load_checkpoint
from ..pvm import PVMConfig, load_pvm
from ..train.finetune import FinetuneConfig, train_finetune
from ..train.lora_control import LoRATrainConfig, apply_lora, train_lora_control
from ..train.pvm_grpo import GRPOTrainConfig, train_pvm_grpo
from ..train.pvm_sft import PVMTrainConfig, train_pvm_sft
from ..world.base import TrainConfig
from ..world.evaluate import evaluate_history, oracle_recovery
from ..world.grpo import check_tasks, world_grpo_data
from ..world.tasks import VLMDataset, WorldSamples
from .arm import ExperimentContext, evaluate_arm, relative_change

ARMS = ("base", "pvm_sft", "lora", "pvm_grpo", "full_ft")
PAPER = {"avg_gain_8b": 4.8, "avg_gain_4b": 4.4, "short_rel": 0.061, "long_rel": 0.273, "overhead": 0.0032}


@dataclass
class PVMExperiment:
    pvm: PVMConfig = field(default_factory=PVMConfig)
    sft: PVMTrainConfig = field(default_factory=PVMTrainConfig)
    lora: LoRATrainConfig = field(default_factory=LoRATrainConfig)
    grpo: GRPOTrainConfig = field(default_factory=GRPOTrainConfig)
    finetune: FinetuneConfig | None = field(default_factory=FinetuneConfig)  # the full fine-tuning reference arm
    n_grpo_scenes: int = 1000  # the first scenes of the training set, for GRPO prompts
    grpo_tasks: tuple[str, ...] = ("describe", "open")  # GRPO prompts (keepsight.world.grpo)
    format_weight: float = 0.2  # weight of the format reward (the answer reward has weight 1)
    # tasks every trained arm (stage 1, the LoRA, full fine-tuning) trains on besides the base's own instruct mix:
    # ("describe_ask",) adds the regime's format, a description then a question whose answer follows the image
    train_tasks: tuple[str, ...] = ()
    instruct_mix: bool = True  # False: the trained arms learn from train_tasks alone

    def __post_init__(self) -> None:
        self.grpo_tasks = tuple(check_tasks(self.grpo_tasks))
        self.train_tasks = tuple(self.train_tasks)
        unknown = [t for t in self.train_tasks if t not in VLMDataset.TASKS]
        if unknown:
            raise ValueError(f"unknown train_tasks {unknown}; choose from {list(VLMDataset.TASKS)}")
        if not self.instruct_mix and not self.train_tasks:
            raise ValueError("instruct_mix=False leaves the arms no data: name their train_tasks")

    def to_dict(self) -> dict:
        return {"pvm": self.pvm.to_dict(), "sft": asdict(self.sft), "lora": asdict(self.lora),
                "grpo": asdict(self.grpo), "finetune": asdict(self.finetune) if self.finetune else None,
                "n_grpo_scenes": self.n_grpo_scenes, "grpo_tasks": list(self.grpo_tasks),
                "format_weight": self.format_weight, "train_tasks": list(self.train_tasks),
                "instruct_mix": self.instruct_mix}


def _strip(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "log_history"}


def _keyed(parts: list, exp: PVMExperiment) -> str:
    """A cache key of an arm's settings ``parts`` and, where ``exp`` adds any, its extra training tasks."""
    if exp.train_tasks:
        parts = parts + [list(exp.train_tasks)] + ([] if exp.instruct_mix else ["tasks alone"])
    return digest(parts, 12)


def sft_dir_of(exp: PVMExperiment, model_dir) -> Path:
    """Where stage 1's adapter of ``exp`` on the base ``model_dir`` is cached (its key: the block, the SFT settings and
    any extra training tasks)."""
    return Path(f"{model_dir}-pvm") / f"sft-{_keyed([exp.pvm.to_dict(), asdict(exp.sft)], exp)}"


def training_config(exp: PVMExperiment, tc: TrainConfig) -> TrainConfig:
    """The base's recipe ``tc`` with ``exp``'s extra tasks in its instruct mix (or, without ``exp.instruct_mix``, in
    its place): what every trained arm learns from."""
    if not exp.instruct_mix:
        return replace(tc, instruct_tasks=exp.train_tasks)
    extra = tuple(t for t in exp.train_tasks if t not in tc.instruct_tasks)
    return replace(tc, instruct_tasks=tc.instruct_tasks + extra) if extra else tc


def sft_adapter(exp: PVMExperiment, ctx: ExperimentContext) -> Path:
    """Stage 1's adapter of ``exp`` on the context's base: trained, or reused from the cache next to the base."""
    sft_dir = sft_dir_of(exp, ctx.model_dir)
    tc = training_config(exp, ctx.train_config)
    ctx.log(f"PVM stage 1 (SFT, {exp.sft.steps} steps, backbone frozen) -> {sft_dir}")
    train_pvm_sft(ctx.model_dir, tc.instruct_mix(ctx.scenes(), exp.sft.seed), sft_dir,
                  exp.pvm, exp.sft, progress=False)
    return sft_dir


def run_pvm_experiment(exp: PVMExperiment, ctx: ExperimentContext) -> dict:
    """Train (or reuse) the three adapters on the training scenes and evaluate each arm on the held-out sets."""
    model_dir, train, sets, log = ctx.model_dir, ctx.scenes(), ctx.sets, ctx.log
    cache = Path(f"{model_dir}-pvm")
    sft_dir = sft_dir_of(exp, model_dir)
    lora_dir = cache / f"lora-{_keyed([exp.pvm.to_dict(), asdict(exp.lora)], exp)}"
    grpo_dir = cache / f"grpo-{digest([sft_dir.name, asdict(exp.grpo), exp.n_grpo_scenes, list(exp.grpo_tasks), exp.format_weight], 12)}"

    tc = training_config(exp, ctx.train_config)  # every arm: the base's own instruct mix (+ exp.train_tasks)

    def data(seed: int):
        return tc.instruct_mix(train, seed)

    log(f"PVM stage 1 (SFT, {exp.sft.steps} steps, backbone frozen) -> {sft_dir}")
    sft = train_pvm_sft(model_dir, data(exp.sft.seed), sft_dir, exp.pvm, exp.sft, progress=False)
    log(f"LoRA control ({exp.lora.steps} steps, parameter-matched) -> {lora_dir}")
    lora = train_lora_control(model_dir, data(exp.lora.seed), lora_dir, exp.pvm, exp.lora, progress=False)
    attach = {"pvm_sft": lambda m: load_pvm(m, sft_dir), "lora": lambda m: apply_lora(m, lora_dir)}
    training = {"pvm_sft": _strip(sft), "lora": _strip(lora)}
    adapters = {"pvm_sft": str(sft_dir), "lora": str(lora_dir)}
    if exp.finetune is not None:
        ft_dir = cache / f"finetune-{digest([asdict(exp.finetune), list(tc.instruct_tasks), tc.max_turns], 12)}"
        log(f"full fine-tuning reference ({exp.finetune.steps} steps, every parameter but the tower) -> {ft_dir}")
        training["full_ft"] = _strip(train_finetune(model_dir, data(exp.finetune.seed), ft_dir, exp.finetune,
                                                    progress=False))
        adapters["full_ft"] = str(ft_dir)
    grpo_train = WorldSamples(train.config, train.scenes[: exp.n_grpo_scenes], train.images[: exp.n_grpo_scenes])
    grpo_data = world_grpo_data(grpo_train, exp.grpo_tasks, exp.grpo.seed, exp.format_weight)
    log(f"PVM stage 2 (GRPO, {exp.grpo.steps} steps, {exp.grpo.num_generations} completions a prompt) -> {grpo_dir}")
    grpo = train_pvm_grpo(model_dir, sft_dir, grpo_data, grpo_dir, exp.grpo, progress=False)
    attach["pvm_grpo"] = lambda m: load_pvm(m, grpo_dir)
    training["pvm_grpo"], adapters["pvm_grpo"] = _strip(grpo), str(grpo_dir)

    arms = {"base": ctx.base}
    model, processor = load_checkpoint(model_dir, dtype=None, device="cpu")
    log("the history regime's oracle: the base with the image again just before the question")
    oracle = evaluate_history(model, processor, sets.eval, reinsert_image=True)
    for arm in ARMS[1:]:
        if arm == "full_ft":
            if "full_ft" not in adapters:
                continue
            model, processor = load_checkpoint(adapters["full_ft"], dtype=None, device="cpu")
        else:
            model, processor = load_checkpoint(model_dir, dtype=None, device="cpu")
            model = attach[arm](model)
        log(f"evaluating arm {arm}")
        arms[arm] = evaluate_arm(model, processor, sets, log)
    return {
        "config": exp.to_dict(),
        "adapters": adapters,
        "training": training,
        "arms": arms,
        "comparison": compare_arms(arms),
        "oracle": oracle_summary(oracle, ctx.base["history"]),
        "paper": PAPER,
    }


def oracle_summary(oracle: dict, base: dict) -> dict:
    """The history regime with the image re-inserted before the question, beside the base's: if the oracle recovers
    the drop, the regime is limited by access to the image (what PVM gives); if not, by something else."""
    short, long = (str(h) for h in (oracle["lengths"][0], oracle["lengths"][-1]))
    return {"history": oracle,
            "short_acc": oracle["by_length"][short]["acc"], "long_acc": oracle["by_length"][long]["acc"],
            "long_interval": [oracle["by_length"][long]["low"], oracle["by_length"][long]["high"]],
            "drop": oracle["drop"]["diff"], "drop_interval": [oracle["drop"]["low"], oracle["drop"]["high"]],
            "base_drop": base["drop"]["diff"], "base_drop_interval": [base["drop"]["low"], base["drop"]["high"]],
            "base_long_acc": base["by_length"][long]["acc"],
            "recovered": oracle["by_length"][long]["acc"] - base["by_length"][long]["acc"],
            **oracle_recovery(oracle, base)}



def compare_arms(arms: dict) -> dict:
    """Per arm: the headline numbers, and relative change against the base for early / late objects."""
    base = arms["base"]["dilution"]["early_late"]
    base_hist = arms["base"]["history"]
    out = {}
    for name, a in arms.items():
        el = a["dilution"]["early_late"]
        ch = a["descriptions"]["chair"]
        hist = a["history"]
        short, long = (hist["by_length"][str(h)]["acc"] for h in (hist["lengths"][0], hist["lengths"][-1]))
        b_short, b_long = (base_hist["by_length"][str(h)]["acc"]
                           for h in (base_hist["lengths"][0], base_hist["lengths"][-1]))
        ad = a.get("after_description")  # absent from results made before the regime existed
        out[name] = {
            "description_regime_acc": ad["description"]["acc"] if ad else None,
            "description_regime_drop": ad["drop"]["diff"] if ad else None,
            "description_regime_oracle_acc": ad["oracle"]["acc"] if ad else None,
            "description_words": ad.get("description_words") if ad else None,
            "history_short_acc": short, "history_long_acc": long, "history_drop": hist["drop"]["diff"],
            "history_short_rel_change": relative_change(short, b_short),
            "history_long_rel_change": relative_change(long, b_long),
            "yes_no_acc": a["yes_no"]["overall_acc"],
            "yes_no_by_category": {c: v["acc"] for c, v in a["yes_no"]["categories"].items()},
            "open_mean": sum(a["open"].values()) / len(a["open"]) if a["open"] else None,
            "chair_i": ch["chair_i"], "hallucination_rate": ch["hallucination_rate"],
            "object_recall": ch["object_recall"], "exact_recall": ch["exact_recall"],
            "early_exact_recall": el["early"]["exact_recall"], "late_exact_recall": el["late"]["exact_recall"],
            "early_hallucination_rate": el["early"]["hallucination_rate"],
            "late_hallucination_rate": el["late"]["hallucination_rate"],
            "early_rel_change": relative_change(el["early"]["exact_recall"], base["early"]["exact_recall"]),
            "late_rel_change": relative_change(el["late"]["exact_recall"], base["late"]["exact_recall"]),
            "omega_v_slope": a["diagnosis"]["slope"], "tvr_plateau": a["diagnosis"]["tvr_plateau"],
            "logitlens_convergence_layer": a["diagnosis"]["convergence_layer_mean"],
        }
    return out
