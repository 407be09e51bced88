"""The masked-diffusion sampler's temperature pinned to its definition (the MPS / MRS paper, arXiv 2605.14530, "Sampler":
"optional Gumbel temperature"): at temperature T > 0 the token committed at a slot is a sample of
softmax(l / T), with l the model's logits at that slot and the suppressed ids (the mask token, plus any
``suppress_token_ids``) removed and the rest renormalised. The reference distribution is computed here
from one forward of the model; the sampler's draws are counted over seeded generators.

Setup: gen_length 1, steps 1 (one slot, one forward), ROWS copies of one prompt per call (each row gets
its own Gumbel noise: independent draws), N_SEEDS generator seeds. T = 0.08 makes the tiny random LM's
nearly flat logits (std ~0.24) a non-degenerate distribution: top token ~0.46, about 30 tokens above 0.1%.

The check is Pearson's chi-square over the tokens with expected count >= 5 (the rest pooled), at the
1e-4 upper point; the same check must reject the distribution at 2T and at T/2, so it has the power to
see a wrong temperature.
"""

from __future__ import annotations

import math

import pytest
import torch

from keepsight.diffusion import generate

T = 0.08
N_SEEDS, ROWS = 4, 1000  # 4000 draws


@pytest.fixture(scope="module")
def prompt(processor):
    text = ["<bos> user : describe the scene . assistant :"]
    return processor.tokenizer(text, return_tensors="pt")["input_ids"]


def target_distribution(logits, temperature, removed):
    """softmax(l / T) over the ids not in ``removed``, written out; removed ids get probability 0.
    logits [V] float64 -> p [V]."""
    keep = torch.ones_like(logits, dtype=torch.bool)
    keep[list(removed)] = False
    z = logits[keep] / temperature
    w = torch.exp(z - z.max())
    p = torch.zeros_like(logits)
    p[keep] = w / w.sum()
    return p


def chi_square(counts, p, min_expected=5.0):
    """Pearson's statistic of observed ``counts [V]`` against probabilities ``p [V]``, tokens with expected
    count < min_expected pooled into one bin (folded into the smallest other bin if still too small).
    Draws of a probability-0 token give inf. Returns (statistic, degrees of freedom)."""
    n = counts.sum()
    expected = n * p
    if bool(((expected == 0) & (counts > 0)).any()):
        return math.inf, 1
    big = expected >= min_expected
    obs = counts[big].tolist()
    exp = expected[big].tolist()
    rest_obs, rest_exp = float(counts[~big].sum()), float(expected[~big].sum())
    if rest_exp >= min_expected:
        obs.append(rest_obs)
        exp.append(rest_exp)
    else:
        j = min(range(len(exp)), key=exp.__getitem__)
        obs[j] += rest_obs
        exp[j] += rest_exp
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return stat, len(obs) - 1


def chi2_critical(df, z=3.719):
    """Upper 1e-4 point of chi-square(df) (Wilson-Hilferty; z = the normal 1e-4 upper point)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


@pytest.mark.parametrize("suppress_top", [False, True])
def test_gumbel_sampling_draws_softmax_of_logits_over_temperature(lm, prompt, suppress_top):
    mask_id = lm.config.mask_token_id
    x = torch.cat([prompt, torch.tensor([[mask_id]])], dim=1)  # [1, P + 1]: the prompt and one mask slot
    with torch.no_grad():
        logits = lm(input_ids=x).logits[0, -1].double()  # [V]: the slot's logits, one forward
    V = logits.shape[0]
    removed = {mask_id}
    suppress = []
    if suppress_top:  # suppress the most likely token: its mass must be spread over the rest, not kept
        masked = logits.clone()
        masked[mask_id] = -math.inf
        suppress = [int(masked.argmax())]
        removed |= set(suppress)
    p = target_distribution(logits, T, removed)  # [V]

    counts = torch.zeros(V, dtype=torch.float64)
    for seed in range(N_SEEDS):
        out = generate(lm, prompt.expand(ROWS, -1), gen_length=1, steps=1, temperature=T,
                       suppress_token_ids=suppress, generator=torch.Generator().manual_seed(seed))
        counts += torch.bincount(out.generated[:, 0], minlength=V).double()  # [V]
    assert counts.sum() == N_SEEDS * ROWS
    assert all(counts[i] == 0 for i in removed)  # the mask token and suppressed ids are never drawn

    stat, df = chi_square(counts, p)
    # Fails if the sampler drew from softmax(l) or softmax(l / T^2), dropped the Gumbel noise (argmax:
    # all draws on one token), reused one noise draw across rows or seeds, or kept the suppressed mass.
    assert stat < chi2_critical(df), f"chi2 {stat:.1f} on {df} df vs the 1e-4 point {chi2_critical(df):.1f}"
    tv = 0.5 * float((counts / counts.sum() - p).abs().sum())
    assert tv < 0.05

    # the same check has the power to see a wrong temperature: it rejects T' = 2T and T' = T/2 outright
    for wrong in (2 * T, T / 2):
        stat_w, df_w = chi_square(counts, target_distribution(logits, wrong, removed))
        assert stat_w > 10 * chi2_critical(df_w), f"T' = {wrong}: chi2 {stat_w:.1f} on {df_w} df"
    # and a non-degenerate target: several tokens carry sizable mass
    assert int((p > 0.03).sum()) >= 5 and float(p.max()) < 0.6
