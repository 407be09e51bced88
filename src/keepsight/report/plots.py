"""Matplotlib figures written as PNG files (Agg backend; no display needed)."""

from __future__ import annotations

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
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
