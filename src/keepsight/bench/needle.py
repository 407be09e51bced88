"""``keepsight bench needle``: needle in a haystack for the bridges alone.

A haystack of N random patch features (standard normal, width d) hides one needle: one of K fixed random
vectors, at a depth from 0% (the first patch) to 100% (the last). Each bridge plus a linear read-out of
its *last* output token is trained on short sequences (random depths) to name the needle; then accuracy is
measured at lengths 1K..16K and five depths (chance = 1/K). The last token is where a causal bridge must
carry the needle to: this measures what the bridge's state retains, not what a language model reading
every bridge output could find (that would be trivial for any per-patch projector). Heatmaps as PNG.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from ..bridge import build_bridge
from ..report.plots import plot_heatmaps
from . import write_result

KINDS = ("lia_mtr", "linear_attention", "attention_sdpa", "mlp")
LENGTHS = (1024, 2048, 4096, 8192, 16384)
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


class _Task:
    def __init__(self, width: int, n_needles: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.needles = torch.randn(n_needles, width, generator=g) * 2.0  # [K, d]
        self.k = n_needles

    def batch(self, b: int, n: int, depth: float | None, g: torch.Generator):
        """[B, N, d] haystacks with one needle each, and the needle ids [B]."""
        x = torch.randn(b, n, self.needles.shape[1], generator=g)
        ids = torch.randint(self.k, (b,), generator=g)
        if depth is None:
            pos = torch.randint(n, (b,), generator=g)
        else:
            pos = torch.full((b,), round(depth * (n - 1)))
        x[torch.arange(b), pos] = self.needles[ids]
        return x, ids


def _train(kind: str, task: _Task, width: int, steps: int, train_len: int, seed: int):
    torch.manual_seed(seed)
    bridge = build_bridge(kind, d_vision=width, d_model=width)
    head = nn.Linear(width, task.k)
    opt = torch.optim.AdamW(list(bridge.parameters()) + list(head.parameters()), lr=3e-3)
    g = torch.Generator().manual_seed(seed + 1)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x, ids = task.batch(32, train_len, None, g)
        loss = nn.functional.cross_entropy(head(bridge(x)[:, -1]), ids)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return bridge.eval(), head.eval(), float(loss.detach())


@torch.inference_mode()
def _accuracy(bridge, head, task: _Task, n: int, depth: float, samples: int, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    right = 0
    for i in range(0, samples, 8):
        x, ids = task.batch(min(8, samples - i), n, depth, g)
        right += int((head(bridge(x)[:, -1]).argmax(-1) == ids).sum())
    return right / samples


def run(out: str | Path = "runs/bench", kinds=KINDS, lengths=LENGTHS, depths=DEPTHS, width: int = 32,
        n_needles: int = 8, steps: int = 300, train_len: int = 256, samples: int = 16, seed: int = 0) -> dict:
    task = _Task(width, n_needles, seed)
    results = {}
    for kind in kinds:
        t0 = time.time()
        bridge, head, loss = _train(kind, task, width, steps, train_len, seed)
        train_acc = _accuracy(bridge, head, task, train_len, 0.5, samples, seed + 7)
        grid = [[_accuracy(bridge, head, task, n, d, samples, seed + 11) for d in depths] for n in lengths]
        results[kind] = {"final_train_loss": loss, "acc_at_train_length_mid_depth": train_acc, "accuracy": grid,
                         "seconds": time.time() - t0}
        print(f"\n{kind} (trained {steps} steps at N = {train_len}: loss {loss:.3f}, mid-depth acc {train_acc:.2f}; "
              f"chance {1 / n_needles:.3f})")
        print("N \\ depth " + " ".join(f"{d:>6.0%}" for d in depths))
        for n, row in zip(lengths, grid):
            print(f"{n:>9,d} " + " ".join(f"{a:6.2f}" for a in row))
    result = {"benchmark": "needle", "width": width, "n_needles": n_needles, "chance": 1 / n_needles,
              "train_steps": steps, "train_length": train_len, "samples_per_cell": samples,
              "lengths": list(lengths), "depths": list(depths), "readout": "last output token",
              "bridges": results, "paper": "LIA-MTR retrieval 1.0 at every depth up to 16K"}
    _plot(result, Path(out) / "needle.png")
    write_result(out, "needle", result)
    return result


def _plot(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_heatmaps({k: v["accuracy"] for k, v in result["bridges"].items()}, [f"{d:.0%}" for d in result["depths"]],
                  [f"{n // 1024}K" for n in result["lengths"]], path,
                  f"needle accuracy (last-token read-out; chance {result['chance']:.2f})")
