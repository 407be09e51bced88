"""Parity fixtures for LaViDa as its authors release it (github.com/jacklishufan/LaViDa): runs the release's own model
class, image pipeline, prompt tokenization and sampler under its transformers (4.50.3) on keepsight's tiny LaViDa,
written in the released layout, and writes what they computed to ``tests/fixtures/reference/lavida/`` for
``tests/models/test_lavida_reference.py``.

    python scripts/reference/lavida_released.py --lavida /path/to/LaViDa

``--lavida``: a checkout (or bare clone) of github.com/jacklishufan/LaViDa. The files the release's LaViDa path needs
(``llava/model/llava_arch.py``, ``llava/model/language_model/llava_llada.py``, ``llava/model/language_model/llada/``,
``llava/model/multimodal_encoder/{builder,siglip_encoder}.py``, the projector and resampler builders,
``llava/mm_utils.py``, ``llava/constants.py``, ``llava/conversation.py``, ``llava/utils.py``) are read where they lie
and extracted to a temporary directory, never copied into the project.

Two processes. This one (keepsight's environment) builds the tiny LaViDa (``keepsight.world.models.build_lavida``,
seed 0: a 3-layer SigLIP at 56 px views of 7 x 7 patches, a 4-layer LLaDA of width 128) and writes it in the released
layout (``official_lavida_files``: ``config.json`` of ``llava_llada`` with OLMo-style fields and ``mm_*``, the
release's weight names, ``siglip-tower/config.json`` one layer deeper than the weights), four seeded random-pixel
images of (width, height) ``SIZES`` and keepsight's prompt (``render_prompt`` of ``QUESTION`` with an image). A
second environment, ``.venv-reference/lavida`` (created on first use: torch 2.13.0, transformers 4.50.3 and Pillow
from the package index; never installed into keepsight's), builds the release's ``LlavaLladaForMaskedDiffusion`` from
that ``config.json`` (its SigLIP tower loaded from the tower directory by the release's ``load_model``, which drops
the last layer and the head), loads the tiny weights strictly, and records per image: the views of
``process_images``, the prompt ids of ``tokenizer_image_token``, each view's pooled features
(``get_2dPool``), the packed image features ``prepare_inputs_labels_for_multimodal`` splices in, the logits of one
forward of the prompt and ``GEN`` mask slots, and the release's ``generate`` (``GEN`` slots, one block, one slot a
step, temperature 0; every step's slots) with ``prefix_lm`` False and True, plus the first Prefix-DLM step's logits;
and as ``predict.py`` calls it (Prefix-DLM, ``step_ratio`` 0.5, ``schedule="shift"``, shift 3 and the COCO
evaluation's 0.33) on ``SHIFT_GEN`` slots. Besides, the release's slots per step (``get_num_transfer_tokens_sch``)
for the ``SCHEDULES`` cases.

What had to be adapted for a tiny tower (each is a constant of SigLIP so400m in the release, not a computation; all
recorded in ``meta.json``): the tower object reports the geometry of a default ``SigLipVisionConfig()`` (so400m: 384
px, 27 x 27 patches) whatever it loaded, so it is given the loaded tower's config; its image processor is
``SigLipImageProcessor()`` at 384 px, so it is made at the tiny view size; ``SigLipVisionTower.forward`` asserts 729
tokens a view, patched to the tower's patch count. The tower directory gets a SigLIP checkpoint one layer deeper
(seeded filler made with the release's own ``SigLipVisionModel``) for ``load_model`` to load and cut; the LaViDa
weights then overwrite every kept parameter. The model is cast to fp32 before loading (``LlavaLladaModel`` makes
``image_newline`` in bf16). The tokenizer keepsight writes is transformers 5's format, which 4.50 cannot name, so it
is loaded as a ``PreTrainedTokenizerFast`` from its ``tokenizer.json`` with the special tokens and chat template of
the directory. Stand-ins: DeepSpeed (activation checkpointing: called directly), ``accelerate.utils.reduce``, the
package ``__init__``s that import every language model, the other vision encoders and the perceiver resampler
(einops): none of them is on LaViDa's path. Everything is fp32 on the CPU; reruns write identical files.
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
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ensure_venv, git_commit, read_source, state_digest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "lavida"
VENV = ROOT / ".venv-reference" / "lavida"
PINS = ("torch==2.13.0", "transformers==4.50.3", "safetensors", "numpy", "pillow==13.0.0")
SIZES = ((56, 56), (112, 40), (30, 90), (200, 200))  # (width, height): square, wide, tall, large
QUESTION = "describe the scene ."
GEN = BLOCK = 8  # slots, one block, one slot a step (the release's steps = max_new_tokens)
# the release's noise schedules of slots per step (get_num_transfer_tokens_sch): name -> (slots, steps, schedule, shift)
SCHEDULES = {"shift3_16_8": (16, 8, "shift", 3.0), "shift033_16_8": (16, 8, "shift", 0.33),
             "shift3_64_32": (64, 32, "shift", 3.0), "shift033_64_32": (64, 32, "shift", 0.33),
             "shift3_37_11": (37, 11, "shift", 3.0), "logit_normal_64_32": (64, 32, "logit_normal", 3.0),
             "cosine_64_32": (64, 32, "cosine", 3.0), "cosine_37_11": (37, 11, "cosine", 3.0),
             "linear_37_11": (37, 11, "linear", 3.0)}
# and its generate on them as predict.py calls it (prefix_lm, step_ratio 0.5, schedule "shift"): 16 slots in 8 steps
SHIFT_GEN, SHIFT_RATIO = 16, 0.5
SEED = 0
TOWER = "siglip-tower"  # official_lavida_files' tower directory (OFFICIAL_TOWER_DIR)

UPSTREAM = (
    "llava/constants.py", "llava/conversation.py", "llava/mm_utils.py", "llava/utils.py",
    "llava/model/llava_arch.py",
    "llava/model/language_model/llava_llada.py",
    "llava/model/language_model/llada/__init__.py",
    "llava/model/language_model/llada/configuration_llada.py",
    "llava/model/language_model/llada/modeling_llada.py",
    "llava/model/language_model/llada/generate.py",
    "llava/model/language_model/llada/log_likelyhood.py",
    "llava/model/multimodal_encoder/builder.py",
    "llava/model/multimodal_encoder/siglip_encoder.py",
    "llava/model/multimodal_projector/builder.py",
    "llava/model/multimodal_projector/pooler_projector.py",
    "llava/model/multimodal_resampler/builder.py",
    "llava/model/multimodal_resampler/masked_drop.py",
    "llava/model/multimodal_resampler/spatial_pool.py",
    "llava/model/multimodal_resampler/qformer.py",
)


def _unused(*names: str) -> str:
    return "".join(f"class {n}:\n    def __init__(self, *a, **k):\n        raise NotImplementedError('{n} is not on "
                   "LaViDa\\'s path (a stand-in of the parity script)')\n\n\n" for n in names)


# files replaced by stand-ins: package inits that import every language model, encoders and a resampler LaViDa never
# builds (their imports need open_clip, einops, ...)
STANDINS = {
    "llava/__init__.py": "",
    "llava/model/__init__.py": "",
    "llava/model/multimodal_encoder/clip_encoder.py": _unused("CLIPVisionTower", "CLIPVisionTowerS2"),
    "llava/model/multimodal_encoder/imagebind.py": _unused("ImageBindWrapper"),
    "llava/model/multimodal_encoder/open_clip_encoder.py": _unused("OpenCLIPVisionTower"),
    "llava/model/multimodal_encoder/hf_vision.py": _unused("HFVisionTower"),
    "llava/model/multimodal_encoder/mlcd_encoder.py": _unused("MLCDVisionTower", "MLCDVisionTowerS2"),
    "llava/model/multimodal_resampler/perceiver.py": _unused("PerceiverResampler"),
}
# source edits on the extracted copies: (file, old, new, count)
PATCHES = (
    ("llava/model/multimodal_encoder/siglip_encoder.py", "assert image_features.shape[-2] == 729",
     "assert image_features.shape[-2] == self.num_patches", 2),
)
ADAPTATIONS = [
    "SigLipVisionTower.config := the loaded tower's config (the release keeps a default SigLipVisionConfig(): "
    "so400m's 384 px / 27 x 27 patches, whatever it loads)",
    "SigLipVisionTower.image_processor := SigLipImageProcessor(size=(view, view), crop_size=view) (the release's "
    "default is 384)",
    "siglip_encoder.py: 'assert image_features.shape[-2] == 729' -> '== self.num_patches' (2 places)",
    "the tower directory holds a SigLIP one layer deeper (seeded filler, the release's SigLipVisionModel) for "
    "load_model to load and cut; the LaViDa weights overwrite every kept parameter",
    "model.float() before load_state_dict (LlavaLladaModel.dtype = bfloat16 makes image_newline bf16)",
    "tokenizer: PreTrainedTokenizerFast(tokenizer.json) with the directory's special tokens and chat template "
    "(transformers 4.50 cannot name transformers 5's TokenizersBackend); conv_llava_llada's tokenizer := it",
    "mm_vision_tower := the tower directory's absolute path (the written config names it relative to the model)",
    "stand-ins: deepspeed.checkpointing.checkpoint (called directly), accelerate.utils.reduce, llava/__init__.py "
    "and llava/model/__init__.py (empty), other vision encoders and the perceiver resampler; "
    "AutoTokenizer.from_pretrained -> None while conversation.py imports (it loads hub tokenizers, offline here)",
]


def sample_images():
    """The test images: seeded random pixels (PIL, RGB) of (width, height) ``SIZES``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(SEED)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB") for w, h in SIZES]


def image_digest(image) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()[:16]


# ----------------------------------------------------------------------------- keepsight's side


def setup(work: Path) -> dict:
    import torch

    from keepsight.data import Sample, render_prompt
    from keepsight.world.models import LAVIDA_TINY_VIEW, build_lavida, official_lavida_files

    model, processor = build_lavida(seed=SEED)
    official_lavida_files(model, processor.tokenizer, work / "lavida")
    images = sample_images()
    (work / "images").mkdir()
    for i, image in enumerate(images):
        image.save(work / "images" / f"{i}.png")
    prompt = render_prompt(processor, Sample.single_turn(QUESTION, image=images[0]))
    assert all(render_prompt(processor, Sample.single_turn(QUESTION, image=im)) == prompt for im in images)
    setting = {"prompt": prompt, "question": QUESTION, "view": LAVIDA_TINY_VIEW, "sizes": [list(s) for s in SIZES],
               "mask_token_id": int(model.config.text_config.mask_token_id), "gen_length": GEN,
               "block_length": BLOCK, "steps": GEN, "shift_gen_length": SHIFT_GEN, "shift_step_ratio": SHIFT_RATIO,
               "schedules": {k: list(v) for k, v in SCHEDULES.items()}}
    (work / "setting.json").write_text(json.dumps(setting))
    return {**setting, "state_digest": state_digest(model.state_dict()),
            "image_digests": [image_digest(im) for im in images], "torch_threads": torch.get_num_threads()}


def extract(repo: Path, src: Path) -> None:
    for rel in UPSTREAM:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(read_source(repo, rel))
    for rel, text in STANDINS.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    for rel, old, new, count in PATCHES:
        text = (src / rel).read_text()
        assert text.count(old) == count, f"{rel}: expected {count} x {old!r}, found {text.count(old)}"
        (src / rel).write_text(text.replace(old, new))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lavida", required=True, help="a checkout or bare clone of github.com/jacklishufan/LaViDa")
    ap.add_argument("--lavida-commit", help="the LaViDa commit, when --lavida is not a git checkout")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return run_reference(Path(args.inner))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        extract(Path(args.lavida), work / "src")
        meta = setup(work)
        meta["reference_commits"] = {"LaViDa": git_commit(args.lavida) or args.lavida_commit}
        python = ensure_venv(VENV, PINS)
        env = {**os.environ, "OMP_NUM_THREADS": str(meta["torch_threads"]), "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1"}
        for key in ("NOT_ALWASY_DO_2DPOOL", "DEBUG_FIX_PADDING", "USE_FLEX_ATTENTION"):  # the release's defaults
            env.pop(key, None)
        subprocess.run([str(python), __file__, "--lavida", args.lavida, "--inner", str(work)], check=True, env=env)
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / "outputs.safetensors").write_bytes((work / "outputs.safetensors").read_bytes())
        meta.update(json.loads((work / "reference.json").read_text()))
        meta.pop("torch_threads")
        (FIXTURES / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {FIXTURES}")


# ----------------------------------------------------------------------------- the reference's side


def load_release(src: Path):
    """The release's modules, imported as the ``llava`` package they are written as, with stand-ins for DeepSpeed
    (activation checkpointing) and ``accelerate.utils.reduce``."""
    import transformers.generation.utils  # noqa: F401  (before the stand-ins: transformers probes for them)
    import transformers.modeling_utils  # noqa: F401
    from transformers import AutoTokenizer

    deepspeed = types.ModuleType("deepspeed")
    deepspeed.checkpointing = types.SimpleNamespace(checkpoint=lambda f, *a, **k: f(*a, **k))
    sys.modules["deepspeed"] = deepspeed
    accelerate = types.ModuleType("accelerate")
    accelerate.utils = types.ModuleType("accelerate.utils")
    accelerate.utils.reduce = lambda x, *a, **k: x
    sys.modules.update({"accelerate": accelerate, "accelerate.utils": accelerate.utils})
    sys.path.insert(0, str(src))
    names = ("llava.constants", "llava.mm_utils", "llava.model.llava_arch",
             "llava.model.language_model.llava_llada", "llava.model.language_model.llada.generate",
             "llava.model.multimodal_encoder.siglip_encoder")
    mods = {n.rsplit(".", 1)[-1]: importlib.import_module(n) for n in names}
    # conversation.py loads hub tokenizers for its templates at import (some without its own try / except): offline,
    # each is None; the LLaDA template gets the tiny tokenizer below
    from_pretrained = AutoTokenizer.from_pretrained
    AutoTokenizer.from_pretrained = lambda *a, **k: None
    try:
        mods["conversation"] = importlib.import_module("llava.conversation")
    finally:
        AutoTokenizer.from_pretrained = from_pretrained
    assert Path(mods["llava_llada"].__file__).is_relative_to(src)
    return mods


def release_tokenizer(directory: Path):
    from transformers import PreTrainedTokenizerFast

    cfg = json.loads((directory / "tokenizer_config.json").read_text())
    special = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token") if k in cfg}
    tok = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), **special,
                                  additional_special_tokens=cfg.get("extra_special_tokens", []))
    tok.chat_template = (directory / "chat_template.jinja").read_text()
    return tok


def run_reference(work: Path) -> None:
    import copy

    import PIL
    import torch
    import transformers
    from PIL import Image
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    torch.manual_seed(SEED)
    mods = load_release(work / "src")
    siglip, llada, arch = mods["siglip_encoder"], mods["llava_llada"], mods["llava_arch"]
    assert arch.ALWASY_DO_2DPOOL, "LaViDa pools every view unless NOT_ALWASY_DO_2DPOOL is set"
    setting = json.loads((work / "setting.json").read_text())
    view, mask_id = setting["view"], setting["mask_token_id"]
    directory = work / "lavida"
    tower_dir = directory / TOWER

    # the tower directory as load_model reads it: a SigLIP one layer deeper than the weights (filler, overwritten)
    filler = siglip.SigLipVisionModel(siglip.SigLipVisionConfig.from_pretrained(str(tower_dir)))
    filler.save_pretrained(str(tower_dir))
    raw = json.loads((directory / "config.json").read_text())
    config = llada.LlavaLladaConfig.from_dict({**raw, "mm_vision_tower": str(tower_dir)})
    model = llada.LlavaLladaForMaskedDiffusion(config)
    tower = model.get_vision_tower()
    assert type(tower) is siglip.SigLipVisionTower and tower.is_loaded
    tower.config = tower.vision_tower.config
    tower.image_processor = siglip.SigLipImageProcessor(size=(view, view), crop_size={"height": view, "width": view})
    model = model.float().eval()
    state = load_file(str(directory / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    kept_layers = len(tower.vision_tower.vision_model.encoder.layers)
    model.load_state_dict(state, strict=True)  # the report above names any key that does not match
    inner = model.get_model()
    tok = release_tokenizer(directory)

    # the prompt, as the release's conversation renders it (conv_templates["llada"], predict.py's question form)
    conv = copy.deepcopy(mods["conversation"].conv_templates["llada"])
    conv.tokenizer = tok
    conv.append_message(conv.roles[0], mods["constants"].DEFAULT_IMAGE_TOKEN + "\n" + setting["question"])
    conv.append_message(conv.roles[1], None)
    release_prompt = conv.get_prompt()
    ids = mods["mm_utils"].tokenizer_image_token(setting["prompt"], tok, mods["constants"].IMAGE_TOKEN_INDEX,
                                                 return_tensors="pt").unsqueeze(0)

    seen = {}
    get_2dpool = model.get_2dPool

    def recording_pool(feature, *a, **k):
        out = get_2dpool(feature, *a, **k)
        seen["pooled"] = out.detach().clone()
        return out

    model.get_2dPool = recording_pool
    out, per_image = {"prompt_ids": ids[0]}, []
    for i in range(len(setting["sizes"])):
        image = Image.open(work / "images" / f"{i}.png").convert("RGB")
        assert list(image.size) == setting["sizes"][i]
        views = mods["mm_utils"].process_images([image], tower.image_processor, model.config)  # [1, V, 3, s, s]
        images = [v for v in views]  # predict.py: a list of per-image view stacks (the pooled path)
        with torch.no_grad():
            _, pos, am, _, embeds, _ = model.prepare_inputs_labels_for_multimodal(
                ids, None, None, None, None, images, ["image"], image_sizes=[image.size])
            assert pos is None and am is None
            start = int((ids[0] == mods["constants"].IMAGE_TOKEN_INDEX).nonzero()[0, 0])
            n_image = embeds.shape[1] - (ids.shape[1] - 1)
            # one forward of the prompt and GEN mask slots, as the release's generate builds its first step
            x = torch.cat([torch.zeros(1, embeds.shape[1], dtype=torch.long), torch.full((1, GEN), mask_id)], 1)
            e = inner.transformer.wte(x)
            e[:, :embeds.shape[1]] = embeds
            logits = inner(None, input_embeddings=e).logits[0]
            # the first Prefix-DLM step: the prompt's keys from a forward over the prompt alone, the slots on them
            past = inner(None, input_embeddings=embeds, use_cache=True).attn_key_values
            prefix_logits = inner(None, input_embeddings=inner.transformer.wte(x[:, -GEN:]),
                                  past_key_values=past).logits[0]
            runs = {}
            for name, prefix_lm in (("plain", False), ("prefix", True)):
                final, history = model.generate(ids, images=images, image_sizes=[image.size], modalities=["image"],
                                                max_new_tokens=GEN, block_length=BLOCK, temperature=0.0,
                                                prefix_lm=prefix_lm, mask_id=mask_id, verbose=True)
                runs[name] = torch.stack([h[0, -GEN:] for h in history])  # [steps, GEN]: the slots after each step
                assert torch.equal(runs[name][-1], final[0, -GEN:])
            for name, shift in (("shift3", 3.0), ("shift033", 0.33)):
                final, history = model.generate(ids, images=images, image_sizes=[image.size], modalities=["image"],
                                                max_new_tokens=SHIFT_GEN, block_length=SHIFT_GEN, temperature=0.0,
                                                prefix_lm=True, mask_id=mask_id, verbose=True, step_ratio=SHIFT_RATIO,
                                                schedule="shift", schedule_kwargs={"shift": shift})
                runs[name] = torch.stack([h[0, -SHIFT_GEN:] for h in history])  # [steps, SHIFT_GEN]
                assert torch.equal(runs[name][-1], final[0, -SHIFT_GEN:])
        out.update({f"views_{i}": views[0], f"pooled_{i}": seen["pooled"],
                    f"features_{i}": embeds[0, start:start + n_image], f"logits_{i}": logits,
                    f"prefix_logits_{i}": prefix_logits, f"plain_steps_{i}": runs["plain"],
                    f"prefix_steps_{i}": runs["prefix"], f"shift3_steps_{i}": runs["shift3"],
                    f"shift033_steps_{i}": runs["shift033"]})
        best = mods["mm_utils"].select_best_resolution(image.size, model.config.image_grid_pinpoints)
        per_image.append({"size": list(image.size), "views": int(views.shape[1]), "image_tokens": int(n_image),
                          "best_resolution_width_height": list(best),
                          "plain_tokens": runs["plain"][-1].tolist(), "prefix_tokens": runs["prefix"][-1].tolist()})
    for name, (n, steps, schedule, shift) in SCHEDULES.items():
        out[f"transfer_{name}"] = mods["generate"].get_num_transfer_tokens_sch(
            torch.ones(1, n, dtype=torch.bool), steps, schedule=schedule, schedule_kwargs={"shift": shift})[0]
    save_file({k: v.contiguous() for k, v in out.items()}, str(work / "outputs.safetensors"))
    (work / "reference.json").write_text(json.dumps({
        "reference": "github.com/jacklishufan/LaViDa (llava/model/llava_arch.py, "
                     "llava/model/language_model/llava_llada.py, llava/model/language_model/llada/, "
                     "llava/model/multimodal_encoder/siglip_encoder.py, llava/mm_utils.py, llava/conversation.py)",
        "transformers": transformers.__version__, "torch": torch.__version__, "pillow": PIL.__version__,
        "adaptations": ADAPTATIONS, "missing_keys": sorted(missing), "unexpected_keys": sorted(unexpected),
        "tower_layers_kept": kept_layers, "release_prompt": release_prompt,
        "image_token_index": mods["constants"].IMAGE_TOKEN_INDEX, "images": per_image,
        "spatial_pool_mode": model.config.mm_spatial_pool_mode, "image_aspect_ratio": model.config.image_aspect_ratio,
        "mm_patch_merge_type": model.config.mm_patch_merge_type,
        "image_grid_pinpoints": model.config.image_grid_pinpoints,
    }, indent=1))


if __name__ == "__main__":
    main()
