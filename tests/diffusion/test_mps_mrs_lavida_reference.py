"""Parity with MPS / MRS as MPD-PAC's LaViDa fork releases them (github.com/hong-sujung/MPD-PAC,
``LaViDa/llava/model/language_model/llada_ours``), run under LaViDa's transformers (4.50.3) by
``scripts/reference/mps_mrs_lavida_released.py`` on the tiny LLaDA the LLaDA-V fixtures use: keepsight's sampler and
MPS commit the fork's tokens (plain, lam 0.3, lam 0.8: LaViDa's evaluation setting, one slot a step, no token bans),
MPS's subspace equals the fork's, and the fork's MRS never reaches its attention (its tokens and first-step logits are
the plain ones), while the angle scales it ships equal keepsight's at LaViDa's setting (``MRSConfig.lavida()``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from keepsight.diffusion import MaskPriorSuppression, MonotonicRoPEScaling, generate
from keepsight.diffusion.config import MPSConfig, MRSConfig

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "mps_mrs_lavida"
sys.path.insert(0, str(ROOT / "scripts" / "reference"))
import mps_mrs_lavida_released as lavida  # noqa: E402
import mps_mrs_released as gen  # noqa: E402  (the tiny model and prompt both fixtures use)
from test_mps_mrs_reference import _Tok  # noqa: E402  (what MPS's fit reads of LLaDA's tokenizer)


@pytest.fixture(scope="module")
def ref():
    return json.loads((FIXTURES / "meta.json").read_text()), load_file(FIXTURES / "outputs.safetensors")


@pytest.fixture(scope="module")
def model(ref):
    meta, _ = ref
    m = gen.keepsight_model()
    assert gen.state_digest(m.state_dict()) == meta["base_digest"], "the tiny LLaDA no longer builds the weights the " \
        "reference ran on: regenerate the fixtures (scripts/reference/mps_mrs_lavida_released.py)"
    return m


def _generate(model, lam: float | None = None):
    prompt = load_file(FIXTURES / "prompt.safetensors")["prompt"]
    kwargs = dict(gen_length=lavida.GEN, steps=lavida.GEN, block_length=lavida.BLOCK, mask_token_id=126336)
    if lam is None:
        return generate(model, prompt, **kwargs).generated[0]
    mps = MaskPriorSuppression(k=lavida.K, lam=lam).fit(model, _Tok())
    with mps.apply(model):
        return generate(model, prompt, **kwargs).generated[0]


def test_the_fixture_is_the_lavida_fork(ref):
    meta, _ = ref
    assert meta["transformers"] == "4.50.3" and meta["reference_commits"]["MPD-PAC"].startswith("b85d7e1")
    assert set(meta["settings"]) == {"plain", "mps", "mps_strong", "mrs", "both"}
    assert meta["settings"]["mps"]["prior"] == MPSConfig.lavida().lam


def test_plain_sampling_commits_the_fork_s_tokens(ref, model):
    _, out = ref
    assert torch.equal(_generate(model), out["plain_tokens"])


@pytest.mark.parametrize("name", ["mps", "mps_strong"])
def test_mps_commits_the_fork_s_tokens(ref, model, name):
    meta, out = ref
    assert not torch.equal(out[f"{name}_tokens"], out["plain_tokens"]), "MPS must change the tokens for this to count"
    assert torch.equal(_generate(model, lam=meta["settings"][name]["prior"]), out[f"{name}_tokens"])


def test_mps_subspace_matches_the_fork(ref, model):
    _, out = ref
    mps = MaskPriorSuppression(k=lavida.K).fit(model, _Tok())
    torch.testing.assert_close(mps.mu, out["mps_mu"], atol=1e-4, rtol=1e-4)
    signs = torch.sign((mps.U * out["mps_V"]).sum(0))  # singular vectors are defined up to sign
    torch.testing.assert_close(mps.U * signs, out["mps_V"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mps.u * signs, out["mps_u"], atol=1e-4, rtol=1e-4)


def test_the_fork_s_mrs_never_reaches_its_attention(ref):
    """As released, MRS's arguments stop at ``LLaDAModel.forward``: the rotary embedding is always handed no strength,
    the first step's logits are the plain ones bit for bit, and MRS alone or with MPS commits what it would without."""
    meta, out = ref
    assert all(seen == ["None"] for seen in meta["rope_strength_received_by_attention"].values())
    assert meta["mrs_first_step_max_abs_logit_difference"] == 0.0
    assert torch.equal(out["mrs_tokens"], out["plain_tokens"]) and torch.equal(out["both_tokens"], out["mps_tokens"])


def test_the_angle_scales_the_fork_ships_are_keepsight_s_at_lavida_s_setting(ref):
    meta, out = ref
    setting, cfg = meta["settings"]["mrs"], MRSConfig.lavida()
    assert (setting["rope"], setting["slope"], setting["center"]) == (10 * cfg.beta, cfg.eta, cfg.tau0)
    ours = MonotonicRoPEScaling(beta=cfg.beta, eta=cfg.eta, tau0=cfg.tau0).gains(out["mrs_scale"].numel())  # [D/2]
    torch.testing.assert_close(torch.cat([ours, ours]).float(), out["mrs_scale"], atol=1e-6, rtol=1e-6)
    assert float(out["mrs_scale"].max()) > 1.009  # the scaling the release computes but never applies
