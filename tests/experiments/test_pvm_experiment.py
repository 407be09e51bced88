"""The PVM experiment's extra training tasks: what the arms learn from, and where their adapters are cached."""

import pytest

from keepsight.experiments.pvm import PVMExperiment, sft_dir_of, training_config
from keepsight.fingerprint import digest
from keepsight.world.base import REGIME_RECIPE
from keepsight.world.config import WorldConfig
from keepsight.world.dataset import generate_scenes
from keepsight.world.tasks import WorldSamples


def test_extra_tasks_join_the_instruct_mix_and_key_the_cache(tmp_path):
    plain, ask = PVMExperiment(), PVMExperiment(train_tasks=("describe_ask",))
    assert training_config(plain, REGIME_RECIPE) is REGIME_RECIPE
    tc = training_config(ask, REGIME_RECIPE)
    assert tc.instruct_tasks == REGIME_RECIPE.instruct_tasks + ("describe_ask",)
    cfg = WorldConfig()
    samples = WorldSamples.from_scenes(cfg, generate_scenes(cfg, 6, seed=0))
    mix = tc.instruct_mix(samples, 0)
    asks = [i for i in range(len(mix)) if mix.category(i) == "describe_ask"]
    assert len(asks) == 6 and "describe_ask" not in {REGIME_RECIPE.instruct_mix(samples, 0).category(i)
                                                     for i in range(len(mix) - 6)}
    # a plain experiment keeps the key its adapters were cached under; extra tasks train (and cache) another adapter
    base = tmp_path / "base"
    assert sft_dir_of(plain, base).name == f"sft-{digest([plain.pvm.to_dict(), plain.sft.__dict__], 12)}"
    assert sft_dir_of(ask, base) != sft_dir_of(plain, base) and sft_dir_of(ask, base).parent == sft_dir_of(plain, base).parent
    assert ask.to_dict()["train_tasks"] == ["describe_ask"]
    # the tasks alone: another mix, another adapter
    alone = PVMExperiment(train_tasks=("describe_ask",), instruct_mix=False)
    only = training_config(alone, REGIME_RECIPE)
    assert only.instruct_tasks == ("describe_ask",)
    assert {only.instruct_mix(samples, 0).category(i) for i in range(6)} == {"describe_ask"}
    assert len({sft_dir_of(e, base) for e in (plain, ask, alone)}) == 3


def test_an_unknown_training_task_or_no_data_is_refused():
    with pytest.raises(ValueError, match="unknown train_tasks"):
        PVMExperiment(train_tasks=("describe_ask_twice",))
    with pytest.raises(ValueError, match="name their train_tasks"):
        PVMExperiment(instruct_mix=False)
