"""``keepsight bench needle``: needle in a haystack for the bridges alone; ``keepsight bench needle-model``: the
same haystacks through a bridge *and* a small language model that answers which needle it saw.

A haystack of N random patch features (standard normal, width d) hides one needle: one of K fixed random
vectors, at a depth from 0% (the first patch) to 100% (the last). Each bridge plus a linear read-out of
its *last* output token is trained on short sequences (random depths) to name the needle; then accuracy is
measured at lengths 1K..16K and five depths (chance = 1/K). The last token is where a causal bridge must
carry the needle to: this measures what the bridge's state retains, not what a language model reading
every bridge output could find (that would be trivial for any per-patch projector). Heatmaps as PNG.
LIA-MTR runs in each of its readings (``lia_mtr``: geometric lambda spacing, channel gate; ``lia_mtr:half_life``,
``lia_mtr:token`` and ``lia_mtr:half_life+token``: see ``LiaMtrConfig``).

The whole-model needle (``run_model``) puts the haystack's bridge outputs into a tiny Qwen3 language model
(``Qwen3ForCausalLM`` from a config, as the world's models) followed by a question token; the model's next-token
logits over the K needle tokens name the needle. Bridge and language model train together briefly at one
length (random depths), then are scored at longer lengths and fixed depths: this is what a VLM would get out of
the bridge, attention over every output included.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from ..bridge import build_bridge
from ..report.plots import plot_heatmaps
from . import write_result

READINGS = {"lia_mtr": {}, "lia_mtr:half_life": {"lambda_spacing": "half_life"}, "lia_mtr:token": {"gate": "token"},
            "lia_mtr:half_life+token": {"lambda_spacing": "half_life", "gate": "token"}}
KINDS = (*READINGS, "linear_attention", "attention_sdpa", "mlp")
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


def _bridge(kind: str, d_vision: int, d_model: int) -> nn.Module:
    if kind in READINGS:
        return build_bridge("lia_mtr", d_vision=d_vision, d_model=d_model, **READINGS[kind])
    return build_bridge(kind, d_vision=d_vision, d_model=d_model)


def _train(kind: str, task: _Task, width: int, steps: int, train_len: int, seed: int):
    torch.manual_seed(seed)
    bridge = _bridge(kind, width, width)
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


# ----------------------------------------------------------------------------- the whole-model needle

MODEL_KINDS = ("lia_mtr", "lia_mtr:half_life+token", "mlp")
MODEL_LENGTHS = (256, 1024, 4096)


class NeedleVLM(nn.Module):
    """bridge(haystack) + a question token -> a tiny Qwen3 LM; logits over the K needle tokens at the last position."""

    def __init__(self, kind: str, width: int, n_needles: int, hidden: int = 64, layers: int = 2, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.bridge = _bridge(kind, width, hidden)
        cfg = Qwen3Config(vocab_size=n_needles + 1, hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                          max_position_embeddings=max(MODEL_LENGTHS) * 2, tie_word_embeddings=True)
        self.lm = Qwen3ForCausalLM(cfg)
        self.question = n_needles  # the question token's id; needles are ids 0 .. K-1
        self.k = n_needles

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [B, N, d] -> [B, K]
        v = self.bridge(x)  # [B, N, hidden]
        q = self.lm.get_input_embeddings()(torch.full((x.shape[0], 1), self.question, dtype=torch.long))
        logits = self.lm(inputs_embeds=torch.cat([v, q], 1)).logits  # [B, N + 1, K + 1]
        return logits[:, -1, : self.k]


def run_model(out: str | Path = "runs/bench", kinds=MODEL_KINDS, lengths=MODEL_LENGTHS, depths=DEPTHS,
              width: int = 32, n_needles: int = 8, steps: int = 400, train_len: int = 256, samples: int = 16,
              batch: int = 16, seed: int = 0) -> dict:
    task = _Task(width, n_needles, seed)
    results = {}
    for kind in kinds:
        t0 = time.time()
        model = NeedleVLM(kind, width, n_needles, seed=seed)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
        g = torch.Generator().manual_seed(seed + 1)
        loss = torch.tensor(0.0)
        model.train()
        for _ in range(steps):
            x, ids = task.batch(batch, train_len, None, g)
            loss = nn.functional.cross_entropy(model(x), ids)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        grid = [[_model_accuracy(model, task, n, d, samples, seed + 11) for d in depths] for n in lengths]
        results[kind] = {"final_train_loss": float(loss.detach()), "accuracy": grid, "seconds": time.time() - t0}
        print(f"\n{kind} + tiny LM (trained {steps} steps at N = {train_len}: loss "
              f"{results[kind]['final_train_loss']:.3f}; chance {1 / n_needles:.3f})")
        print("N \\ depth " + " ".join(f"{d:>6.0%}" for d in depths))
        for n, row in zip(lengths, grid):
            print(f"{n:>9,d} " + " ".join(f"{a:6.2f}" for a in row))
    result = {"benchmark": "needle-model", "width": width, "n_needles": n_needles, "chance": 1 / n_needles,
              "train_steps": steps, "train_length": train_len, "samples_per_cell": samples,
              "lengths": list(lengths), "depths": list(depths), "readout": "a 2-layer Qwen3 LM over every output",
              "bridges": results}
    path = Path(out) / "needle_model.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_heatmaps({k: v["accuracy"] for k, v in results.items()}, [f"{d:.0%}" for d in depths],
                  [f"{n}" for n in lengths], path, f"needle accuracy, bridge + tiny LM (chance {1 / n_needles:.2f})")
    write_result(out, "needle_model", result)
    return result


@torch.inference_mode()
def _model_accuracy(model: NeedleVLM, task: _Task, n: int, depth: float, samples: int, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    right = 0
    for i in range(0, samples, 8):
        x, ids = task.batch(min(8, samples - i), n, depth, g)
        right += int((model(x).argmax(-1) == ids).sum())
    return right / samples
