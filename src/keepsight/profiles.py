"""The demo's profiles: what each ``keepsight demo --profile NAME`` trains and runs (the world, the base recipe, the
seeds, each experiment's configuration), and the help line each shows."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .experiments.baselines import ARMS as BASELINE_ARMS
from .experiments.baselines import BEAM_ARMS, BaselinesExperiment
from .experiments.bridge import BridgeExperiment
from .experiments.diffusion import DiffusionExperiment
from .experiments.pvm import PVMExperiment
from .experiments.pvm_control import PVMControl
from .pvm import PVMConfig
from .train.diffusion import DiffusionTrainConfig
from .train.finetune import FinetuneConfig
from .train.lora_control import LoRATrainConfig
from .train.pvm_grpo import GRPOTrainConfig
from .train.pvm_sft import PVMTrainConfig
from .world.base import BASE_RECIPE, GROUNDED_RECIPE, REGIME_RECIPE, StageConfig, TrainConfig
from .world.config import WorldConfig, world_config
from .world.tasks import INSTRUCT_TASKS

# PVM in the experiments: the block as released (keepsight.pvm.block; on the 128-wide base its latent width resolves
# to 32, one head), stage 1 with the release's schedule (cosine, 10% warm-up, one learning rate for every PVM
# parameter, the gate included) at the world's learning rate and budget
PVM_BLOCK = PVMConfig()
PVM_SFT = PVMTrainConfig(warmup_ratio=0.1)

# the PVM arms trained with the regime's own format (describe_ask) beside the instruct mix
REGIME_ASK = PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT, grpo=GRPOTrainConfig(steps=150), train_tasks=("describe_ask",))

# the training-free baselines at their released defaults
RELEASED_BASELINES = {k: BASELINE_ARMS[k] for k in ("vcd", "pai", "memvr", "deco")}

# LIA-MTR's readings of "log-linearly spaced" decays and a "token-wise" gate (LiaMtrConfig.lambda_spacing / gate)
LIA_READINGS = ({}, {"lambda_spacing": "half_life"}, {"gate": "token"}, {"lambda_spacing": "half_life", "gate": "token"})


@dataclass
class DemoProfile:
    name: str
    n_train: int = 4000  # training scenes
    n_eval: int = 200  # held-out scenes (mixed object counts): yes/no, open answers, CHAIR
    n_dilution: int = 150  # held-out scenes at a fixed object count: accuracy by index
    train: TrainConfig = field(default_factory=TrainConfig)
    world: WorldConfig = field(default_factory=world_config)
    dilution_objects: int | None = None  # default: the world's max_objects
    seeds: tuple[int, ...] = (0,)  # base model seeds: every experiment runs on the base of each
    pvm: PVMExperiment | None = None  # the PVM arms (None: skip)
    bridge: BridgeExperiment | None = None  # the LIA-MTR vs MLP arms (None: skip)
    diffusion: DiffusionExperiment | None = None  # the masked-diffusion VLM with MPS / MRS (None: skip)
    baselines: BaselinesExperiment | None = None  # VCD / PAI / MemVR / DeCo beside PVM (None: skip)
    control: PVMControl | None = None  # PVM's mechanism control: the image only in PVM's memory (None: skip)


PROFILES = {
    "smoke": DemoProfile(
        name="smoke", n_train=160, n_eval=16, n_dilution=16,
        train=TrainConfig(
            lm=StageConfig(20, 3e-3, 16), vision=StageConfig(20, 2e-3, 16),
            align=StageConfig(10, 2e-3, 16), instruct=StageConfig(20, 1e-3, 16), save_every=10,
        ),
        pvm=PVMExperiment(
            sft=PVMTrainConfig(steps=8, save_every=1000), lora=LoRATrainConfig(steps=8, save_every=1000),
            grpo=GRPOTrainConfig(steps=2, num_generations=2, prompts_per_step=2, max_completion_length=24,
                                 save_every=1000),
            finetune=FinetuneConfig(steps=8, save_every=1000), n_grpo_scenes=16,
        ),
        bridge=BridgeExperiment(),
        diffusion=DiffusionExperiment(train=DiffusionTrainConfig(steps=10, save_every=1000), n_scenes=4,
                                      steps_grid=(4,), sweep_steps=4, sweeps={"lam": [0.3], "beta": [0.1]}),
        baselines=BaselinesExperiment(arms=RELEASED_BASELINES,
                                      beam_arms={"opera": BEAM_ARMS["opera"]}, beam_scenes=2,
                                      pvm=PVMExperiment(sft=PVMTrainConfig(steps=8, save_every=1000)),
                                      timing_scenes=2, timing_repeats=1),
        control=PVMControl(sft=PVMTrainConfig(steps=8, save_every=1000), lora=LoRATrainConfig(steps=8, save_every=1000),
                           ablations={"pvm_sft_no_output_norm": {"output_norm": False}}),
    ),
    # the default (`keepsight demo`, about 30 minutes on 2 cores): the base, its dilution diagnosis and
    # multi-turn regime, the PVM arms (with the LoRA control and full fine-tuning), the diffusion methods
    "full": DemoProfile(name="full", train=BASE_RECIPE,
                        pvm=PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT, grpo=GRPOTrainConfig(steps=150)),
                        diffusion=DiffusionExperiment(sweeps={})),
    # `--profile seeds`: three base seeds, every comparison with 95% intervals (PVM arms, MLP vs LIA-MTR)
    "seeds": DemoProfile(name="seeds", train=BASE_RECIPE, seeds=(0, 1, 2),
                         pvm=PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT, grpo=GRPOTrainConfig(steps=150)), bridge=BridgeExperiment()),
    # `--profile readings`: LIA-MTR's readings (lambda spacing x gate) against the MLP on the seed-0 base (shared with
    # the default and seeds profiles: its base and the default reading come from their caches)
    "readings": DemoProfile(name="readings", train=BASE_RECIPE,
                            bridge=BridgeExperiment(readings=LIA_READINGS)),
    # `--profile diffusion`: the regime where parallel decoding repeats and the model still describes: a 4-layer
    # LLaDA-V trained on fixed and varied descriptions in equal parts (the fixed order teaches what to say; the varied
    # orders leave several right answers per slot, and slots committed together at few steps repeat one of them), on
    # 3 training seeds over the regime base's vision tower (the regime profile's seed-0 base); MPS / MRS at the
    # released settings, every setting the papers ablate and our earlier readings swept at T = 4, where it repeats;
    # MPS's effect on the LM head's input over lam
    "diffusion": DemoProfile(name="diffusion", train=REGIME_RECIPE,
                             diffusion=DiffusionExperiment(
                                 tasks=("describe", "describe_varied"), seeds=(0, 1, 2),
                                 # blocks of 16 (LLaDA's semi-autoregressive sampling): over the whole window a model
                                 # trained on eos-filled windows commits eos early
                                 block_length=16, sweep_steps=4, steps_grid=(4, 8, 16, 32, 64),
                                 effect_lams=(0.001, 0.01, 0.03, 0.1, 0.3, 1.0),
                                 sweeps={"lam": [0.001, 0.01, 0.03, 0.1, 0.3, 1.0], "k": [1, 2, 3],
                                         "beta": [0.01, 0.1, 0.5, 1.0], "eta": [4.0, 8.0, 12.0],
                                         "tau0": [0.3, 0.6, 0.9],
                                         "schedule": ["sigmoid", "cosine", "exponential", "linear", "power"],
                                         "projection_lam": [0.1, 0.5], "prior": ["vocab_mean", "topk", "random"],
                                         "center": [False, True], "layers": ["final", [-2], [-3, -1]],
                                         "amplitude_beta": [0.01, 0.1, 0.5, 1.0],
                                         "frequency_beta": [0.01, 0.1, 0.5, 1.0]})),
    # `--profile diffusion-phrased`: a regime where parallel decoding repeats and the model still describes: the
    # regime base fine-tuned on its descriptions, a 4-layer LLaDA-V started from it (the AR -> diffusion adaptation)
    # and trained on its fixed descriptions, then fine-tuned on phrased ones (varied words around each object, the
    # objects in raster order: what is said is fixed by the image, only the words around it vary), 3 training seeds;
    # MPS / MRS at the released settings over the step grid, swept at T = 4
    "diffusion-phrased": DemoProfile(
        name="diffusion-phrased", train=REGIME_RECIPE,
        diffusion=DiffusionExperiment(
            train=DiffusionTrainConfig(steps=2500, lr=5e-4), tasks=("describe",), language_model_from="base",
            base_finetune=FinetuneConfig(steps=2000, lr=5e-4),
            finetune=DiffusionTrainConfig(steps=3000, lr=5e-4), finetune_tasks=("describe_phrased",),
            seeds=(0, 1, 2), block_length=16, sweep_steps=4, steps_grid=(4, 8, 16, 64),
            effect_lams=(0.001, 0.01, 0.1), sweeps={"lam": [0.001, 0.01, 0.03, 0.1], "beta": [0.01, 0.1, 1.0]})),
    # `--profile baselines`: VCD, PAI, MemVR and DeCo (released defaults and a stronger setting), plain beam search and
    # OPERA (on 40 scenes), beside PVM stage 1 on
    # the seed-0 base (shared with the other profiles; PVM's adapter is the default profile's)
    "baselines": DemoProfile(name="baselines", train=BASE_RECIPE,
                             baselines=BaselinesExperiment(pvm=PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT))),
    # `--profile control`: PVM's mechanism control on the seed-0 base (shared with the other profiles): PVM stage 1 and
    # the matched LoRA trained with the image withheld from the language model, scored the same way
    "control": DemoProfile(name="control", train=BASE_RECIPE,
                           control=PVMControl(pvm=PVM_BLOCK)),
    # `--profile control-grounded`: the same control on the grounded recipe's base, 3 seeds, the released block beside
    # the LoRA; each arm's prior-balanced yes/no against the text-only level
    "control-grounded": DemoProfile(name="control-grounded",
                                    train=GROUNDED_RECIPE, seeds=(0, 1, 2), control=PVMControl(pvm=PVM_BLOCK)),
    # `--profile regime`: the regime recipe's base (RoPE base 300: a visual answer falls after the model's own
    # description, and the image shown again recovers most of it), 3 seeds; in that regime every PVM arm (with the
    # LoRA control and full fine-tuning) and each training-free baseline at its released defaults; and on the same
    # bases PVM's mechanism control (the image only in PVM's memory)
    "regime": DemoProfile(name="regime", train=REGIME_RECIPE, seeds=(0, 1, 2),
                          pvm=PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT, grpo=GRPOTrainConfig(steps=150)),
                          baselines=BaselinesExperiment(arms=RELEASED_BASELINES, beam_arms={}, pvm=None),
                          control=PVMControl(pvm=PVM_BLOCK)),
    # `--profile regime-ask`: the regime profile's bases (shared with it, cached), every PVM arm trained with the
    # regime's own format added to the instruct mix: a description, then a question whose answer follows the image
    # (half the descriptions state one object wrongly; "describe_ask"), so that stage 1 has answers after long text
    # that only the image gives
    "regime-ask": DemoProfile(name="regime-ask", train=REGIME_RECIPE,
                              seeds=(0, 1, 2), pvm=REGIME_ASK),
    # `--profile regime-format`: the same bases, every PVM arm trained on the regime's format alone (describe_ask is
    # 3% of regime-ask's data: 600 steps see about 270 such answers); with no description trained, the arms' own
    # descriptions shrink (docs/results.md), so the question after them follows less text
    "regime-format": DemoProfile(name="regime-format", train=REGIME_RECIPE,
                                 seeds=(0, 1, 2), pvm=dataclasses.replace(REGIME_ASK, instruct_mix=False)),
    # `--profile regime-describe`: the same bases, every PVM arm trained on descriptions and the regime's format
    # (describe, each scene's description three times, and describe_ask: a quarter of the items), so that the arms
    # keep describing while they learn to answer after a description: the question follows as much text as the base's
    "regime-describe": DemoProfile(name="regime-describe",
                                   train=REGIME_RECIPE, seeds=(0, 1, 2),
                                   pvm=dataclasses.replace(REGIME_ASK, train_tasks=("describe", "describe_ask"),
                                                           instruct_mix=False)),
    # `--profile extended`: a 6-layer base (LogitLens has depth to move) and the PVM arms on it; LIA-MTR's readings
    # and the diffusion regime have their own profiles (readings, diffusion)
    "extended": DemoProfile(
        name="extended",
        # the 6-layer base keeps the instruct mix without count pairs: with them its instruct stage learned
        # not to look (held-out yes/no 0.55, colour / scene / count at chance; docs/results.md), without them
        # it reached 0.81 with every category >= 0.6
        train=dataclasses.replace(BASE_RECIPE, preset="tiny-llava-6l", instruct_tasks=INSTRUCT_TASKS + ("chat",)),
        pvm=PVMExperiment(pvm=PVM_BLOCK, sft=PVM_SFT, grpo=GRPOTrainConfig(steps=150))),
}


# what each profile runs, as `keepsight demo --help` lists it
PROFILE_HELP = {
    "full": "the default (about 15 minutes on 2 idle cores from scratch): the base, its diagnosis and multi-turn regime, "
            "the PVM arms, the diffusion methods",
    "seeds": "three base seeds, PVM and bridge arms with 95% intervals",
    "readings": "LIA-MTR's readings vs the MLP",
    "diffusion": "the varied-description regime on a 4-layer LLaDA-V, 3 training seeds, every MPS / MRS setting "
                 "(about 40 minutes)",
    "diffusion-phrased": "a 4-layer LLaDA-V adapted from the regime base fine-tuned on descriptions, then trained on "
                         "phrased descriptions (varied words, objects in raster order), 3 training seeds, MPS / MRS "
                         "at the released settings and swept at T = 4",
    "baselines": "VCD, PAI, MemVR, DeCo, OPERA beside PVM",
    "control": "PVM's mechanism control (the image only in PVM's memory, against the matched LoRA)",
    "control-grounded": "the same on the grounded base, 3 seeds, on a prior-balanced yes/no set (about 65 minutes)",
    "regime": "the regime recipe's base (a visual answer falls after the model's own description, the image again "
              "recovers it), 3 seeds, every PVM arm, the released baselines and the control there (about 110 minutes)",
    "regime-ask": "the regime profile's bases, every PVM arm trained with the regime's format (a description, then a "
                  "question the image answers) added to its data, 3 seeds",
    "regime-format": "the same with every PVM arm trained on the regime's format alone, 3 seeds (about 46 minutes; "
                     "the arms then forget how to describe)",
    "regime-describe": "the same with every PVM arm trained on descriptions and the regime's format (a quarter of "
                       "the items), so that the arms keep describing, 3 seeds",
    "extended": "a 6-layer base and the PVM arms",
    "smoke": "tiny budgets (= --smoke)",
}
