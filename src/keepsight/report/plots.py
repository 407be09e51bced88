"""Matplotlib figures written as PNG files (Agg backend; no display needed)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_accuracy_by_index(rows: list[dict], path: str | Path, title: str,
                           fields=("exact", "colour", "shape", "colour_counter_prior", "shape_counter_prior")) -> Path:
    """Accuracy of each attribute against the object's 1-based index in the description."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    for f in fields:
        pts = [(r["index"] + 1, r[f]) for r in rows if r.get(f) is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", label=f.replace("_", " "))
    ax.set_xlabel("object index in the description")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    return _save(fig, Path(path))


def plot_arms_by_index(rows_by_arm: dict[str, list[dict]], path: str | Path, title: str,
                       field: str = "exact") -> Path:
    """One line per arm: ``field`` accuracy against the object's 1-based index in the description."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    for arm, rows in rows_by_arm.items():
        pts = [(r["index"] + 1, r[field]) for r in rows if r.get(field) is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", label=arm)
    ax.set_xlabel("object index in the description")
    ax.set_ylabel(f"{field.replace('_', ' ')} accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    return _save(fig, Path(path))


def plot_heatmaps(grids: dict[str, list[list[float]]], xlabels: list[str], ylabels: list[str], path: str | Path,
                  title: str) -> Path:
    """One accuracy heatmap (rows: ylabels, columns: xlabels, values in [0, 1]) per entry of ``grids``."""
    fig, axes = plt.subplots(1, len(grids), figsize=(3.0 * len(grids), 3.0), dpi=110, squeeze=False)
    for ax, (name, grid) in zip(axes[0], grids.items()):
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(xlabels)), xlabels, fontsize=7)
        ax.set_yticks(range(len(ylabels)), ylabels, fontsize=7)
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="w" if v < 0.6 else "k")
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("depth", fontsize=7)
    fig.suptitle(title, fontsize=9)
    return _save(fig, Path(path))


def plot_panels(panels: list[dict], path: str | Path, title: str = "") -> Path:
    """Side-by-side line plots. Each panel: ``title``, ``xlabel``, ``ylabel``, optional ``logy``, and
    ``series``: label -> ``(xs, ys)`` or ``(xs, ys, linestyle)``."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), dpi=110, squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for label, (xs, ys, *style) in panel["series"].items():
            ax.plot(xs, ys, marker=".", linestyle=style[0] if style else "-", label=label)
        if panel.get("logy"):
            ax.set_yscale("log")
        ax.set_xlabel(panel["xlabel"], fontsize=8)
        ax.set_ylabel(panel["ylabel"], fontsize=8)
        ax.set_title(panel["title"], fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, Path(path))


def plot_text_regimes(arms: dict[str, dict], path: str | Path, oracle_history: dict | None = None,
                      title: str = "") -> Path:
    """Accuracy of a visual question as text grows, one line per arm with its 95% interval. Left: after h turns of
    history (``arm["history"]["by_length"]``; ``oracle_history``: the base with the image again, dashed). Right: with
    no text, after the arm's own description, and after it with the image shown again (``arm["after_description"]``
    when present)."""
    desc = {a: v["after_description"] for a, v in arms.items() if v.get("after_description")}
    fig, axes = plt.subplots(1, 2 if desc else 1, figsize=(10.0 if desc else 5.6, 3.6), dpi=110, squeeze=False)
    ax = axes[0][0]
    lines = dict(arms) | ({"base, image again (oracle)": {"history": oracle_history}} if oracle_history else {})
    for name, v in lines.items():
        by = v["history"]["by_length"]
        hs = sorted(int(h) for h in by)
        acc = [by[str(h)]["acc"] for h in hs]
        err = [[a - by[str(h)].get("low", a) for h, a in zip(hs, acc)], [by[str(h)].get("high", a) - a
                                                                        for h, a in zip(hs, acc)]]
        ax.errorbar(hs, acc, yerr=err, marker="o", capsize=2, label=name,
                    linestyle="--" if name.endswith("(oracle)") else "-")
    ax.set_xlabel("turns of history before the question")
    ax.set_ylabel("accuracy (95% interval)")
    ax.set_title("after question turns", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    if desc:
        ax = axes[0][1]
        steps = ("none", "description", "oracle")
        for k, (name, d) in enumerate(desc.items()):
            xs = [i + 0.08 * (k - (len(desc) - 1) / 2) for i in range(len(steps))]
            acc = [d[s]["acc"] for s in steps]
            err = [[a - d[s]["low"] for s, a in zip(steps, acc)], [d[s]["high"] - a for s, a in zip(steps, acc)]]
            ax.errorbar(xs, acc, yerr=err, marker="o", capsize=2, label=name)
        ax.set_xticks(range(len(steps)), ["no text", "after its description", "+ the image again"], fontsize=8)
        ax.set_ylabel("accuracy (95% interval)")
        ax.set_title("after the model's own description", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, Path(path))


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_diagnosis(diag: dict, out_dir: str | Path, title: str = "") -> dict[str, Path]:
    """Four PNGs from ``keepsight.world.diagnose.diagnose``: Omega_V(t) log-log with the fitted slope,
    TVR(t), a layer x step heatmap of Omega_V, and LogitLens agreement / KL per layer."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    t, om = diag["t"], diag["omega_v"]

    fig, ax = plt.subplots(figsize=(5.6, 3.6), dpi=110)
    ax.loglog(t, om, marker=".", label="Omega_V (mean over layers, heads)")
    if diag["slope"] is not None and len(t) > 1:
        # line through the geometric mean of the generated steps with the fitted slope
        lx = sum(math.log(x) for x in t[1:]) / len(t[1:])
        ly = sum(math.log(y) for y in om[1:]) / len(om[1:])
        ax.loglog(t[1:], [math.exp(ly + diag["slope"] * (math.log(x) - lx)) for x in t[1:]], "--",
                  label=f"fit: slope {diag['slope']:.2f} (paper ~ -1)")
    ax.set_xlabel("text tokens in context t")
    ax.set_ylabel("visual attention mass")
    ax.set_title(title or "Omega_V(t)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    paths["omega"] = _save(fig, out_dir / "omega_v_loglog.png")

    fig, ax = plt.subplots(figsize=(5.6, 3.6), dpi=110)
    for layer, row in enumerate(diag["tvr_by_layer"]):
        ax.semilogy(t, row, label=f"layer {layer}")
    ax.set_xlabel("text tokens in context t")
    ax.set_ylabel("TVR = Z_T / Z_V")
    ax.set_title("text-to-vision ratio (paper: plateau near 1e2)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    paths["tvr"] = _save(fig, out_dir / "tvr.png")

    fig, ax = plt.subplots(figsize=(6.4, 2.8), dpi=110)
    im = ax.imshow(diag["omega_v_by_layer"], aspect="auto", origin="lower", cmap="viridis")
    ax.set_xlabel("generation step")
    ax.set_ylabel("decoder layer")
    ax.set_title("Omega_V by layer and step")
    fig.colorbar(im, ax=ax)
    paths["heatmap"] = _save(fig, out_dir / "omega_v_heatmap.png")

    fig, ax = plt.subplots(figsize=(5.6, 3.2), dpi=110)
    layers = list(range(len(diag["kl_by_layer"])))
    ax.bar(layers, diag["top1_agree_by_layer"], color="tab:blue", label="top-1 agrees with final")
    ax2 = ax.twinx()
    ax2.plot(layers, diag["kl_by_layer"], "o-", color="tab:red", label="KL(final || layer)")
    ax.set_xlabel("decoder layer")
    ax.set_ylabel("agreement")
    ax2.set_ylabel("KL (nats)")
    ax.set_title(f"LogitLens (mean convergence layer {diag['convergence_layer_mean']:.2f})")
    fig.legend(fontsize=7, loc="upper left")
    paths["logit_lens"] = _save(fig, out_dir / "logit_lens.png")
    return paths
