"""Report pieces for the diffusion experiment: HTML sections and the Markdown summary."""

from __future__ import annotations

from pathlib import Path

from .html import fmt, img_tag, md_table, table
from .plots import plot_panels
from .seeds import fmt_ci

COLUMNS = (("distinct-2", "distinct_2"), ("repetition", "repetition_ratio"),
           ("repeats in mask top-10", "repeats_in_mask_top10"), ("CHAIRi", "chair_i"),
           ("hallucination rate", "hallucination_rate"), ("object recall", "object_recall"),
           ("exact recall", "exact_recall"), ("seconds", "seconds"))


def _grid_rows(res: dict) -> list[list]:
    return [[r["steps"], r["method"]] + [r[k] for _, k in COLUMNS] for r in res["grid"]]


FAST = (("forwards", "forwards"), ("positions / answer", "positions_per_answer"), ("seconds", "seconds"),
        ("object recall", "object_recall"), ("repetition", "repetition_ratio"), ("CHAIRi", "chair_i"))


def _fast_rows(res: dict) -> list[list]:
    """Per (T, sampler): the counts, and FLOPs saved / recall lost against the plain sampler at that T."""
    plain = {r["steps"]: r for r in res.get("fast", []) if r["sampler"] == "plain"}
    rows = []
    for r in res.get("fast", []):
        p = plain.get(r["steps"])
        saving = p["positions_per_answer"] / r["positions_per_answer"] if p else None
        d_recall = r["object_recall"] - p["object_recall"] if p else None
        rows.append([r["steps"], r["sampler"]] + [r[k] for _, k in FAST] + [saving, d_recall])
    return rows


FAST_HEADER = ["T", "sampler"] + [c for c, _ in FAST] + ["FLOPs saving", "recall vs plain"]


SEED_COLUMNS = (("repetition", "repetition_ratio"), ("distinct-2", "distinct_2"), ("CHAIRi", "chair_i"),
                ("object recall", "object_recall"))
SEED_HEADER = (["T", "method"] + [c for c, _ in SEED_COLUMNS] + [f"{c} vs none" for c, _ in SEED_COLUMNS])


def _seed_rows(res: dict) -> list[list]:
    """Per (T, method): each metric's mean [95% t interval] over the training seeds, and its paired difference from
    no method."""
    ov = res["over_seeds"]
    diff = {(r["steps"], r["method"]): r for r in ov["vs_none"]}
    return [[r["steps"], r["method"]] + [fmt_ci(r[k]) for _, k in SEED_COLUMNS]
            + [fmt_ci(diff[(r["steps"], r["method"])][k]) if (r["steps"], r["method"]) in diff else "–"
               for _, k in SEED_COLUMNS] for r in ov["grid"]]


def _seed_sweep_rows(res: dict) -> list[list]:
    return [[s["param"], s["value"]] + [fmt_ci(s[k]) for _, k in SEED_COLUMNS]
            + [fmt_ci(s["vs_none"].get(k)) for _, k in SEED_COLUMNS] for s in res["over_seeds"]["sweeps"]]


EFFECT_HEADER = ["seed", "lam", "|dh| / |h|", "prior top-10 prob before", "after", "argmax changed"]


def _effect_runs(res: dict) -> list[dict]:
    """Each training seed's ``{"seed", "mps_effect"}`` (one seed: the results' own, its seed unnamed)."""
    return res.get("seeds") or [{"seed": None, "mps_effect": res.get("mps_effect")}]


def _effect_rows(res: dict) -> list[list]:
    return [[r["seed"], e["lam"], e["move"], e["top10_before"], e["top10_after"], e["argmax_changed"]]
            for r in _effect_runs(res) if r.get("mps_effect") for e in r["mps_effect"]["by_lam"]]


def _effect_text(res: dict) -> str:
    """One sentence per seed: the fit's state norms, |mu|, the LM head input's norm and the mean gate."""
    out = []
    for r in _effect_runs(res):
        e = r.get("mps_effect")
        if e:
            who = "" if r["seed"] is None else f"seed {r['seed']}: "
            out.append(f"{who}fit states' norms {' / '.join(f'{x:.1f}' for x in e['state_norms'])} (the last is the "
                       f"final norm's output), |mu| {e['mu_norm']:.1f}, LM head input |h| {e['h_norm']:.1f} at the "
                       f"masked slots, mean gate cos(z, u) {e['gate']:.3f}")
    return "; ".join(out)


EFFECT_INTRO = ("MPS's effect where it acts: the sampler's first forward (every slot masked), the LM head's input h "
                "before and after the released update at each lam. The update is centred on mu, the mean of the fit's "
                "states; where |mu| is far larger than |h| (the decoder layers' outputs against the final norm's), "
                "(h - mu) is nearly -mu at every slot, the gate is open everywhere and the update is nearly one "
                "constant shift of size lam |mu|.")


def _overhead(res: dict) -> list[list]:
    by = {(r["steps"], r["method"]): r["seconds"] for r in res["grid"]}
    return [[t, by[(t, "none")], by[(t, "both")], by[(t, "both")] / by[(t, "none")] - 1]
            for t in res["config"]["steps_grid"]]


def plot_attention(att: dict, path: Path) -> Path:
    """Attention per visual / mask key vs distance, and the lowest band's logit share, per MRS setting."""
    per_key = {f"{name}: {kind}": (r["profile"][kind]["bins"], r["profile"][kind]["attention"],
                                   "-" if kind == "visual" else "--")
               for name, r in att.items() for kind in ("visual", "mask") if kind in r["profile"]}
    low = {f"{name}: {kind}": (r["profile"][kind]["bins"], r["profile"][kind]["band_share"][-1],
                               "-" if kind == "visual" else "--")
           for name, r in att.items() for kind in ("visual", "mask") if kind in r["profile"]}
    return plot_panels([
        {"title": "attention weight per key", "xlabel": "relative distance (tokens)", "ylabel": "mean weight",
         "logy": True, "series": per_key},
        {"title": "lowest-frequency band's share of |logit|", "xlabel": "relative distance (tokens)",
         "ylabel": "share", "series": low}], path, "generation slots -> visual (solid) / mask (dashed) keys")


def _attention_rows(att: dict) -> list[list]:
    rows = []
    for name, r in att.items():
        share = {k: r["profile"][k]["band_share_all"] for k in ("visual", "mask") if k in r["profile"]}
        rows.append([name] + list(r["mass"].values())
                    + [share.get("visual", [None])[0], share.get("visual", [None])[-1],
                       share.get("mask", [None])[0], share.get("mask", [None])[-1], r["object_recall"], r["chair_i"]])
    return rows


def _attention_header(att: dict) -> list[str]:
    """Matches ``_attention_rows``: the key kinds come from the probe's results."""
    kinds = next(iter(att.values()))["mass"]
    return ["setting"] + [f"mass -> {k}" for k in kinds] + [
        "vis: high band", "vis: low band", "mask: high band", "mask: low band", "object recall", "CHAIRi"]


def _profile_rows(att: dict, kind: str) -> tuple[list[list], list[str]]:
    """Rows per distance bin (keyed by the bin's first distance): weight per key and the highest / lowest
    band's share for each setting (blank where a setting has no sample at that distance)."""
    names = [n for n in att if kind in att[n]["profile"]]
    by = {n: {b: i for i, b in enumerate(att[n]["profile"][kind]["bins"])} for n in names}
    starts = sorted({b for n in names for b in by[n]})
    rows = []
    for b in starts:
        row = [f"{b}-{b + att[names[0]]['bin_width'] - 1}"]
        for n in names:
            p, i = att[n]["profile"][kind], by[n].get(b)
            row += [None] * 3 if i is None else [p["attention"][i], p["band_share"][0][i], p["band_share"][-1][i]]
        rows.append(row)
    return rows, names


def _attention_sections(res: dict, plot: Path | None) -> list[tuple[str, str]]:
    att = res.get("attention")
    if not att:
        return []
    first = next(iter(att.values()))
    intro = (f"<p>Attention of the generation slots at T = {res['config']['sweep_steps']}, recomputed from q/k in "
             f"every layer ({first['n_forwards']} sampler forwards per setting). Mass: share of a slot's attention "
             f"on each key kind (mean over steps, layers, heads, slots). Bands: the {first['n_bands']} equal "
             "groups of RoPE pairs (high = highest frequencies) and their share of the summed |logit| parts. "
             "The paper: Gen->Mask is dominated by high frequencies, Gen->Vis relies more on low frequencies as "
             "distance grows, attention still decays with distance, and MRS moves attention from nearby mask "
             "slots to distant visual tokens.</p>")
    out = intro + table(_attention_header(att), _attention_rows(att))
    if plot is not None:
        out += img_tag(plot.read_bytes(), "attention vs distance")
    sections = [("Diffusion: attention by key kind and RoPE band, with and without MRS", out)]
    for kind in ("visual", "mask"):
        rows, names = _profile_rows(att, kind)
        header = ["distance"] + [f"{n}: {c}" for n in names for c in ("weight/key", "high band", "low band")]
        sections.append((f"Diffusion: generation -> {kind} attention by relative distance", table(header, rows)))
    return sections


def _window(cfg: dict) -> str:
    """The sampling window: its length, and the block length where the runs sample block by block."""
    n, block = cfg["train"]["answer_length"], cfg.get("block_length")
    return f"{n}-token descriptions" + (f", sampled in blocks of {block}" if block else "")


def _stages(tr: dict, cfg: dict) -> str:
    """How the diffusion model was trained: "N steps", or both stages of a curriculum."""
    if "first_stage" not in tr:
        return f"{tr['train']['steps']} steps"
    first = tr["first_stage"]
    return (f"{first['train']['steps']} steps on {'+'.join(cfg['tasks'])} (loss {fmt(first['first_loss'])} -> "
            f"{fmt(first['last_loss'])}), then fine-tuned {tr['train']['steps']} steps on "
            f"{'+'.join(cfg['finetune_tasks'])}")


def diffusion_sections(res: dict, attention_plot: Path | None = None) -> list[tuple[str, str]]:
    tr, cfg = res["training"], res["config"]
    cos = res["prior_cosine"]
    intro = (f"<p>A tiny LLaDA-V-style VLM (LLaVA with a bidirectional Llada language model; the world base's "
             f"vision tower) trained {_stages(tr, cfg)} with the masked-diffusion objective (loss "
             f"{fmt(tr['first_loss'])} -> {fmt(tr['last_loss'])}), describing {cfg['n_scenes']} held-out scenes "
             f"with {cfg['n_objects']} objects ({_window(cfg)}). MPS: "
             f"{cfg['mps']}; MRS: {cfg['mrs']}; NTK / YaRN with factor 2 in place of MRS. The uncontextualised "
             f"mask token's top-10: <code>{fmt(' '.join(res['mask_prior_top10']))}</code>. The paper: over 95% "
             f"of repeats are mask-prior tokens at few steps; both fixes raise distinct-n and lower CHAIR.</p>")
    sweep_rows = [[s["param"], s["value"]] + [s[k] for _, k in COLUMNS[:-1]] for s in res["sweeps"]]
    cos_rows = [[i + 1, a, b] for i, (a, b) in enumerate(zip(cos["none"], cos["mps"]))]
    return [
        ("Diffusion: methods x steps", intro + table(["T", "method"] + [c for c, _ in COLUMNS], _grid_rows(res))),
        (f"Diffusion: sweeps at T = {cfg['sweep_steps']}",
         table(["parameter", "value"] + [c for c, _ in COLUMNS[:-1]], sweep_rows)),
        ("Diffusion: |cos| of still-masked final hidden states to the prior subspace, per step",
         table(["step", "no fix", "MPS"], cos_rows)),
        ("Diffusion: sampler latency with MPS + MRS", table(["T", "plain s", "MPS + MRS s", "overhead"],
                                                             _overhead(res))),
    ] + _seed_sections(res) + ([(f"Diffusion: fast samplers (block {cfg.get('sampler_block')})",
           "<p>The block cache (prefix: the prompt and finished blocks; dual: also the slots after the block) "
           "refreshed at each block's first step, and confidence-threshold parallel decoding, beside the plain "
           "sampler at the same block length. Positions / answer: what the model's forwards ran, the FLOPs proxy. "
           "Goal: at least 2x fewer FLOPs at T = 32 with recall within 0.02.</p>"
           + table(FAST_HEADER, _fast_rows(res)))] if res.get("fast") else []) + _attention_sections(res, attention_plot)


def _seed_sections(res: dict) -> list[tuple[str, str]]:
    out = []
    if res.get("over_seeds"):
        n = res["over_seeds"]["n"]
        out.append((f"Diffusion: methods x steps over {n} training seeds",
                    f"<p>Mean [95% t interval] over {n} training seeds of the diffusion VLM; 'vs none': the paired "
                    "difference from no method at the same T.</p>" + table(SEED_HEADER, _seed_rows(res))))
        if res["over_seeds"]["sweeps"]:
            out.append((f"Diffusion: sweeps at T = {res['config']['sweep_steps']} over {n} training seeds",
                        table(["parameter", "value"] + SEED_HEADER[2:], _seed_sweep_rows(res))))
    rows = _effect_rows(res)
    if rows:
        out.append(("Diffusion: what MPS does to the LM head's input",
                    f"<p>{EFFECT_INTRO} {_effect_text(res)}.</p>" + table(EFFECT_HEADER, rows)))
    return out


def diffusion_markdown(res: dict) -> str:
    cfg = res["config"]
    lines = ["", f"Diffusion experiment ({_window(cfg)}, LLaDA-style sampler):", "",
             *md_table(["T", "method"] + [c for c, _ in COLUMNS], _grid_rows(res))]
    if res.get("sweeps"):
        header = ["parameter", "value"] + [c for c, _ in COLUMNS[:-1]]
        lines += ["", f"Sweeps at T = {cfg['sweep_steps']} (released MPS: lam, k; released MRS: beta, eta, tau0, schedule; our "
                  "earlier readings: projection_lam, prior, center, layers (MPS), amplitude_beta, frequency_beta (MRS)):", "",
                  *md_table(header, [[s["param"], s["value"]] + [s[k] for _, k in COLUMNS[:-1]] for s in res["sweeps"]])]
    if res.get("fast"):
        lines += ["", f"Fast samplers (block {res['config'].get('sampler_block')}):", "",
                  *md_table(FAST_HEADER, _fast_rows(res))]
    if res.get("over_seeds"):
        n = res["over_seeds"]["n"]
        lines += ["", f"Over {n} training seeds of the diffusion VLM (mean [95% t interval]; 'vs none': the paired "
                      "difference from no method at the same T):", ""] + md_table(SEED_HEADER, _seed_rows(res))
        if res["over_seeds"]["sweeps"]:
            lines += ["", f"Sweeps at T = {cfg['sweep_steps']} over {n} training seeds:", ""]
            lines += md_table(["parameter", "value"] + SEED_HEADER[2:], _seed_sweep_rows(res))
    rows = _effect_rows(res)
    if rows:
        lines += ["", f"{EFFECT_INTRO} {_effect_text(res)}.", ""] + md_table(EFFECT_HEADER, rows)
    cos = res["prior_cosine"]
    if cos["none"]:
        lines += ["", f"Prior |cos| of still-masked slots, first / last step: no fix {cos['none'][0]:.3f} / "
                      f"{cos['none'][-1]:.3f}, MPS {cos['mps'][0]:.3f} / {cos['mps'][-1]:.3f}."]
    lines.append(f"Mask-token prior top-10: {' '.join(res['mask_prior_top10'])}.")
    att = res.get("attention")
    if att:
        header = _attention_header(att)
        lines += ["", f"Attention of generation slots (T = {res['config']['sweep_steps']}; mass per key kind, and "
                      "the highest / lowest RoPE band's share of |logit| for visual and mask keys):", "",
                  *md_table(header, _attention_rows(att))]
    return "\n".join(lines)


def diffusion_report(res: dict, out_dir: Path) -> list[tuple[str, str]]:
    """The experiment's report sections, with the attention-by-distance plot (the demo's table entry)."""
    return diffusion_sections(res, plot_attention(res["attention"], Path(out_dir) / "diffusion_attention.png"))
