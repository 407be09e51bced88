"""Every shipped config parses with the library that reads it."""

import json
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("path", sorted((CONFIGS / "accelerate").glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_configs_parse(path):
    from accelerate.commands.config.config_args import ClusterConfig

    cfg = ClusterConfig.from_yaml_file(str(path))
    assert cfg.num_processes >= 1
    ds = (cfg.deepspeed_config or {}).get("deepspeed_config_file")
    if ds:
        assert (CONFIGS.parent / ds).is_file(), f"{path.name} points at a missing {ds}"


@pytest.mark.parametrize("path", sorted((CONFIGS / "deepspeed").glob("*.json")), ids=lambda p: p.name)
def test_deepspeed_configs_parse(path):
    cfg = json.loads(path.read_text())
    assert cfg["zero_optimization"]["stage"] in (1, 2, 3)
    # "auto" lets transformers' Trainer fill batch sizes from its own arguments
    assert cfg["train_micro_batch_size_per_gpu"] == "auto"
