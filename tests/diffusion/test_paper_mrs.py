"""Monotonic RoPE Scaling schedules and gains pinned to closed forms (the MPS / MRS paper, Sec. 5.2 and App. I.6 /
Table 18).

What the paper fixes: the scaling is monotone across the frequency index ("progressively modulates the
scaling strength according to the frequency index"), preserves the high frequencies and modulates the low
ones (I.6), eta is "the slope" and tau0 "the center of the frequency-wise scaling" (I.4), beta "the RoPE
scaling magnitude"; values beta = 0.01, eta = 8 (LLaDA-V) / 12 (LaViDa), tau0 = 0.6. Table 18 names the
schedules (sigmoid, cosine, exponential, linear, power) but the paper writes no formula for any of them,
nor for the gain; the forms below are our reading, written here with the math module:

    sigmoid      (sig(eta (tau - tau0)) - sig(-eta tau0)) / (sig(eta (1 - tau0)) - sig(-eta tau0))
    cosine       (1 - cos(pi tau)) / 2
    exponential  (exp(eta tau) - 1) / (exp(eta) - 1)
    linear       tau
    power        tau ** eta
    gain         g_i = 1 + beta * s(tau_i),  tau_i = i / (D/2 - 1),  i = 0 the highest frequency
"""

from __future__ import annotations

import math

import pytest
import torch

from keepsight.ops.rope import SCHEDULES, rope_gains, schedule

TAUS = [0.0, 0.25, 0.5, 0.6, 0.9, 1.0]
ETAS = [4.0, 8.0, 12.0]
TAU0S = [0.3, 0.6]


def _sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def closed_form(kind: str, tau: float, eta: float, tau0: float) -> float:
    if kind == "sigmoid":
        lo, hi = _sig(-eta * tau0), _sig(eta * (1 - tau0))
        return (_sig(eta * (tau - tau0)) - lo) / (hi - lo)
    if kind == "cosine":
        return (1 - math.cos(math.pi * tau)) / 2
    if kind == "exponential":
        return (math.exp(eta * tau) - 1) / (math.exp(eta) - 1)
    if kind == "linear":
        return tau
    if kind == "power":
        return tau**eta
    raise AssertionError(kind)


def test_the_five_schedules_of_table_18_are_offered():
    assert set(SCHEDULES) == {"sigmoid", "cosine", "exponential", "linear", "power"}


@pytest.mark.parametrize("kind", ["sigmoid", "cosine", "exponential", "linear", "power"])
@pytest.mark.parametrize("eta", ETAS)
@pytest.mark.parametrize("tau0", TAU0S)
def test_schedule_equals_closed_form(kind, eta, tau0):
    got = schedule(torch.tensor(TAUS, dtype=torch.float64), kind, eta, tau0)  # [len(TAUS)]
    want = torch.tensor([closed_form(kind, t, eta, tau0) for t in TAUS], dtype=torch.float64)
    # Fails if: the sigmoid were not rescaled to [0, 1] or centred elsewhere than tau0, eta were not the
    # slope / rate / exponent, cosine were (1 + cos) / 2 (decreasing), exponential were exp(eta tau) unscaled.
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("kind", ["sigmoid", "cosine", "exponential", "linear", "power"])
def test_schedule_is_monotone_from_0_to_1(kind):
    # The paper: monotone across frequency; high frequencies preserved (s = 0 at tau = 0), the lowest
    # frequency gets the full magnitude (s = 1 at tau = 1). Fails for a decreasing or unnormalised schedule.
    tau = torch.linspace(0, 1, 201, dtype=torch.float64)
    s = schedule(tau, kind, 8.0, 0.6)
    assert float(s[0]) == pytest.approx(0.0, abs=1e-12) and float(s[-1]) == pytest.approx(1.0, abs=1e-12)
    assert bool((s[1:] - s[:-1] >= -1e-15).all())
    assert float(s[100]) > 0 and float(s[100]) < 1  # not a step at either end


def test_sigmoid_midpoint_is_tau0():
    # tau0 is "the center": the unscaled sigmoid is 1/2 at tau0, so s(tau0) = (1/2 - lo) / (hi - lo).
    for eta in ETAS:
        for tau0 in TAU0S:
            lo, hi = _sig(-eta * tau0), _sig(eta * (1 - tau0))
            got = float(schedule(torch.tensor([tau0], dtype=torch.float64), "sigmoid", eta, tau0)[0])
            assert got == pytest.approx((0.5 - lo) / (hi - lo), abs=1e-12)


@pytest.mark.parametrize("head_dim", [8, 64, 128])
@pytest.mark.parametrize("beta", [0.01, 0.5])
@pytest.mark.parametrize("kind", ["sigmoid", "cosine", "exponential", "linear", "power"])
def test_rope_gains_are_one_plus_beta_schedule(head_dim, beta, kind):
    eta, tau0 = 12.0, 0.6
    half = head_dim // 2
    g = rope_gains(head_dim, beta, eta, tau0, kind)  # [D/2]
    want = torch.tensor([1 + beta * closed_form(kind, i / (half - 1), eta, tau0) for i in range(half)],
                        dtype=torch.float64)
    # Fails if tau_i were i / (D/2) (the last pair would not reach 1), the pairs were reversed (the high
    # frequencies scaled), or the gain were beta * s or 1 + s.
    assert g.shape == (half,)
    torch.testing.assert_close(g.double(), want, atol=1e-12, rtol=1e-12)
    assert float(g[0]) == 1.0  # pair 0, the highest frequency: unchanged
    assert float(g[-1]) == pytest.approx(1 + beta, abs=1e-12)  # the lowest frequency: the full magnitude


def test_paper_settings_llada_v_and_lavida():
    # LLaDA-V: beta = 0.01, eta = 8; LaViDa: beta = 0.01, eta = 12; tau0 = 0.6 (Sec. 6); head_dim 128 (8B).
    for eta in (8.0, 12.0):
        g = rope_gains(128, 0.01, eta, 0.6)  # default schedule: sigmoid
        want = [1 + 0.01 * closed_form("sigmoid", i / 63, eta, 0.6) for i in range(64)]
        torch.testing.assert_close(g.double(), torch.tensor(want, dtype=torch.float64), atol=1e-12, rtol=0)
        assert 1.0 <= float(g.min()) and float(g.max()) == pytest.approx(1.01, abs=1e-12)
