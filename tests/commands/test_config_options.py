"""Command-line options generated from the config dataclasses: every field of every training config is reachable
from its command (a short option or ``--<prefix>.<field>``), shown by ``--help`` with its comment and default, reaches
the config, is checked by it, and is refused where it does not apply."""

import argparse
import dataclasses

import pytest

from keepsight.bridge import LiaMtrConfig
from keepsight.cli import build_parser, main
from keepsight.commands import bridge as bridge_command
from keepsight.commands import pvm as pvm_command
from keepsight.commands.config_options import field_comments
from keepsight.diffusion import MPSConfig
from keepsight.inference import get_method, method_names
from keepsight.pvm import PVMConfig
from keepsight.train.bridge import BridgeTrainConfig
from keepsight.train.diffusion import DiffusionTrainConfig
from keepsight.train.lora_control import LoRATrainConfig
from keepsight.train.pvm_grpo import GRPOTrainConfig
from keepsight.train.pvm_sft import PVMTrainConfig

# command -> [(prefix, config class, fields set elsewhere: the model's widths, derived ones)]
CONFIGS = {
    ("pvm", "train"): [("pvm", PVMConfig, set()), ("train", PVMTrainConfig, set()), ("train", GRPOTrainConfig, set())],
    ("lora", "train"): [("pvm", PVMConfig, set()), ("train", LoRATrainConfig, set())],
    ("diffusion", "train"): [("train", DiffusionTrainConfig, set())],
    ("bridge", "train"): [("train", BridgeTrainConfig, {"bridge_options"}),
                          ("lia_mtr", LiaMtrConfig, {"d_vision", "d_model"})],
}
# the decoding methods' settings, from the method registry
_AR = [(n, get_method(n).config, set()) for n in method_names("decode", "autoregressive")]
_DIFFUSION = [(n, get_method(n).config, set()) for n in method_names("decode", "diffusion")]
CONFIGS |= {("eval", "generate"): _AR + _DIFFUSION, ("eval", "pope"): _AR + _DIFFUSION, ("world", "eval"): _AR}


class Captured(ValueError):
    pass


def _leaf(command):
    parser = build_parser()
    for name in command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


@pytest.mark.parametrize("command", list(CONFIGS), ids=" ".join)
def test_every_config_field_is_an_option_with_its_comment_and_default(command):
    parser = _leaf(command)
    dests = {a.dest: a for a in parser._actions}
    for prefix, cls, elsewhere in CONFIGS[command]:
        comments = field_comments(cls)
        for f in dataclasses.fields(cls):
            if not f.init or f.name in elsewhere:
                continue
            generated = dests.get(f"config__{prefix}__{f.name}")
            assert generated is not None or f.name in dests, f"{' '.join(command)}: {cls.__name__}.{f.name}"
            if generated is not None:
                short = "--" + f.name.replace("_", "-")  # a command's everyday settings: --steps, --layers, ...
                assert generated.option_strings[0] in (f"--{prefix}.{f.name}", short)
                assert ("(default: " in generated.help or generated.required) and comments.get(f.name, "") in generated.help
    text = parser.format_help()
    assert all(f"--{prefix}." in text for prefix, _, _ in CONFIGS[command])


def test_comments_become_help():
    assert field_comments(PVMConfig)["master_dtype"].startswith("the PVM parameters' dtype")
    assert field_comments(GRPOTrainConfig)["warmup_ratio"].startswith("linear warm-up")  # from the base class
    help_text = _leaf(("pvm", "train")).format_help()
    assert "--pvm.expander_init EXPANDER_INIT" in help_text and "--pvm.output_norm, --no-pvm.output_norm" in help_text


@dataclasses.dataclass
class _Grouped:
    width: int = 4  # the width
    # a group header over commented fields
    heads: int = 1  # retrieval heads
    # the comment over a field that has none on its line
    depth: int = 2


def test_help_from_the_comment_over_a_field_and_indented_continuations():
    pvm, mps = field_comments(PVMConfig), field_comments(MPSConfig)
    assert pvm["pvm_hidden_size"].startswith("the latent width p; None: 512") and "head_dim" in pvm["pvm_hidden_size"]
    assert pvm["expander_init"].endswith("(identity, but no gradient at all)")  # its "#   ..." line below
    assert mps["lam"] == "suppression strength (paper: 0.1 for LLaDA-V, 0.3 for LaViDa)"
    grouped = field_comments(_Grouped)
    assert grouped["heads"] == "retrieval heads"  # a group header over a commented field is not its help
    assert grouped["depth"] == "the comment over a field that has none on its line"


@pytest.fixture
def world(tmp_path, capsys):
    assert main(["world", "build", "--out", str(tmp_path / "w"), "--n", "2", "--seed", "1"]) == 0
    (tmp_path / "m").mkdir()
    capsys.readouterr()
    return tmp_path


def _capture(monkeypatch, module, name):
    seen = {}

    def fake(*args, **kwargs):
        seen["args"], seen["kwargs"] = args, kwargs
        raise Captured("captured")

    monkeypatch.setattr(module, name, fake)
    return seen


def test_generated_options_reach_the_configs(world, monkeypatch, capsys):
    seen = _capture(monkeypatch, pvm_command, "train_pvm_sft")
    argv = ["pvm", "train", "--model", str(world / "m"), "--data", str(world / "w"), "--out", str(world / "o"),
            "--pvm.expander_init", "zero", "--no-pvm.silence_visual", "--train.warmup_ratio", "0.2", "--steps", "7"]
    assert main(argv) == 2 and "captured" in capsys.readouterr().err
    _, _, _, pvm_cfg, train_cfg = seen["args"]
    assert (pvm_cfg.expander_init, pvm_cfg.silence_visual, pvm_cfg.output_norm) == ("zero", False, True)
    assert (train_cfg.warmup_ratio, train_cfg.steps, train_cfg.lr) == (0.2, 7, PVMTrainConfig.lr)

    # one spelling for both stages: --train.FIELD reaches the config of the stage trained
    seen = _capture(monkeypatch, pvm_command, "train_pvm_grpo")
    argv = ["pvm", "train", "--stage", "grpo", "--init", str(world / "m"), "--model", str(world / "m"), "--data",
            str(world / "w"), "--out", str(world / "o"), "--train.top_p", "0.5", "--train.warmup_ratio", "0.2"]
    assert main(argv) == 2 and "captured" in capsys.readouterr().err
    cfg = seen["args"][4]
    assert (cfg.top_p, cfg.warmup_ratio, cfg.schedule) == (0.5, 0.2, GRPOTrainConfig.schedule)

    seen = _capture(monkeypatch, bridge_command, "train_bridge")
    argv = ["bridge", "train", "--phase", "1", "--model", str(world / "m"), "--data", str(world / "w"), "--out",
            str(world / "b"), "--lia_mtr.gate", "token", "--lia_mtr.lambdas", "0.5", "0.9"]
    assert main(argv) == 2 and "captured" in capsys.readouterr().err
    cfg = seen["args"][3]
    assert cfg.bridge_options == {"gate": "token", "lambdas": (0.5, 0.9)} and cfg.steps == BridgeTrainConfig.steps
    argv = ["bridge", "train", "--phase", "2", "--model", str(world / "m"), "--data", str(world / "w"), "--out",
            str(world / "b")]
    assert main(argv) == 2 and "captured" in capsys.readouterr().err
    assert seen["args"][3].steps == 4000  # phase 2's own default


@pytest.mark.parametrize("extra, message", [
    (["--train.top_p", "0.5", "--beta", "0"], "--beta, --train.top_p: not for --stage sft; they apply to --stage grpo"),
    (["--train.warmup_ratio", "2"], "warmup_ratio must be in [0.0, 1.0), got 2.0"),
    (["--pvm.expander_init", "ones"], "expander_init must be 'backbone' or 'zero'"),
    (["--stage", "grpo", "--train.withhold_image", "--batch-size", "4"],
     "--batch-size, --train.withhold_image: not for --stage grpo; they apply to --stage sft"),
    (["--stage", "grpo", "--pvm.expander_init", "zero", "--layers", "1"],
     "--layers, --pvm.expander_init: not for --stage grpo"),
])
def test_generated_options_are_checked_and_refused_where_they_do_not_apply(world, capsys, extra, message):
    argv = ["pvm", "train", "--model", str(world / "m"), "--data", str(world / "w"), "--out", str(world / "o"), *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_short_options_are_the_configs_fields_with_their_defaults_and_ranges(capsys):
    actions = {a.option_strings[0]: a for a in _leaf(("diffusion", "train"))._actions if a.option_strings}
    assert actions["--steps"].dest == "config__train__steps" and "--train.steps" not in actions
    assert f"(default: {DiffusionTrainConfig.steps})" in actions["--steps"].help
    assert f"(default: {DiffusionTrainConfig.answer_length})" in actions["--answer-length"].help
    assert actions["--skip-bad-rows"].option_strings == ["--skip-bad-rows", "--no-skip-bad-rows"]
    with pytest.raises(SystemExit) as e:  # the range is checked as the command line is parsed
        build_parser().parse_args(["diffusion", "train", "--base", "b", "--data", "d", "--out", "o", "--lr", "0"])
    assert e.value.code == 2 and "argument --lr: expected a finite number > 0.0, got 0" in capsys.readouterr().err
    bridge = {a.option_strings[0]: a for a in _leaf(("bridge", "train"))._actions if a.option_strings}
    assert bridge["--phase"].required and "(required)" in bridge["--phase"].help


def test_bad_values_are_argparse_errors_naming_the_option(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["pvm", "train", "--model", "m", "--data", "d", "--out", "o", "--pvm.dropout",
                                   "much"])
    assert e.value.code == 2
    assert "argument --pvm.dropout: must be a finite number, got 'much'" in capsys.readouterr().err


def test_lia_mtr_options_need_phase_one_and_lia_mtr(world, capsys):
    base = ["bridge", "train", "--model", str(world / "m"), "--data", str(world / "w"), "--out", str(world / "b")]
    assert main([*base, "--phase", "2", "--lia_mtr.gate", "token"]) == 2
    assert "--lia_mtr.gate set the LIA-MTR projector of phase 1 with --bridge lia_mtr" in capsys.readouterr().err
    assert main([*base, "--phase", "1", "--lia_mtr.lambda_spacing", "linear"]) == 2
    assert "lambda_spacing" in capsys.readouterr().err
