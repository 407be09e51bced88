"""``keepsight.inference.settings.DecodeSettings``: the Pipeline's decoding settings, their defaults written once and
each value checked before a model loads."""

import dataclasses

import pytest

from keepsight.diffusion.sampler import DIFFUSION_SETTINGS, SCHEDULE_SETTINGS
from keepsight.inference.pipeline import pipeline_defaults
from keepsight.inference.settings import DECODE, DecodeSettings


def test_the_pipelines_defaults_are_the_settings():
    defaults = pipeline_defaults()
    assert {f.name: defaults[f.name] for f in dataclasses.fields(DecodeSettings)} == dataclasses.asdict(DECODE)
    assert set(SCHEDULE_SETTINGS) <= set(defaults) & set(DIFFUSION_SETTINGS)  # the sampler's, and only method=diffusion's
    assert DECODE.given() == [] and DecodeSettings(steps=4, cfg_scale=1.0).given() == ["steps", "cfg_scale"]


@pytest.mark.parametrize("settings, message", [
    ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
    ({"max_new_tokens": "8"}, "max_new_tokens must be an integer >= 1, got '8'"),
    ({"steps": 0}, "steps must be >= 1, got 0"),
    ({"gen_length": 2.5}, "gen_length must be an integer >= 1"),
    ({"cfg_scale": -1.0}, "cfg_scale must be >= 0.0"),
    ({"cfg_scale": float("nan")}, "cfg_scale must be a finite number"),
    ({"remasking": "sideways"}, "remasking must be one of ['low_confidence', 'random'], got 'sideways'"),
    ({"seed": -1}, "seed must be >= 0"),
    ({"system_prompt": 3}, "system_prompt must be text, got int"),
])
def test_a_bad_setting_is_named(settings, message):
    with pytest.raises(ValueError) as e:
        DecodeSettings(**settings)
    assert message in str(e.value)
