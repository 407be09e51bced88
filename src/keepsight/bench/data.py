"""``keepsight bench data``: a user's dataset at scale. A synthetic LLaVA-format JSON of ``rows`` rows (multi-turn
chats about small images, a pool of image files shared between rows) is written once; then

- building the dataset index (``open_dataset``): seconds, and peak Python memory while it is built (tracemalloc)
  next to the JSON's size on disk (goal: under 10 s and 1 GiB for 100,000 rows);
- the pre-flight pass over every row (image headers read, not decoded): rows/s;
- rows/s through ``dataset[i]`` + ``VLMCollator`` (tokenisation, image processing, labels) in batches of
  ``batch``, against the tiny preset's forward + backward on the same batches (goal: the collator faster).
"""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..data import VLMCollator, open_dataset, preflight
from ..world.models import build_model, get_preset, preset_processor
from ..world.texts import CAPTION_PROMPT
from . import write_result

WORDS = ("red", "blue", "green", "circle", "square", "star", "left", "right", "top", "bottom", "a", "the", "is",
         "there", "at", "of", "and", "two", "three", "objects", "scene", ".", "?")


def write_fixture(root: Path, rows: int, pool: int = 256, seed: int = 0) -> Path:
    """``rows`` LLaVA rows (1 to 3 turns, ~12-word answers) over ``pool`` 64x64 PNGs; returns the JSON path."""
    rng = np.random.default_rng(seed)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    for k in range(pool):
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(images / f"{k:04d}.png")

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS, n))

    out = []
    for i in range(rows):
        turns = [{"from": "human", "value": f"<image>\n{CAPTION_PROMPT}"}, {"from": "gpt", "value": words(12)}]
        for _ in range(int(rng.integers(0, 3))):
            turns += [{"from": "human", "value": words(6) + " ?"}, {"from": "gpt", "value": words(8)}]
        out.append({"id": f"r{i}", "image": f"images/{int(rng.integers(pool)):04d}.png", "conversations": turns})
    path = root / "data.json"
    path.write_text(json.dumps(out))
    return path


def run(out: str | Path, rows: int = 100_000, batch: int = 16, batches: int = 20, preset: str = "tiny-llava") -> dict:
    if rows < batch:
        raise ValueError(f"--rows {rows} is fewer than one batch (--batch {batch}): the collator and the step are "
                         "timed on whole batches")
    batches = min(batches, rows // batch)
    out = Path(out)
    root = out / "data-fixture"
    path = root / "data.json"
    if not path.is_file() or len(json.loads(path.read_text())) != rows:
        t0 = time.perf_counter()
        write_fixture(root, rows)
        print(f"wrote a {rows:,d}-row fixture in {time.perf_counter() - t0:.1f} s")
    size_mib = path.stat().st_size / 2**20

    tracemalloc.start()
    t0 = time.perf_counter()
    ds = open_dataset(path)
    build_s = time.perf_counter() - t0
    peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()

    t0 = time.perf_counter()
    ds, report = preflight(ds)
    preflight_s = time.perf_counter() - t0

    p = get_preset(preset)
    processor = preset_processor(p)
    collate = VLMCollator(processor)
    model = build_model(p, processor.tokenizer, seed=0)
    order = np.random.default_rng(1).permutation(len(ds))[: batch * batches]
    collate_s = forward_s = 0.0
    for b in range(batches):
        idx = order[b * batch : (b + 1) * batch]
        t0 = time.perf_counter()
        enc = collate([ds[int(i)] for i in idx])
        collate_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        loss = model(**enc).loss
        loss.backward()
        forward_s += time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
    n = batch * batches
    result = {
        "rows": rows, "json_mib": size_mib, "build_s": build_s, "build_peak_mib": peak_mib,
        "preflight_rows_per_s": rows / preflight_s, "preflight": report.line(),
        "collate_rows_per_s": n / collate_s, "train_step_rows_per_s": n / forward_s, "batch": batch,
        "preset": preset, "threads": torch.get_num_threads(),
        "goals": {"build_under_10s": build_s < 10, "memory_under_1gib": peak_mib < 1024,
                  "collator_faster_than_step": collate_s < forward_s},
    }
    print(f"{'':<34}{'value':>12}  goal")
    print(f"{'index build (s)':<34}{build_s:>12.2f}  < 10")
    print(f"{'peak memory while building (MiB)':<34}{peak_mib:>12.0f}  < 1024   (JSON {size_mib:.0f} MiB)")
    print(f"{'pre-flight (rows/s)':<34}{rows / preflight_s:>12,.0f}")
    print(f"{'dataset + collator (rows/s)':<34}{n / collate_s:>12,.0f}  > the step")
    print(f"{'tiny forward + backward (rows/s)':<34}{n / forward_s:>12,.0f}")
    write_result(out, "data", result)
    return result
