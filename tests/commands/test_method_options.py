"""The decoding methods' options, generated from the method registry: ``--<method>.<field>`` reaches the method as
the same settings its JSON object gives, turns the method on, is checked by the method's config, and a setting
given twice, or for a method other than the chosen one, is an error naming it."""

import dataclasses
import json

import pytest

from keepsight.cli import build_parser, main
from keepsight.commands import eval as eval_command
from keepsight.commands.method_options import baseline_choice, sampler_settings, switched_settings
from keepsight.inference import get_method
from keepsight.inference.arguments import config_keys
from keepsight.inference.pipeline import pipeline_defaults
from keepsight.inference.settings import DECODE, DecodeSettings
from keepsight.integrations.lmms_eval import SAMPLER_KEYS
from keepsight.world.models import save_tiny_checkpoint

GENERATE = ["eval", "generate", "--model", "m", "--data", "d", "--out", "o.jsonl"]


def _args(*extra):
    return build_parser().parse_args([*GENERATE, *extra])


def test_dotted_options_are_the_json_settings():
    dotted = baseline_choice(_args("--vcd.alpha", "0.5", "--vcd.seed", "3", "--vcd.noise_step", "400"))
    given = baseline_choice(_args("--baseline", "vcd", "--baseline-args",
                                  '{"alpha": 0.5, "seed": 3, "noise_step": 400}'))
    assert dotted == given == ("vcd", {"alpha": 0.5, "seed": 3, "noise_step": 400})
    assert baseline_choice(_args("--baseline", "pai", "--pai.layers", "3", "4", "--no-pai.amplify_prefill")) == \
        ("pai", {"layers": [3, 4], "amplify_prefill": False})
    merged = baseline_choice(_args("--baseline", "deco", "--baseline-args", '{"alpha": 0.6}', "--deco.top_k", "5"))
    assert merged == ("deco", {"alpha": 0.6, "top_k": 5})
    assert baseline_choice(_args()) == (None, None)


def test_the_diffusion_switches():
    assert switched_settings(_args(), "mps") is None and switched_settings(_args("--mps"), "mps") == {}
    assert switched_settings(_args("--mps.k", "5"), "mps") == {"k": 5}  # an option turns MPS on
    assert switched_settings(_args("--mrs.segments", "visual", "generation"), "mrs") == \
        {"segments": ["visual", "generation"]}
    assert switched_settings(_args("--mrs", '{"eta": 12}', "--mrs.beta", "0.02"), "mrs") == {"eta": 12, "beta": 0.02}


@pytest.mark.parametrize("extra, message", [
    (["--baseline", "vcd", "--baseline-args", '{"alpha": 1}', "--vcd.alpha", "2"],
     "--vcd.alpha given both as an option and in --baseline-args"),
    (["--mrs", '{"beta": 0.1}', "--mrs.beta", "0.2"], "--mrs.beta given both as an option and in --mrs"),
    (["--vcd.alpha", "1", "--pai.alpha", "1"], "settings of 2 baselines given (pai, vcd); one baseline at a time"),
    (["--baseline", "pai", "--vcd.alpha", "1"], "--vcd.alpha set vcd, but --baseline is pai"),
    (["--baseline-args", '{"alpha": 1}'], "--baseline-args needs --baseline"),
    (["--mps.k", "5"], "are for --diffusion"),
    (["--vcd.alpha", "-1"], "alpha must be >= 0.0, got -1"),
    (["--diffusion", "--mps.k", "0"], "k must be"),
    (["--diffusion", "--mrs.schedule", "sideways"], "unknown schedule 'sideways'"),
    (["--sampler.cache", "prompt"], "--sampler.* and --steps, --gen-length, --block-length, --cfg-scale, "
                                    "--remasking are for --diffusion"),
    (["--gen-length", "32"], "--remasking are for --diffusion"),
    (["--remasking", "random"], "--remasking are for --diffusion"),
    (["--cfg-scale", "1.5"], "--remasking are for --diffusion"),
    (["--cfg-scale", "0"], "--remasking are for --diffusion"),  # given, even at its default
    (["--diffusion", "--remasking", "sideways"], "remasking must be one of ['low_confidence', 'random']"),
    (["--diffusion", "--sampler.cache", "all"], "cache must be one of"),
    (["--diffusion", "--sampler.cache", "prompt", "--sampler.refresh_every", "2"], "cache='prompt' records the prompt"),
])
def test_bad_settings_are_named_before_the_model_loads(monkeypatch, capsys, extra, message):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(eval_command.Pipeline, "_load", no_load)
    monkeypatch.setattr(eval_command, "eval_dataset", lambda args: [])
    monkeypatch.setattr(eval_command, "check_output_file", lambda path, *a, **k: path)
    assert main([*GENERATE, *extra]) == 2
    assert message in capsys.readouterr().err


def test_the_command_line_and_lmms_eval_read_a_setting_with_one_converter():
    """``--<method>.FIELD`` words and lmms-eval's ``<method>_FIELD=`` strings go through the same converter
    (``field_converter``): the same settings, the same words accepted."""
    mps_keys, mrs_keys = (config_keys(get_method(n).config) for n in ("mps", "mrs"))
    cases = [("mps", mps_keys, ["--mps.lam", "0.2", "--mps.k", "5"], {"lam": "0.2", "k": "5"}),
             ("mrs", mrs_keys, ["--mrs.segments", "visual", "gen", "--mrs.beta", "0.02"],
              {"segments": "visual;gen", "beta": "0.02"})]
    for name, keys, words, model_args in cases:
        assert switched_settings(_args(*words), name) == {k: keys[k](k, v) for k, v in model_args.items()}
    assert sampler_settings(_args("--sampler.threshold", "0.9")) == {"threshold": SAMPLER_KEYS["threshold"]("t", "0.9")}


def test_a_value_of_the_wrong_type_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        _args("--vcd.alpha", "strong")
    assert "argument --vcd.alpha: must be a finite number, got 'strong'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a decoding setting's range, at parse time
        _args("--max-new-tokens", "0")
    assert "argument --max-new-tokens: expected an integer >= 1, got 0" in capsys.readouterr().err


def test_generate_passes_the_settings_to_the_pipeline(monkeypatch):
    seen = {}

    class Recorder:
        def __init__(self, model, **kwargs):
            seen.update(kwargs)
            raise KeyboardInterrupt  # stop before any decoding

    monkeypatch.setattr(eval_command, "Pipeline", Recorder)
    with pytest.raises(KeyboardInterrupt):
        eval_command.load_method(_args("--diffusion", "--mps.k", "4", "--mrs", "--steps", "8", "--gen-length", "32"))
    assert seen["decoding"] == {"mps": {"k": 4}, "mrs": {}} and seen["baseline"] is None and seen["sampler"] == {}
    assert (seen["steps"], seen["gen_length"]) == (8, 32) and "block_length" not in seen  # not given: the default
    seen.clear()
    with pytest.raises(KeyboardInterrupt):
        eval_command.load_method(_args("--diffusion", "--sampler.cache", "prompt", "--sampler.threshold", "0.9",
                                       "--sampler.threshold_rule", "schedule"))
    assert seen["sampler"] == {"cache": "prompt", "threshold": 0.9, "threshold_rule": "schedule"}
    assert "cfg_scale" not in seen and "remasking" not in seen  # not given: the Pipeline's defaults
    with pytest.raises(KeyboardInterrupt):
        eval_command.load_method(_args("--diffusion", "--cfg-scale", "1.5", "--remasking", "random"))
    assert (seen["cfg_scale"], seen["remasking"]) == (1.5, "random")
    with pytest.raises(KeyboardInterrupt):
        eval_command.load_method(_args("--pai.alpha", "0.5"))
    assert seen["baseline"] == "pai" and seen["baseline_args"] == {"alpha": 0.5} and seen["decoding"] == {}


def test_evals_defaults_are_the_pipelines():
    """``eval generate`` / ``eval pope`` show and pass the Pipeline's own defaults (lmms-eval gets the same ones):
    the decoding settings are ``DecodeSettings``' fields, each option generated from one, its help the field's."""
    defaults = pipeline_defaults()
    args = _args()
    assert eval_command.decode_settings(args) == DecodeSettings() and (args.dtype, args.device) == (
        defaults["dtype"], defaults["device"])
    assert {f.name: f.default for f in dataclasses.fields(DecodeSettings)} == {
        k: defaults[k] for k in (f.name for f in dataclasses.fields(DecodeSettings))}
    text = " ".join(_help("pope").split())
    assert f"new tokens an answer may take (a request's own max_new_tokens wins) (default: {DECODE.max_new_tokens})" in text
    for f in dataclasses.fields(DecodeSettings):
        assert "--" + f.name.replace("_", "-") in text
    settings = eval_command.decode_settings(_args("--seed", "3", "--system-prompt", "be brief"))
    assert settings == DecodeSettings(seed=3, system_prompt="be brief") and settings.given() == ["system_prompt", "seed"]


def _help(command: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["eval"]
    return next(a for a in sub._actions if a.dest == "eval_command").choices[command].format_help()


def test_world_eval_scores_equal_either_way(tmp_path):
    model = save_tiny_checkpoint("tiny-llava", tmp_path / "m")
    assert main(["world", "build", "--out", str(tmp_path / "w"), "--n", "2", "--seed", "1"]) == 0
    # one thread pinned: "auto" could choose another count for the second run (other bits, other stats)
    common = ["world", "eval", "--model", str(model), "--data", str(tmp_path / "w"), "--threads", "1", "--out"]
    assert main([*common, str(tmp_path / "a.json"), "--deco.alpha", "0.6", "--deco.top_k", "4"]) == 0
    assert main([*common, str(tmp_path / "b.json"), "--baseline", "deco", "--baseline-args",
                 '{"alpha": 0.6, "top_k": 4}']) == 0
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    assert a["baseline"]["config"]["alpha"] == 0.6 and a["baseline"]["config"]["top_k"] == 4
    assert a == b
