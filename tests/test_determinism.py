"""The determinism contract (``keepsight.determinism``): every base stage trains bit for bit the same twice and
after an interrupted run is resumed, the hashes of its weights are pinned for this machine kind, and a checkpoint
that a resume cannot load exactly is refused instead of silently restarting from the initial weights."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from keepsight.determinism import DEFAULT_THREADS, configured, environment, weights_digest
from keepsight.train.trainer import last_complete_checkpoint
from keepsight.world import generate_scenes, world_config
from keepsight.world.base import StageConfig, TrainConfig, train_stage
from keepsight.world.tasks import WorldSamples

PINS = Path(__file__).with_name("determinism_pins.json")


def reduced_recipe() -> TrainConfig:
    """The base recipe's stages at a budget a test can afford (the same code path as the demo's)."""
    return TrainConfig(lm=StageConfig(12, 3e-3, 8), vision=StageConfig(8, 2e-3, 8), align=StageConfig(8, 2e-3, 4),
                       instruct=StageConfig(12, 2e-3, 4), save_every=4, instruct_lm_lr=1e-3)


def stage_hashes(out: Path, samples, stop_after: int | None = None) -> dict[str, str]:
    """Train every stage into ``out`` (each first stopped after ``stop_after`` steps and resumed, if given); the
    hash of each stage's weights."""
    tc = reduced_recipe()
    hashes = {}
    for stage in tc.stages:
        if stop_after is not None:
            assert train_stage(stage, out, tc, samples, stop_after=stop_after, progress=False) is None
            ckpt = last_complete_checkpoint(out / "stages" / f"{stage}-checkpoints")
            assert ckpt is not None and ckpt.endswith(f"checkpoint-{stop_after}")
        assert train_stage(stage, out, tc, samples, progress=False) is not None
        hashes[stage] = weights_digest(out / "stages" / stage)
    return hashes


@pytest.fixture(scope="module")
def samples():
    cfg = world_config()
    return WorldSamples.from_scenes(cfg, generate_scenes(cfg, 48, seed=0))


@pytest.fixture(scope="module")
def runs(samples, tmp_path_factory):
    """Three trainings of the reduced recipe under the contract's settings: twice straight through, once with
    every stage interrupted and resumed."""
    root = tmp_path_factory.mktemp("determinism")
    with configured(DEFAULT_THREADS) as env:
        first = stage_hashes(root / "a", samples)
        second = stage_hashes(root / "b", samples)
        resumed = stage_hashes(root / "c", samples, stop_after=4)
    return {"env": env, "first": first, "second": second, "resumed": resumed}


def test_every_stage_trains_bit_identically_twice(runs):
    assert runs["first"] == runs["second"]


def test_an_interrupted_stage_resumes_to_the_same_weights(runs):
    # before the exact-resume fix the VLM stages (align, instruct) resumed from their initial weights
    assert runs["resumed"] == runs["first"]


def _pinned_environment(env: dict) -> dict:
    return {k: env[k] for k in ("packages", "machine", "cpu_capability", "cpu_vendor", "threads", "deterministic")}


def pin_key(env: dict) -> str:
    """The pins' key for a machine: the dispatch capability and the vendor (MKL's matrix products follow both)."""
    return f"{env['cpu_capability']}-{env['cpu_vendor']}"


def test_stage_hashes_match_the_pins(runs):
    """The pins are kept per CPU kind (the instruction set torch dispatches to, and the vendor: MKL's matrix products
    differ between an Intel and an AMD AVX512 machine): the same code trains other bits on another kind, so each kind
    the project runs on has its own entry, and this test runs on each of them."""
    pins = json.loads(PINS.read_text())
    here = _pinned_environment(runs["env"])
    kind = pin_key(here)
    if kind not in pins:
        pytest.skip(f"no pins for CPU kind {kind} (pinned: {sorted(pins)}); add them with "
                    "`python tests/determinism_pins.py` on such a machine (README, Reproducibility)")
    entry = pins[kind]
    if here != entry["environment"]:
        pytest.skip(f"the {kind} pins hold for {entry['environment']}; this machine is {here} (bit-identical results "
                    "are promised only for the same versions, CPU kind and thread count: README, Reproducibility)")
    assert runs["first"] == entry["stages"], (f"the base stages no longer train to the pinned {kind} weights; if that "
                                              "is intended, regenerate with `python tests/determinism_pins.py` on "
                                              "each CPU kind and say why in the commit")


def test_a_checkpoint_in_transformers_saved_layout_is_refused(samples, tmp_path):
    """A checkpoint whose weights carry transformers' saved names (an earlier keepsight's) cannot be resumed
    exactly: refused with the folder named, not trained on from the initial weights."""
    tc = reduced_recipe()
    out = tmp_path / "base"
    for stage in ("lm", "vision"):
        train_stage(stage, out, tc, samples, progress=False)
    assert train_stage("align", out, tc, samples, stop_after=4, progress=False) is None
    ckpt = Path(last_complete_checkpoint(out / "stages" / "align-checkpoints"))
    own = load_file(ckpt / "model.safetensors")
    legacy = {k.replace("model.language_model.", "language_model.model.")
               .replace("model.vision_tower.", "vision_tower.")
               .replace("model.multi_modal_projector.", "multi_modal_projector."): v.clone() for k, v in own.items()}
    save_file(legacy, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="saved layout.*delete that folder"):
        train_stage("align", out, tc, samples, progress=False)


def test_environment_records_what_the_bits_depend_on():
    env = environment()
    assert env["packages"]["torch"] == torch.__version__.split("+")[0] or env["packages"]["torch"] == torch.__version__
    with configured(1) as inside:
        assert inside["threads"] == 1 and inside["deterministic"] is True
    assert environment()["threads"] == env["threads"]
    assert environment()["deterministic"] == env["deterministic"]
    with pytest.raises(ValueError, match="threads"):
        with configured(0):
            pass
