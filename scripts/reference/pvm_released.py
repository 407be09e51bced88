"""Parity fixtures for PVM as released (github.com/huaixuheqing/PVM, commit 8d784fe): runs the authors' modeling file
under its own transformers (4.57) on a tiny Qwen3-VL built from keepsight's config, and writes what it computed to
``tests/fixtures/reference/pvm/`` for ``tests/pvm/test_pvm_reference.py``.

    python scripts/reference/pvm_released.py --reference /path/to/PVM   # a checkout (or bare clone) of huaixuheqing/PVM

Two processes. This one (keepsight's environment) builds the tiny model, its weights and a left-padded batch of two
images with different numbers of visual tokens, and writes them to a work directory. A second environment,
``.venv-reference/pvm`` (created on first use: torch 2.13.0 and transformers 4.57.6 from the package index, never
installed into keepsight's), imports the released ``modeling_qwen3_vl.py`` from the reference checkout (read where
it lies, never copied into the project), builds ``PVMQwen3VLForConditionalGeneration`` with PVM on layers 1 and 2
(pvm_hidden_size 64: 2 query heads over 1 KV head), gives every block seeded random weights with open gates, and
records: the logits of the batch, the logits with the blocks' gates at 0 (the backbone alone), the visual memory
the released code caches, and 6 greedy tokens. Everything is fp32 with eager attention on the CPU; rerunning the
script on the same machine writes identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ensure_venv, git_commit  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "pvm"
VENV = ROOT / ".venv-reference" / "pvm"
PINS = ("torch==2.13.0", "transformers==4.57.6", "safetensors", "numpy", "pillow")
LAYERS, HIDDEN, NEW_TOKENS, SEED = [1, 2], 64, 6, 0


# ----------------------------------------------------------------------------- keepsight's side


def tiny_setup(work: Path) -> dict:
    """The tiny Qwen3-VL (keepsight's ``tiny-qwen3vl`` preset) and the batch, written to ``work``."""
    import torch
    from PIL import Image
    from safetensors.torch import save_file
    from transformers import Qwen2VLImageProcessorPil

    from keepsight.data import chat_example
    from keepsight.world.models import build_model, qwen3vl_inputs
    from keepsight.world.processor import build_processor

    processor = build_processor()
    model = build_model("tiny-qwen3vl", processor.tokenizer, seed=SEED)
    text, vision = model.config.text_config, model.config.vision_config
    rope = text.rope_parameters
    config = {  # explicit fields that mean the same under transformers 4.57 and 5
        "text": dict(vocab_size=text.vocab_size, hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
                     num_hidden_layers=text.num_hidden_layers, num_attention_heads=text.num_attention_heads,
                     num_key_value_heads=text.num_key_value_heads, head_dim=text.head_dim,
                     max_position_embeddings=text.max_position_embeddings, rms_norm_eps=text.rms_norm_eps,
                     hidden_act=text.hidden_act, attention_bias=text.attention_bias, rope_theta=rope["rope_theta"],
                     rope_scaling={"rope_type": "default", "mrope_section": rope["mrope_section"],
                                   "mrope_interleaved": rope.get("mrope_interleaved", True)},
                     tie_word_embeddings=False, initializer_range=text.initializer_range,
                     pad_token_id=text.pad_token_id, bos_token_id=text.bos_token_id, eos_token_id=text.eos_token_id),
        "vision": dict(depth=vision.depth, hidden_size=vision.hidden_size, hidden_act=vision.hidden_act,
                       intermediate_size=vision.intermediate_size, num_heads=vision.num_heads,
                       in_channels=vision.in_channels, patch_size=vision.patch_size,
                       spatial_merge_size=vision.spatial_merge_size, temporal_patch_size=vision.temporal_patch_size,
                       out_hidden_size=vision.out_hidden_size, num_position_embeddings=vision.num_position_embeddings,
                       deepstack_visual_indexes=list(vision.deepstack_visual_indexes)),
        "top": dict(image_token_id=model.config.image_token_id, video_token_id=model.config.video_token_id,
                    vision_start_token_id=model.config.vision_start_token_id,
                    vision_end_token_id=model.config.vision_end_token_id, tie_word_embeddings=False),
        "pvm": dict(pvm_hidden_size=HIDDEN, pvm_layers=LAYERS),
    }
    images = [Image.new("RGB", (64, 64), (220, 40, 40)), Image.new("RGB", (128, 64), (40, 200, 60))]
    for i, im in enumerate(images):  # some texture, so the visual tokens differ from each other
        px = im.load()
        for x in range(0, im.size[0], 8):
            for y in range(0, im.size[1], 8):
                px[x, y] = ((x * 7 + i * 50) % 256, (y * 11) % 256, (x * y) % 256)
    prompts = ["describe the scene .", "what scene is this ?"]
    texts = [chat_example(processor, p) for p in prompts]
    ip = Qwen2VLImageProcessorPil(min_pixels=64 * 64, max_pixels=128 * 64, patch_size=8, merge_size=2)
    tok = processor.tokenizer
    old, tok.padding_side = tok.padding_side, "left"
    try:
        inputs = qwen3vl_inputs(ip, tok, texts, images)
    finally:
        tok.padding_side = old
    counts = (inputs["input_ids"] == model.config.image_token_id).sum(1).tolist()
    assert counts[0] != counts[1], f"the two images must give different numbers of visual tokens, got {counts}"
    work.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(work / "base.safetensors"))
    save_file({k: inputs[k].contiguous() for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw",
                                                    "mm_token_type_ids")}, str(work / "inputs.safetensors"))
    (work / "config.json").write_text(json.dumps(config, indent=1))
    return {"config": config, "base_digest": state_digest(model.state_dict()), "visual_tokens": counts,
            "torch_threads": torch.get_num_threads()}


def state_digest(state: dict) -> str:
    import torch

    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k].detach().contiguous().cpu()
        h.update(k.encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def reference_tree(path: Path, scratch: Path) -> tuple[Path, str | None]:
    """A directory holding the release's ``modeling_file/`` and the commit it is at: a checkout as it is, or the
    files of a bare clone's HEAD extracted to ``scratch`` (a temporary directory, never the project)."""
    commit = git_commit(path)
    if (path / "modeling_file" / "modeling_qwen3_vl.py").is_file():
        return path, commit
    if commit is None:
        raise SystemExit(f"{path}: neither a checkout nor a clone of huaixuheqing/PVM (no modeling_file/)")
    scratch.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(path), "archive", "HEAD", "modeling_file"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    return scratch, commit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", required=True, help="a checkout of github.com/huaixuheqing/PVM (its modeling_file/)")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return run_reference(Path(args.inner), Path(args.reference))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        reference, commit = reference_tree(Path(args.reference), work / "reference")
        meta = tiny_setup(work)
        meta["reference_commit"] = commit
        python = ensure_venv(VENV, PINS)
        env = {**os.environ, "OMP_NUM_THREADS": str(meta["torch_threads"])}
        subprocess.run([str(python), __file__, "--reference", str(reference), "--inner", str(work)], check=True,
                       env=env)
        FIXTURES.mkdir(parents=True, exist_ok=True)
        for name in ("inputs.safetensors", "outputs.safetensors", "pvm_blocks.safetensors"):
            (FIXTURES / name).write_bytes((work / name).read_bytes())
        meta.update(json.loads((work / "reference.json").read_text()))
        (FIXTURES / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {FIXTURES}")


# ----------------------------------------------------------------------------- the reference's side (transformers 4.57)


def run_reference(work: Path, reference: Path) -> None:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    torch.manual_seed(SEED)
    folder = reference / "modeling_file"
    spec = importlib.util.spec_from_file_location("pvm_release", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["pvm_release"] = package  # the folder as a package, for its relative import of the configuration
    modeling = importlib.import_module("pvm_release.modeling_qwen3_vl")
    configuration = importlib.import_module("pvm_release.configuration_qwen3_vl")
    cfg = json.loads((work / "config.json").read_text())
    config = configuration.PVMQwen3VLConfig(text_config={**cfg["text"], **cfg["pvm"]}, vision_config=cfg["vision"],
                                            **cfg["top"])
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    model = modeling.PVMQwen3VLForConditionalGeneration(config).eval()
    base = load_file(str(work / "base.safetensors"))
    missing, unexpected = model.load_state_dict(base, strict=False)
    assert not unexpected, f"keys the released model does not have: {unexpected[:5]}"
    assert all(".pvm_block." in k for k in missing), f"base weights missing: {[k for k in missing if 'pvm' not in k]}"
    blocks = {}
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():  # seeded random block weights with open gates (the released init is a dead branch)
        for name, p in model.named_parameters():
            if ".pvm_block." not in name:
                continue
            if name.endswith("gate_alpha"):
                p.copy_(torch.tensor([0.8 if ".layers.1." in name else -0.6]))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))
            blocks[name] = p.detach().clone()
    inputs = load_file(str(work / "inputs.safetensors"))
    kw = {k: inputs[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw")}
    with torch.no_grad():
        logits = model(**kw).logits
        visual = model.model.pvm_visual_context_cache.clone()
        visual_mask = model.model.pvm_visual_mask_cache.clone()
        gates = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith("gate_alpha")}
        for n, p in model.named_parameters():
            if n.endswith("gate_alpha"):
                p.zero_()
        base_logits = model(**kw).logits
        for n, p in model.named_parameters():
            if n in gates:
                p.copy_(gates[n])
        model.model.rope_deltas = None
        tokens = model.generate(**kw, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                pad_token_id=cfg["text"]["pad_token_id"])
    save_file({"logits": logits.contiguous(), "base_logits": base_logits.contiguous(), "tokens": tokens.contiguous(),
               "visual_context": visual.contiguous(), "visual_mask": visual_mask.contiguous()},
              str(work / "outputs.safetensors"))
    save_file({k: v.contiguous() for k, v in blocks.items()}, str(work / "pvm_blocks.safetensors"))
    (work / "reference.json").write_text(json.dumps({
        "reference": "github.com/huaixuheqing/PVM modeling_file/modeling_qwen3_vl.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__, "pvm_layers": LAYERS, "pvm_hidden_size": HIDDEN, "new_tokens": NEW_TOKENS}))


if __name__ == "__main__":
    main()
