"""The training-free baselines on the world: the base, each baseline at its released defaults and one stronger
setting, and PVM (stage 1, the PVM experiment's cached adapter), scored on the same scenes: yes/no by
category, accuracy vs history length (the dilution regime), CHAIR / recall of descriptions, the world POPE, and
generation time per token relative to the base (descriptions, median of interleaved runs).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..baselines.readings import VCD_LINEAR
from ..inference import Decoders
from ..methods import Method
from ..models import load_checkpoint
from ..pvm import load_pvm
from ..world.evaluate import generate_answers
from ..world.pope import evaluate_world_pope
from ..world.texts import DESCRIBE_PROMPT
from .arm import ExperimentContext, evaluate_arm
from .pvm import PVMExperiment, sft_adapter

ARMS = {  # name -> (method, settings): the released defaults, a stronger setting, and our earlier reading where
    # it differed (VCD's linear noise schedule: a Method kept outside the registry)
    "vcd": ("vcd", {}), "vcd (alpha 2)": ("vcd", {"alpha": 2.0}),
    "vcd (linear schedule)": (VCD_LINEAR, {}),
    "pai": ("pai", {}), "pai (alpha 1, gamma 0.5)": ("pai", {"alpha": 1.0, "gamma": 0.5}),
    "memvr": ("memvr", {}), "memvr (threshold 0.5, ratio 0.31)": ("memvr", {"threshold": 0.5, "ratio": 0.31}),
    "deco": ("deco", {}), "deco (alpha 1)": ("deco", {"alpha": 1.0}),
}
# beam-search arms, on the first ``beam_scenes`` scenes of each set (each row decodes alone with 5 beams: OPERA costs
# about 1 + 5 forwards per step): plain beam search (OPERA off: the model's own generate) and OPERA at its defaults
BEAM_ARMS = {"beam search (5 beams)": ("opera", {"penalty_weights": 0.0, "threshold": None,
                                                 "num_attn_candidates": None}),
             "opera": ("opera", {})}


@dataclass
class BaselinesExperiment:
    arms: dict = field(default_factory=lambda: dict(ARMS))
    pvm: PVMExperiment | None = field(default_factory=PVMExperiment)  # its stage-1 adapter is the PVM arm
    timing_scenes: int = 16  # descriptions timed per arm
    timing_repeats: int = 3
    pope_per_image: int = 3
    beam_arms: dict = field(default_factory=lambda: dict(BEAM_ARMS))
    beam_scenes: int = 40  # scenes of each set the beam arms (and the base beside them) are scored on

    def to_dict(self) -> dict:
        return {"arms": {k: [_name(m), dict(s)] for k, (m, s) in self.arms.items()},
                "beam_arms": {k: [_name(m), dict(s)] for k, (m, s) in self.beam_arms.items()},
                "beam_scenes": self.beam_scenes,
                "pvm": self.pvm.to_dict() if self.pvm else None, "timing_scenes": self.timing_scenes,
                "timing_repeats": self.timing_repeats, "pope_per_image": self.pope_per_image}


def _name(method: str | Method) -> str:
    return method if isinstance(method, str) else method.name


def _arm(method: str | Method, settings: dict) -> Decoders:
    """The arm's method: a registry name or a reading's entry, applied the way ``keepsight.inference.Pipeline``
    applies a registered one."""
    return Decoders([(method, settings)], family="autoregressive")


def _time_per_token(model, processor, samples, method: Decoders | None, repeats: int) -> float:
    """Median seconds per generated token of ``samples``' descriptions (fixed budget, greedy)."""
    images = samples.images
    budget = 48
    times = []
    for _ in range(repeats):
        with method.applied(model) if method is not None else contextlib.nullcontext():
            t0 = time.perf_counter()
            generate_answers(model, processor, [DESCRIBE_PROMPT] * len(images), images, budget, batch_size=16)
            times.append((time.perf_counter() - t0) / (budget * len(images)))
    return statistics.median(times)


def run_baselines_experiment(exp: BaselinesExperiment, ctx: ExperimentContext) -> dict:
    model_dir, sets, log = ctx.model_dir, ctx.sets, ctx.log
    model, processor = load_checkpoint(model_dir, dtype=None, device="cpu")
    timing = type(sets.eval)(sets.eval.config, sets.eval.scenes[: exp.timing_scenes],
                             sets.eval.images[: exp.timing_scenes])
    base_time = _time_per_token(model, processor, timing, None, exp.timing_repeats)
    log("  world POPE, base")
    arms = {"base": {**ctx.base, "pope": evaluate_world_pope(model, processor, sets.eval, exp.pope_per_image)}}
    speed = {"base": 1.0}
    stats = {}
    for name, (method_name, settings) in exp.arms.items():
        method = _arm(method_name, settings)
        log(f"evaluating {name}")
        with method.applied(model):
            result = evaluate_arm(model, processor, sets, log, decoding_method=True)
            result["pope"] = evaluate_world_pope(model, processor, sets.eval, exp.pope_per_image)
        stats[name] = method.stats()[_name(method_name)]
        arms[name] = result
        speed[name] = _time_per_token(model, processor, timing, _arm(method_name, settings),
                                      exp.timing_repeats) / base_time
    if exp.beam_arms:
        n = exp.beam_scenes
        sub = type(sets)(*(type(x)(x.config, x.scenes[:n], x.images[:n]) for x in (sets.eval, sets.dilution,
                                                                                    sets.diagnosis)))
        log(f"evaluating the base on {n} scenes (beside the beam arms)")
        arms[f"base ({n} scenes)"] = {**evaluate_arm(model, processor, sub, log, decoding_method=True),
                                      "pope": evaluate_world_pope(model, processor, sub.eval, exp.pope_per_image)}
        for name, (method_name, settings) in exp.beam_arms.items():
            method = _arm(method_name, settings)
            log(f"evaluating {name} on {n} scenes")
            with method.applied(model):
                result = evaluate_arm(model, processor, sub, log, decoding_method=True)
                result["pope"] = evaluate_world_pope(model, processor, sub.eval, exp.pope_per_image)
            stats[f"{name} ({n} scenes)"] = method.stats()[_name(method_name)]
            arms[f"{name} ({n} scenes)"] = result
            speed[f"{name} ({n} scenes)"] = _time_per_token(model, processor, timing, _arm(method_name, settings),
                                                            exp.timing_repeats) / base_time
    if exp.pvm is not None:
        adapter = sft_adapter(exp.pvm, ctx)  # the PVM experiment's stage-1 adapter (cached when it ran)
        with_pvm, proc = load_checkpoint(model_dir, dtype=None, device="cpu")
        load_pvm(with_pvm, adapter)
        log("evaluating pvm_sft")
        arms["pvm_sft"] = {**evaluate_arm(with_pvm, proc, sets, log),
                           "pope": evaluate_world_pope(with_pvm, proc, sets.eval, exp.pope_per_image)}
        speed["pvm_sft"] = _time_per_token(with_pvm, proc, timing, None, exp.timing_repeats) / base_time
    return {"config": exp.to_dict(), "arms": {k: {kk: vv for kk, vv in v.items() if kk != "texts"}
                                              for k, v in arms.items()},
            "time_per_token_vs_base": speed, "stats": stats, "threads": torch.get_num_threads()}


def _with_interval(scores: dict) -> str:
    """``acc [low, high]`` (95% Wilson) of a yes / no result, or the bare accuracy where no interval was kept."""
    ci = scores.get("overall_ci")
    acc = scores["overall_acc"]
    return f"{acc:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{acc:.3f}"


def compare(res: dict) -> list[list]:
    """Rows: arm, yes/no (95% interval) and its count, history at the shortest / longest length, drop, CHAIRi,
    object recall, POPE adversarial / popular F1, time per token vs base."""
    rows = []
    for name, a in res["arms"].items():
        hist = a["history"]
        lo, hi = hist["lengths"][0], hist["lengths"][-1]
        rows.append([name, _with_interval(a["yes_no"]), a["yes_no"].get("n"), hist["by_length"][str(lo)]["acc"],
                     hist["by_length"][str(hi)]["acc"], hist["drop"]["diff"], a["descriptions"]["chair"]["chair_i"],
                     a["descriptions"]["chair"]["object_recall"], a["pope"]["adversarial"]["f1"],
                     a["pope"]["popular"]["f1"], res["time_per_token_vs_base"].get(name)])
    return rows


COMPARE_HEADER = ["arm", "yes/no [95% CI]", "n", "history short", "history long", "drop", "CHAIRi", "object recall",
                  "POPE adv. F1", "POPE pop. F1", "time / token vs base"]
