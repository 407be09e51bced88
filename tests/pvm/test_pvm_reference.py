"""Parity with the authors' released PVM code, run under its own transformers (4.57) by
``scripts/reference/pvm_released.py`` on a tiny Qwen3-VL built from keepsight's ``tiny-qwen3vl`` preset: keepsight
(transformers 5, the released block attached to the library's own Qwen3-VL class) must compute the same logits (to
1e-4) and the same greedy tokens on the same left-padded batch of two images with different numbers of visual
tokens, from the same weights."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from keepsight.pvm import PVMConfig, attach_pvm, pvm_memory
from keepsight.pvm.layout import BLOCK_KEY
from keepsight.world.models import build_model
from keepsight.world.processor import build_processor

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "pvm"


def state_digest(state: dict) -> str:
    """The generator's digest of a state dict (names and bytes, in name order)."""
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def reference():
    meta = json.loads((FIXTURES / "meta.json").read_text())
    return meta, load_file(FIXTURES / "inputs.safetensors"), load_file(FIXTURES / "outputs.safetensors"), \
        load_file(FIXTURES / "pvm_blocks.safetensors")


@pytest.fixture(scope="module")
def model(reference):
    """keepsight's tiny Qwen3-VL (the same weights the reference loaded: checked by digest) with the released blocks
    of the fixture attached."""
    meta, _, _, blocks = reference
    m = build_model("tiny-qwen3vl", build_processor().tokenizer, seed=0)
    m.config._attn_implementation = "eager"
    m.config.text_config._attn_implementation = "eager"
    m.config.vision_config._attn_implementation = "eager"
    assert state_digest(m.state_dict()) == meta["base_digest"], "the tiny base no longer builds the weights the " \
        "reference ran on: regenerate the fixtures (scripts/reference/pvm_released.py)"
    attach_pvm(m, PVMConfig(layers=meta["pvm_layers"], pvm_hidden_size=meta["pvm_hidden_size"]))
    ours = dict(m.named_parameters())
    with torch.no_grad():
        for key, value in blocks.items():
            layer, rest = BLOCK_KEY.search(key).groups()
            ours[f"pvm.{layer}.{rest}"].copy_(value)
    assert len(blocks) == sum(1 for n in ours if n.startswith("pvm."))
    return m.eval()


def _inputs(inputs):
    return {k: inputs[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw",
                                   "mm_token_type_ids")}


def test_the_fixture_is_the_case_the_test_claims(reference):
    meta, inputs, _, _ = reference
    assert meta["transformers"].startswith("4.57") and meta["reference_commit"].startswith("8d784fe")
    counts = meta["visual_tokens"]
    assert len(counts) == 2 and counts[0] != counts[1]
    assert int(inputs["attention_mask"][:, 0].min()) == 0  # left padding in the batch


def test_backbone_alone_matches_the_reference(reference, model):
    """With every gate at 0 both sides are the plain Qwen3-VL: separates a backbone difference (transformers 4.57 vs
    5) from a PVM one."""
    _, inputs, outputs, _ = reference
    gates = {k: b.gate_alpha.detach().clone() for k, b in model.pvm.items()}
    try:
        with torch.no_grad():
            for b in model.pvm.values():
                b.gate_alpha.zero_()
            logits = model(**_inputs(inputs)).logits
    finally:
        with torch.no_grad():
            for k, b in model.pvm.items():
                b.gate_alpha.copy_(gates[k])
    mask = inputs["attention_mask"].bool()
    torch.testing.assert_close(logits[mask], outputs["base_logits"][mask], atol=1e-4, rtol=1e-4)


def test_visual_memory_and_logits_match_the_released_code(reference, model):
    _, inputs, outputs, _ = reference
    with torch.no_grad():
        out = model(**_inputs(inputs), use_cache=True)
    memory = pvm_memory(out.past_key_values)
    counts = memory.visual_mask.sum(1)
    ref_mask = outputs["visual_mask"][:, 0, 0] == 0  # the released mask: 0 on real keys, the dtype's min on padding
    assert torch.equal(memory.visual_mask, ref_mask) and counts.tolist() == ref_mask.sum(1).tolist()
    torch.testing.assert_close(memory.visual[memory.visual_mask], outputs["visual_context"][ref_mask], atol=1e-6,
                               rtol=1e-6)
    mask = inputs["attention_mask"].bool()  # the padded positions' logits are not compared (no one reads them)
    diff = (out.logits[mask] - outputs["logits"][mask]).abs().max()
    assert (outputs["logits"][mask] - outputs["base_logits"][mask]).abs().max() > 100 * max(float(diff), 1e-5), \
        "the blocks must change the logits far more than the two sides differ"
    torch.testing.assert_close(out.logits[mask], outputs["logits"][mask], atol=1e-4, rtol=1e-4)


def test_greedy_tokens_match_the_released_code(reference, model):
    meta, inputs, outputs, _ = reference
    tokens = model.generate(**_inputs(inputs), max_new_tokens=meta["new_tokens"], min_new_tokens=meta["new_tokens"],
                            do_sample=False)
    assert torch.equal(tokens, outputs["tokens"])
