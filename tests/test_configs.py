"""Every shipped config parses with the library that reads it (and FSDP's builds the plugin that a launched
process builds, with settings that fit the models the commands train)."""

import json
import os
from pathlib import Path

import pytest
import yaml

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


FSDP_CONFIGS = [p for p in sorted((CONFIGS / "accelerate").glob("*.yaml")) if "fsdp_config" in p.read_text()]


def test_there_is_an_fsdp_config():
    assert [p.name for p in FSDP_CONFIGS] == ["fsdp.yaml"]


@pytest.fixture
def fsdp_plugin(monkeypatch, request):
    """The FSDP plugin a process started by `accelerate launch --config_file <path>` builds: the launcher
    turns the config into FSDP_* environment variables, the Trainer's Accelerator reads them."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    path = request.param
    parser = launch_command_parser()
    # every fsdp_config key must be a launcher option: `accelerate launch` sets unknown ones and ignores them
    options = {a.dest for a in parser._actions}
    keys = yaml.safe_load(path.read_text())["fsdp_config"]
    unknown = [k for k in keys if (k if k.startswith("fsdp_") else "fsdp_" + k) not in options]
    assert not unknown, f"{path.name}: accelerate launch does not know {unknown}"
    args, _, _ = _validate_launch_command(parser.parse_args(["--config_file", str(path), "train.py"]))
    assert args.use_fsdp
    for k in [k for k in os.environ if k.startswith("FSDP_")]:
        monkeypatch.delenv(k)
    for k, v in prepare_multi_gpu_env(args).items():
        if k.startswith("FSDP_") or k == "ACCELERATE_USE_FSDP":
            monkeypatch.setenv(k, v)
    return FullyShardedDataParallelPlugin()  # validates the values (FSDP2 rejects FSDP1-only settings)


@pytest.mark.parametrize("fsdp_plugin", FSDP_CONFIGS, ids=lambda p: p.name, indirect=True)
def test_fsdp_config_builds_the_plugin(fsdp_plugin):
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    p = fsdp_plugin
    assert p.fsdp_version == 2 and p.reshard_after_forward is True
    assert p.auto_wrap_policy is transformer_auto_wrap_policy
    assert p.transformer_cls_names_to_wrap is None  # filled in from the model by run_trainer
    assert "FULL_STATE_DICT" in str(p.state_dict_type)
    assert not p.cpu_ram_efficient_loading and not p.activation_checkpointing


@pytest.mark.parametrize("fsdp_plugin", FSDP_CONFIGS, ids=lambda p: p.name, indirect=True)
def test_fsdp_wraps_the_layers_of_every_trained_model(fsdp_plugin, processor, monkeypatch):
    """The layer classes run_trainer hands the plugin exist in each kind of model the commands train (a
    LLaVA with PVM; the text-only and vision-only models of the lm and vision stages): every decoder /
    encoder layer becomes its own FSDP unit, the PVM branches stay in the root unit."""
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from transformers import CLIPVisionModel, Qwen3ForCausalLM

    from keepsight.pvm import PVMConfig, attach_pvm
    from keepsight.train import distributed as wd
    from keepsight.world import base as wt
    from keepsight.world.config import world_config
    from keepsight.world.models import build_model, get_preset, text_config, vision_config

    preset = get_preset("tiny-llava")
    llava = build_model(preset, processor.tokenizer)
    attach_pvm(llava, PVMConfig())
    models = {
        "pvm": (llava, {"Qwen3DecoderLayer", "CLIPEncoderLayer"}),
        "lm": (Qwen3ForCausalLM(text_config(preset, processor.tokenizer)), {"Qwen3DecoderLayer"}),
        "vision": (wt.VisionPretrainer(CLIPVisionModel(vision_config(preset)), world_config("default")),
                   {"CLIPEncoderLayer"}),
    }
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setattr(wd, "_LAUNCHER_FSDP_WRAP", None)  # the config names no classes
    monkeypatch.setenv(wd.FSDP_WRAP_ENV, "")  # restored after the test (set_fsdp_wrap writes os.environ)
    for name, (model, layer_classes) in models.items():
        wd.set_fsdp_wrap(model)  # what run_trainer does before the Trainer builds its Accelerator
        classes = os.environ[wd.FSDP_WRAP_ENV].split(",")
        assert layer_classes <= set(classes), (name, classes)
        fsdp_plugin.transformer_cls_names_to_wrap = classes  # as the plugin reads them from the environment
        policy = fsdp2_prepare_auto_wrap_policy(fsdp_plugin, model)
        layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
        assert layers and all(policy(m) for m in layers), name
        assert not any(policy(m) for n, m in model.named_modules() if n.startswith("pvm")), name
