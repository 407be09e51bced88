"""Parity with Fast-dLLM's released threshold decoding (github.com/NVlabs/Fast-dLLM ``llada/generate.py``), run by
``scripts/reference/fastdllm_threshold.py`` on a tiny LLaDA built from keepsight's config (its LM head sharpened so
the confidences spread over (0, 1)): keepsight's sampler with ``threshold_rule="fast-dllm"`` commits the same tokens
in the same number of forwards at thresholds 0.9 and 0.5, and its plain schedule equals the reference's schedule
mode; our earlier rule (``"schedule"``) is a different decoder at the same settings."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from keepsight.diffusion import generate

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "fast_dllm"
sys.path.insert(0, str(ROOT / "scripts" / "reference"))
import fastdllm_threshold as gen  # noqa: E402  (the generator's tiny model and prompt, rebuilt here)


@pytest.fixture(scope="module")
def ref():
    return json.loads((FIXTURES / "meta.json").read_text()), load_file(FIXTURES / "outputs.safetensors")


@pytest.fixture(scope="module")
def model(ref):
    meta, _ = ref
    m = gen.keepsight_model()
    assert gen.base.state_digest(m.state_dict()) == meta["digest"], "the tiny LLaDA no longer builds the weights the " \
        "reference ran on: regenerate the fixtures (scripts/reference/fastdllm_threshold.py)"
    return m


def _run(model, meta, **kw):
    return generate(model, gen.base.prompt_ids(), gen_length=meta["gen_length"], steps=meta["steps"],
                    block_length=meta["block_length"], **kw)


@pytest.mark.parametrize("name", ["t0.9", "t0.5"])
def test_the_fast_dllm_rule_equals_the_release(ref, model, name):
    meta, out = ref
    ours = _run(model, meta, threshold=meta["thresholds"][name])
    assert torch.equal(ours.generated[0], out[f"{name}_tokens"])
    assert ours.forwards == meta["nfe"][name]


def test_the_schedule_equals_the_release_without_threshold(ref, model):
    meta, out = ref
    ours = _run(model, meta)
    assert torch.equal(ours.generated[0], out["schedule_tokens"]) and ours.forwards == meta["nfe"]["schedule"]


def test_our_earlier_rule_is_another_decoder(ref, model):
    """At threshold 0.9 with 4 steps per block our rule commits at least the schedule's 2 a step (and ends a block
    early once it is done): at most 8 forwards, where Fast-dLLM's rule commits one or more a step until each block is
    done (10)."""
    meta, out = ref
    ours = _run(model, meta, threshold=0.9, threshold_rule="schedule")
    assert ours.forwards <= meta["steps"] < meta["nfe"]["t0.9"]
    assert not torch.equal(ours.generated[0], out["t0.9_tokens"])
