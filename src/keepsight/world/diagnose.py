"""The dilution measurement of the PVM paper (sections 3 and 6.3) on any supported VLM and world data:
Omega_V(t) and TVR(t) per layer while generating a long description, a power-law fit of Omega_V
against the number of text tokens t, and LogitLens convergence per step."""

from __future__ import annotations

import math

import torch

from ..inference import Pipeline
from ..metrics import least_squares_slope
from ..models.arch import check_length
from ..probes import LogitLens, VisualAttentionProbe
from .evaluate import description_budget
from .tasks import WorldSamples
from .texts import DESCRIBE_PROMPT

PROMPTS = {"blind-painter": DESCRIBE_PROMPT}


def _fit_loglog(t: list[float], y: list[float]) -> float | None:
    """Least-squares slope of log y against log t (points with t, y > 0)."""
    pts = [(math.log(a), math.log(b)) for a, b in zip(t, y) if a > 0 and b > 0]
    return least_squares_slope([x for x, _ in pts], [v for _, v in pts])


@torch.no_grad()
def diagnose(model, processor, samples: WorldSamples, prompt: str = "blind-painter",
             max_new_tokens: int | None = None, batch_size: int = 32) -> dict:
    """Generate ``prompt`` answers for ``samples`` under the probe and the lens; return JSON-able curves.

    Steps are averaged over the rows still generating (a row stops counting after its end token).
    ``t`` is the number of text (non-image, non-padding) tokens in context at each step.
    """
    if prompt not in PROMPTS:
        raise ValueError(f"unknown prompt {prompt!r}; choose from {sorted(PROMPTS)}")
    budget = max_new_tokens or description_budget(samples.config.max_objects)
    check_length(model, budget, "max_new_tokens")
    tok = processor.tokenizer
    pipe = Pipeline.from_model(model, processor)
    lens = LogitLens(model)
    n_layers = len(lens.info.layers)
    sums = None  # accumulated per step: omega [L], log-tvr [L], t, kl [L], agree [L], conv, count
    for i in range(0, len(samples), batch_size):
        images = [[im] for im in samples.images[i : i + batch_size]]
        enc = pipe.encode([pipe.chat_prompt(PROMPTS[prompt], 1)] * len(images), images, "left")
        with VisualAttentionProbe(model) as probe:
            out = pipe.generate_ids(enc, {"max_new_tokens": budget}, output_hidden_states=True,
                                    return_dict_in_generate=True)
        ids, lens_steps = out.sequences, lens.steps(out.hidden_states)
        log_ratio = torch.stack(probe.log_ratio)  # [S, L, B, H]
        steps = log_ratio.shape[0]
        gen = ids[:, enc["input_ids"].shape[1]:]  # [B, new]
        ended = (gen == tok.eos_token_id).long().cumsum(1)  # [B, new]
        # row b is active at step s if no end token was generated before step s
        active = torch.ones(steps, gen.shape[0], dtype=torch.bool)
        active[1:] = (ended[:, : steps - 1] == 0).T
        prompt_text = ((enc["input_ids"] != tok.image_token_id) & enc["attention_mask"].bool()).sum(1)  # [B]
        if sums is None:
            sums = {k: torch.zeros(budget + 1, *s) for k, s in
                    (("omega", (n_layers,)), ("log_tvr", (n_layers,)), ("t", ()), ("kl", (n_layers,)),
                     ("agree", (n_layers,)), ("conv", ()), ("count", ()))}
        for s in range(steps):
            a = active[s]
            if not a.any():
                continue
            lr = log_ratio[s][:, a]  # [L, b, H]
            sums["omega"][s] += torch.sigmoid(lr).mean(-1).sum(-1)
            sums["log_tvr"][s] += (-lr).mean(-1).sum(-1)
            sums["t"][s] += (prompt_text[a] + s).float().sum()
            ls = lens_steps[s]
            sums["kl"][s] += ls["kl"][:, a].sum(-1)
            sums["agree"][s] += ls["top1_agree"][:, a].float().sum(-1)
            sums["conv"][s] += ls["convergence_layer"][a].float().sum()
            sums["count"][s] += a.sum()
    keep = sums["count"] > 0
    count = sums["count"][keep]
    mean = {k: (v[keep] / (count if v.dim() == 1 else count[:, None])) for k, v in sums.items() if k != "count"}
    omega = mean["omega"]  # [S, L]
    t = mean["t"].tolist()
    gen_steps = slice(1, None)  # fit over generated tokens (step 0 is the prefill)
    overall = omega.mean(1).tolist()
    tail = max(1, len(t) // 4)
    tvr = mean["log_tvr"].exp()  # [S, L] geometric mean over heads and rows
    return {
        "prompt": prompt,
        "n_samples": len(samples),
        "max_new_tokens": budget,
        "steps": len(t),
        "rows_active": count.tolist(),
        "t": t,
        "omega_v": overall,  # mean over layers, heads, active rows
        "omega_v_by_layer": omega.T.tolist(),  # [L][S]
        "tvr": tvr.mean(1).tolist(),
        "tvr_by_layer": tvr.T.tolist(),
        "slope": _fit_loglog(t[gen_steps], overall[gen_steps]),
        "slope_by_layer": [_fit_loglog(t[gen_steps], omega[1:, layer].tolist()) for layer in range(n_layers)],
        "tvr_plateau": float(tvr.mean(1)[-tail:].median()),
        "kl_by_layer": mean["kl"].mean(0).tolist(),  # mean over steps
        "top1_agree_by_layer": mean["agree"].mean(0).tolist(),
        "convergence_layer": mean["conv"].tolist(),  # per step
        "convergence_layer_mean": float(mean["conv"].mean()),
    }
