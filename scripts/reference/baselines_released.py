"""Parity fixtures for VCD, PAI and MemVR as released: runs the authors' code, each under its own transformers, on
a tiny LLaVA-1.5 built from keepsight's ``tiny-llava-1.5`` preset, and writes what it computed to
``tests/fixtures/reference/baselines/`` (``meta.json``, ``inputs.safetensors``, ``vcd.safetensors``,
``pai.safetensors``, ``memvr.safetensors``).

    python scripts/reference/baselines_released.py --vcd PATH --pai PATH --memvr PATH --llava PATH

Each PATH is a checkout or a (bare) clone: ``--vcd`` github.com/DAMO-NLP-SG/VCD (its ``vcd_utils/`` and the
LLaVA it vendors in ``experiments/llava``), ``--pai`` github.com/LALBJ/PAI (``attention.py``, ``CFG.py`` and its
vendored ``llava/``), ``--memvr`` github.com/1zhou-Wang/MemVR (``memvr.py`` and its ``llava_llama.py``),
``--llava`` github.com/haotian-liu/LLaVA at the commit MemVR pins as its ``src/llava`` submodule (c121f04). The
files are extracted to a temporary directory (MemVR's ``llava_llama.py`` replaces LLaVA's there, as MemVR's README
says to do), never copied into the project.

Two kinds of process. This one (keepsight's environment) builds the tiny model (``build_model("tiny-llava-1.5",
build_tokenizer(), seed=0)``, its ``lm_head`` weight times ``LM_HEAD_SCALE`` so the next-token distribution is peaked
enough for the releases' plausibility cuts and MemVR's entropy trigger to act), a world image and the describe
prompt, maps the weights to the original LLaVA layout and writes them to a work directory, and records keepsight's
own greedy logits. One environment per release, ``.venv-reference/{vcd,pai,memvr}`` (created on first use: torch
2.13.0 and the release's transformers, 4.31.0 / 4.37.0 / 4.40.0, from the package index; never installed into
keepsight's), builds the release's own ``LlavaLlamaForCausalLM`` with those weights and runs the release's code with
greedy decoding for ``NEW_TOKENS`` tokens, recording every step's logits as the release computes them:

- VCD: ``vcd_sample.evolve_vcd_sampling`` (it acts only when sampling, so ``do_sample=True, top_k=1``: each token is
  the argmax of the contrasted, cut logits), ``add_diffusion_noise`` at step 500 after ``set_seed(55)`` (the POPE
  script's seed), alpha 1 with beta 0.1 (the eval script's defaults) and 0.2 (the POPE script's);
- PAI: ``llama_modify`` on layers 2..31 with alpha 0.2 and ``CFGLogits`` with gamma 1.1 (the README's command), and
  the attention change alone (``use_cfg`` False, no ``CFGLogits``), eager attention;
- MemVR: ``apply_memvr_llama`` with the scripts' layers 5 / 16, threshold 0.75, ratio 0.12, the per-layer top-10
  entropies each forward computes (read from the released forward's frame) and the layer whose FFN received the
  visual memory; when the released threshold triggers on every forward (or on none) a second threshold is chosen from
  the observed entropies so that some forwards trigger and some do not.

DeCo has no public code; it is not covered. Everything is fp32 on the CPU; rerunning on the same machine writes
identical files. ``--venv-root`` points at another directory of venvs named vcd / pai / memvr (created there if
missing).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import state_digest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "baselines"
VENV_ROOT = ROOT / ".venv-reference"
COMMON_PINS = ("torch==2.13.0", "numpy<2", "safetensors", "pillow", "einops")
# the transformers each release pins: VCD's requirements.txt, PAI's environment.yml, MemVR's README
TRANSFORMERS = {"vcd": "4.31.0", "pai": "4.37.0", "memvr": "4.40.0"}
PRESET, SEED, NEW_TOKENS, LM_HEAD_SCALE = "tiny-llava-1.5", 0, 6, 10.0
WORLD_SEED, WORLD_INDEX = 0, 0
LLAVA_PIN = "c121f0432da27facab705978f83c4ada465e46fd"  # MemVR's src/llava submodule, when --memvr is no git repository
TOWER_DIR = "clip-tower"  # relative to the work directory (the releases test the tower path for "eva" / "intern")

VCD = {"noise_step": 500, "noise_seed": 55,
       "settings": {"released": {"cd_alpha": 1.0, "cd_beta": 0.1}, "pope": {"cd_alpha": 1.0, "cd_beta": 0.2}}}
PAI = {"start_layer": 2, "end_layer": 32,
       "settings": {"cfg": {"use_attn": True, "alpha": 0.2, "use_cfg": True, "gamma": 1.1},
                    "attn": {"use_attn": True, "alpha": 0.2, "use_cfg": False, "gamma": None}}}
MEMVR = {"starting_layer": 5, "ending_layer": 16, "entropy_threshold": 0.75, "retracing_ratio": 0.12}

SOURCES = {  # method -> [(argument, paths in that repository, where they go in the tree)]
    "vcd": [("vcd", ["experiments/llava", "vcd_utils"], "vcd")],
    "pai": [("pai", ["attention.py", "CFG.py", "llava"], "pai")],
    "memvr": [("memvr", ["memvr.py", "llava_llama.py"], "memvr"), ("llava", ["llava"], "llava")],
}


# ----------------------------------------------------------------------------- keepsight's side


def keepsight_model():
    """keepsight's tiny LLaVA-1.5 (seed 0) with its ``lm_head`` scaled; the test rebuilds it the same way."""
    import torch

    from keepsight.world.models import build_model
    from keepsight.world.processor import build_tokenizer

    tok = build_tokenizer()
    model = build_model(PRESET, tok, seed=SEED)
    built = state_digest(model.state_dict())
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    return tok, model, built


def keepsight_inputs():
    """The describe prompt with one world image, through the preset's ``LlavaProcessor``."""
    from keepsight.data import chat_example
    from keepsight.world import generate_scenes, render, world_config
    from keepsight.world.models import preset_processor
    from keepsight.world.texts import DESCRIBE_PROMPT

    proc = preset_processor(PRESET)
    cfg = world_config()
    image = render(generate_scenes(cfg, WORLD_INDEX + 1, seed=WORLD_SEED)[WORLD_INDEX], cfg.noise_std)
    text = chat_example(proc, DESCRIBE_PROMPT)
    return text, proc(text=[text], images=[image], return_tensors="pt")


def original_layout(state: dict) -> dict:
    """transformers-5 ``LlavaForConditionalGeneration`` keys -> the original LLaVA's ``LlavaLlamaForCausalLM``."""
    out = {}
    for k, v in state.items():
        if k.startswith("model.language_model."):
            new = "model." + k[len("model.language_model."):]
        elif k.startswith("model.multi_modal_projector.linear_1."):
            new = "model.mm_projector.0." + k[len("model.multi_modal_projector.linear_1."):]
        elif k.startswith("model.multi_modal_projector.linear_2."):
            new = "model.mm_projector.2." + k[len("model.multi_modal_projector.linear_2."):]
        elif k.startswith("model.vision_tower."):
            rest = k[len("model.vision_tower."):]
            rest = rest[len("vision_model."):] if rest.startswith("vision_model.") else rest
            new = "model.vision_tower.vision_tower.vision_model." + rest
        elif k == "lm_head.weight":
            new = k
        else:
            raise KeyError(f"no original-LLaVA name for {k}")
        out[new] = v.detach().contiguous().clone()
    return out


def setup(work: Path) -> tuple[dict, dict]:
    """The weights, config and inputs in ``work``; keepsight's greedy logits; the meta of keepsight's side."""
    import torch
    from safetensors.torch import save_file

    tok, model, built = keepsight_model()
    text, inputs = keepsight_inputs()
    tc, vc = model.config.text_config, model.config.vision_config
    assert tc.rope_parameters.get("rope_type", "default") == "default" and tc.rope_parameters["rope_theta"] == 10000.0
    assert model.config.vision_feature_layer == -2 and model.config.vision_feature_select_strategy == "default"
    ids = inputs["input_ids"]
    image = (ids[0] == model.config.image_token_id).nonzero().flatten()
    start, n_image = int(image[0]), int(image.numel())
    assert image.tolist() == list(range(start, start + n_image)), "the image tokens must be consecutive"
    reference_ids = torch.cat([ids[:, :start], torch.tensor([[-200]]), ids[:, start + n_image:]], 1)
    uncond_ids = torch.cat([ids[:, :start], ids[:, start + n_image:]], 1)  # PAI's text-only prompt
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    logits = torch.stack(out.logits)[:, 0].float()  # min_new_tokens never binds: compared with the releases' below
    tokens = out.sequences[0, ids.shape[1]:]
    save_file(original_layout(model.state_dict()), str(work / "llava.safetensors"))
    save_file({"input_ids": ids.contiguous(), "attention_mask": inputs["attention_mask"].contiguous(),
               "pixel_values": inputs["pixel_values"].contiguous(), "reference_ids": reference_ids.contiguous(),
               "uncond_ids": uncond_ids.contiguous()}, str(work / "inputs.safetensors"))
    config = {
        "text": dict(vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
                     num_hidden_layers=tc.num_hidden_layers, num_attention_heads=tc.num_attention_heads,
                     num_key_value_heads=tc.num_key_value_heads, max_position_embeddings=tc.max_position_embeddings,
                     rms_norm_eps=tc.rms_norm_eps, hidden_act=tc.hidden_act, rope_theta=10000.0,
                     attention_bias=False, tie_word_embeddings=False, pretraining_tp=1,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        "vision": dict(hidden_size=vc.hidden_size, intermediate_size=vc.intermediate_size,
                       num_hidden_layers=vc.num_hidden_layers, num_attention_heads=vc.num_attention_heads,
                       num_channels=vc.num_channels, image_size=vc.image_size, patch_size=vc.patch_size,
                       hidden_act=vc.hidden_act, layer_norm_eps=vc.layer_norm_eps,
                       projection_dim=vc.projection_dim),
        "mm": dict(mm_hidden_size=vc.hidden_size, mm_projector_type="mlp2x_gelu",
                   mm_vision_select_layer=model.config.vision_feature_layer, mm_vision_select_feature="patch",
                   mm_use_im_start_end=False, mm_use_im_patch_token=False),
        "image_start": start, "image_tokens": n_image, "new_tokens": NEW_TOKENS,
    }
    (work / "config.json").write_text(json.dumps(config, indent=1))
    meta = {
        "preset": PRESET, "seed": SEED, "lm_head_scale": LM_HEAD_SCALE, "built_digest": built,
        "state_digest": state_digest(model.state_dict()), "prompt": text,
        "image": {"world_config": "keepsight.world.world_config()", "seed": WORLD_SEED, "index": WORLD_INDEX},
        "image_token_start": start, "image_tokens": n_image, "new_tokens": NEW_TOKENS,
        "keepsight_tokens": tokens.tolist(), "torch_threads": torch.get_num_threads(),
    }
    return meta, {"logits": logits, "tokens": tokens}


# ----------------------------------------------------------------------------- the sources and environments


def _git(path: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def _is_repository(path: Path) -> bool:
    """Whether ``path`` is a bare clone or the top of a checkout (not merely a directory inside some repository)."""
    if _git(path, "rev-parse", "--is-bare-repository") == "true":
        top = _git(path, "rev-parse", "--absolute-git-dir")
    else:
        top = _git(path, "rev-parse", "--show-toplevel")
    return top is not None and Path(top).resolve() == path.resolve()


def extract(repo: Path, paths: list[str], dest: Path, commit: str = "HEAD") -> str | None:
    """``paths`` of ``repo`` at ``commit`` into ``dest`` (a temporary directory): ``git archive`` for a checkout or
    a bare clone, a plain copy for a directory that is no git repository. Returns the commit (None for a copy)."""
    dest.mkdir(parents=True)
    if not _is_repository(repo):
        for p in paths:
            (shutil.copytree if (repo / p).is_dir() else shutil.copy2)(repo / p, dest / p)
        return None
    resolved = _git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}")
    if resolved is None:
        raise SystemExit(f"{repo}: commit {commit} is not there")
    archive = subprocess.run(["git", "-C", str(repo), "archive", resolved, "--", *paths], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return resolved


def trees(args, scratch: Path) -> dict:
    """Each release's files in ``scratch``; MemVR's ``llava_llama.py`` over the pinned LLaVA's."""
    repos = {"vcd": Path(args.vcd), "pai": Path(args.pai), "memvr": Path(args.memvr), "llava": Path(args.llava)}
    pin = None
    # "160000 commit <sha>\tsrc/llava": the LLaVA commit MemVR pins
    listing = _git(repos["memvr"], "ls-tree", "HEAD", "src/llava") if _is_repository(repos["memvr"]) else None
    if listing:
        pin = listing.split()[2]
    commits = {}
    for parts in SOURCES.values():
        for name, paths, where in parts:
            commit = (pin or LLAVA_PIN) if name == "llava" else "HEAD"
            commits[name] = extract(repos[name], paths, scratch / where, commit)
    shutil.copy2(scratch / "memvr" / "llava_llama.py", scratch / "llava" / "llava/model/language_model/llava_llama.py")
    commits["llava_pinned_by_memvr"] = pin
    return commits


def ensure_venv(root: Path, name: str) -> Path:
    venv = root / name
    python = venv / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *COMMON_PINS,
                        f"transformers=={TRANSFORMERS[name]}"], check=True)
    return python


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vcd", required=True, help="a checkout or clone of github.com/DAMO-NLP-SG/VCD")
    ap.add_argument("--pai", required=True, help="a checkout or clone of github.com/LALBJ/PAI")
    ap.add_argument("--memvr", required=True, help="a checkout or clone of github.com/1zhou-Wang/MemVR")
    ap.add_argument("--llava", required=True, help="a checkout or clone of github.com/haotian-liu/LLaVA (has c121f04)")
    ap.add_argument("--venv-root", default=str(VENV_ROOT), help="where the venvs vcd / pai / memvr are (or go)")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return INNER[args.inner](Path(args.work))
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        commits = trees(args, work / "src")
        meta, keepsight = setup(work)
        meta["reference_commits"] = {"VCD": commits["vcd"], "PAI": commits["pai"], "MemVR": commits["memvr"],
                                     "LLaVA": commits["llava"]}
        env = {**os.environ, "OMP_NUM_THREADS": str(meta["torch_threads"]), "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        from safetensors.torch import load_file

        meta["environments"], meta["plain_vs_keepsight"] = {}, {}
        for method in ("vcd", "pai", "memvr"):
            python = ensure_venv(Path(args.venv_root), method)
            subprocess.run([str(python), str(Path(__file__).resolve()), *sys.argv[1:], "--inner", method,
                            "--work", str(work)], check=True, env=env, cwd=work)
            result = json.loads((work / f"{method}.json").read_text())
            meta["environments"][method] = result.pop("environment")
            meta[method] = result
            out = load_file(str(work / f"{method}.safetensors"))
            meta["plain_vs_keepsight"][method] = {
                "max_abs_logit_diff": float((out["plain.logits"] - keepsight["logits"]).abs().max()),
                "tokens_equal": bool(torch.equal(out["plain.tokens"], keepsight["tokens"]))}
        worst = max(d["max_abs_logit_diff"] for d in meta["plain_vs_keepsight"].values())
        if worst > 1e-4 or not all(d["tokens_equal"] for d in meta["plain_vs_keepsight"].values()):
            raise SystemExit(f"the releases' plain LLaVA does not reproduce keepsight's: {meta['plain_vs_keepsight']}")
        meta["keys"] = KEYS
        meta["rebuild"] = REBUILD
        meta["deco"] = "DeCo (Wang et al., ICLR 2025) has no public reference code; not covered."
        meta["notes"] = NOTES
        FIXTURES.mkdir(parents=True, exist_ok=True)
        for name in ("inputs", "vcd", "pai", "memvr"):
            shutil.copyfile(work / f"{name}.safetensors", FIXTURES / f"{name}.safetensors")
        (FIXTURES / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {FIXTURES}")


REBUILD = [
    "from keepsight.world.processor import build_tokenizer; from keepsight.world.models import build_model, "
    "preset_processor; from keepsight.world import generate_scenes, render, world_config; from keepsight.data import "
    "chat_example; from keepsight.world.texts import DESCRIBE_PROMPT",
    "tok = build_tokenizer(); model = build_model('tiny-llava-1.5', tok, seed=0)  # state digest == built_digest",
    "with torch.no_grad(): model.lm_head.weight.mul_(10.0)  # lm_head_scale; state digest == state_digest",
    "proc = preset_processor('tiny-llava-1.5'); cfg = world_config(); "
    "image = render(generate_scenes(cfg, 1, seed=0)[0], cfg.noise_std)",
    "inputs = proc(text=[chat_example(proc, DESCRIBE_PROMPT)], images=[image], return_tensors='pt')  # == "
    "inputs.safetensors input_ids / attention_mask / pixel_values",
    "digest: sha256 over sorted state-dict keys of key.encode() then the tensor's bytes (contiguous, cpu, viewed "
    "as uint8), first 16 hex digits (scripts/reference/baselines_released.py state_digest)",
    "decode greedily for new_tokens steps from input_ids (eos never comes up); step i's logits are those of the "
    "next token after i generated tokens, at the last position, float32",
]

KEYS = {
    "inputs.safetensors": {
        "input_ids": "[1, 27] keepsight's prompt ids (16 consecutive image tokens at image_token_start)",
        "attention_mask": "[1, 27]", "pixel_values": "[1, 3, 64, 64] keepsight's processor output",
        "reference_ids": "[1, 12] the releases' ids: the 16 image tokens replaced by one -200",
        "uncond_ids": "[1, 11] PAI's text-only prompt (the image tokens dropped)"},
    "every method file": {
        "plain.logits": "[N, V] that environment's LLaVA without the method, per greedy step",
        "plain.tokens": "[N]"},
    "vcd.safetensors": {
        "image_cd": "[1, 3, 64, 64] the noised pixel values VCD used (feed it to keepsight's distorted stream)",
        "noise.sqrt_alpha_bar": "[1] sqrt(alpha_bar_500) of the release's schedule",
        "noise.sqrt_one_minus_alpha_bar": "[1]",
        "<setting>.logits": "[N, V] (1 + cd_alpha) * l - cd_alpha * l_cd, -inf where l < log(cd_beta) + max l "
                            "(raw logits, what the sampling loop hands the logits processors)",
        "<setting>.clean_logits": "[N, V] l: the clean stream's logits", "<setting>.noised_logits": "[N, V] l_cd",
        "<setting>.tokens": "[N] argmax of <setting>.logits", "settings": "released (beta 0.1), pope (beta 0.2)"},
    "pai.safetensors": {
        "cfg.logits": "[N, V] CFGLogits' output: g * (lc - lu) + lu on log-softmaxed lc (conditional) and lu "
                      "(text-only), -inf where lc < log(0.1) + max lc",
        "cfg.cond_logits": "[N, V] the conditional (image, attention-modified except at the prefill) raw logits",
        "cfg.uncond_logits": "[N, V] the text-only stream's raw logits (never modified)",
        "cfg.tokens": "[N]", "attn.logits": "[N, V] raw logits with the attention change alone (prefill too)",
        "attn.tokens": "[N]"},
    "memvr.safetensors": {
        "visual_token": "[16, 64] Z: the projector's output for the image (the memory)",
        "<setting>.logits": "[N, V] raw logits per greedy step", "<setting>.tokens": "[N]",
        "<setting>.entropy": "[N, 32] per forward (prefill, then one per step) and layer: the top-10 entropy / ln 10 "
                             "of the logit lens (final norm + lm_head) at the last position, float32 as .item()",
        "<setting>.trigger_layer": "[N] the first layer l with starting_layer < l < ending_layer and entropy > "
                                   "threshold (-1: none)",
        "<setting>.memory_layer": "[N] the layer whose FFN mixed in the memory (trigger_layer + 1; -1: none)",
        "<setting>.memory_rows": "[N] the rows of that forward (27 at the prefill: every prompt position)",
        "settings": "released (threshold 0.75) and split (a threshold some forwards exceed and some do not)"},
}

NOTES = [
    "The model is keepsight's tiny-llava-1.5 (seed 0) with its lm_head weight multiplied by lm_head_scale (10): as "
    "built, its next-token logits span under 1 nat, so no token falls under VCD's or PAI's plausibility cut and every "
    "layer's top-10 entropy is above 0.997; scaled, the cuts keep 1 to 11 tokens and the entropies spread over "
    "0.58..0.97. The test must scale it the same way (state_digest is the scaled model's).",
    "All releases ran in fp32 on the CPU under torch 2.13.0 (their pins: torch 2.0.1 for VCD and PAI, 2.1.2 for "
    "MemVR), each with the transformers version it pins; the model is built with the release's own "
    "LlavaLlamaForCausalLM from a config (no checkpoint), its CLIP tower loaded by the release's CLIPVisionTower from "
    "a directory written in the work directory, and all weights loaded from keepsight's model.",
    "The prompt goes in as ids with one -200 where keepsight's processor puts its image tokens; the pixel values are "
    "keepsight's processor's (the releases' eval scripts call CLIPImageProcessor.preprocess on a 336px image).",
    "Greedy decoding, max_new_tokens = new_tokens; the model's eos (2) never came up, so every run has new_tokens "
    "steps. Every method's tokens equal the plain ones (116 six times): the methods move the logits, not the argmax "
    "(plain top-2 gap 1.5..1.8 nats).",
    "VCD: the release's sampling loop is the only one it patches, so it ran with do_sample=True, top_k=1, "
    "temperature 1, top_p 1 (its POPE script samples from softmax(cd logits) with no top-k); a LogitsProcessor "
    "appended to the (empty) default list records the contrasted, cut logits it is handed, before the top-k warper. "
    "The noised image is the release's add_diffusion_noise on pixel_values[0] right after transformers.set_seed(55).",
    "VCD: noise_schedule's values come from the release's add_diffusion_noise with torch.randn_like replaced by "
    "zeros_like / ones_like for the call (x0 = ones gives sqrt(alpha_bar), x0 = zeros with unit noise gives "
    "sqrt(1 - alpha_bar)).",
    "PAI: its llava/model/multimodal_encoder imports EVA-CLIP / InternViT / InternVL modules at the top of "
    "clip_encoder.py (they need timm, torchvision, flash_attn); those modules are stubbed with empty classes (never "
    "used for a CLIP tower). model_loader.py (cuda, minigpt4, mllm) is not imported: the ids, img_start_idx = "
    "1 + len(text before the image) and img_end_idx = img_start_idx + image_tokens (576 in the release) are built as "
    "its prepare_llava_inputs builds them, and the text-only prompt as init_cfg_processor does. Attention is eager "
    "(attn_implementation='eager'; the release's torch 2.0.1 gave eager, a newer torch gives sdpa, under which the "
    "release's replaced attention sees no causal mask at the prefill).",
    "MemVR: LLaVA at the commit MemVR pins, with MemVR's llava_llama.py copied over LLaVA's, as MemVR's README says; "
    "transformers' LlamaMLP replaced by memvr.LlamaMLP before the model is built, as its eval scripts do. The "
    "per-layer entropies are the values of the released forward's local `entropy`, read with sys.settrace where it "
    "appends them to entropy_list; memory_layer is the layer whose MLP ran with adpt_sign == 1 (forward hooks).",
    "Plain logits: each environment's LLaVA without the method (PAI's with eager attention, MemVR's with the stock "
    "LlamaMLP and forward).",
]


# ----------------------------------------------------------------------------- the releases' side


def _common(work: Path):
    import torch
    from safetensors.torch import load_file

    torch.manual_seed(SEED)
    config = json.loads((work / "config.json").read_text())
    inputs = load_file(str(work / "inputs.safetensors"))
    weights = load_file(str(work / "llava.safetensors"))
    return config, inputs, weights


def _tower(work: Path, config: dict, weights: dict) -> str:
    """The CLIP tower's directory (the releases' CLIPVisionTower loads it with from_pretrained)."""
    import transformers

    path = work / TOWER_DIR
    if not (path / "config.json").is_file():
        model = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**config["vision"]))
        prefix = "model.vision_tower.vision_tower."
        missing, unexpected = model.load_state_dict(
            {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}, strict=False)
        assert not unexpected and all(k.endswith("position_ids") for k in missing), (missing, unexpected)
        model.save_pretrained(str(path), safe_serialization=True)
        size = config["vision"]["image_size"]
        transformers.CLIPImageProcessor(size={"shortest_edge": size},
                                        crop_size={"height": size, "width": size}).save_pretrained(str(path))
    return TOWER_DIR


def build_llava(work: Path, model_cls, config_cls, config: dict, weights: dict, **extra):
    """The release's ``LlavaLlamaForCausalLM`` with keepsight's weights, fp32, eval."""
    import torch

    cfg = config_cls(**config["text"], **config["mm"], mm_vision_tower=_tower(work, config, weights), **extra)
    torch.manual_seed(SEED)
    model = model_cls(cfg)
    tower = model.get_model().get_vision_tower()
    if not tower.is_loaded:
        tower.load_model()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected, unexpected[:5]
    assert all(k.endswith(("position_ids", "rotary_emb.inv_freq")) for k in missing), missing[:5]
    return model.float().eval()


class Recorder:
    """A LogitsProcessor that keeps what it is handed."""

    def __init__(self):
        self.seen = []

    def __call__(self, input_ids, scores):
        self.seen.append(scores.detach().clone())
        return scores


def _environment() -> dict:
    import numpy
    import torch
    import transformers

    return {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": numpy.__version__}


def _greedy(model, ids, **kwargs):
    """Greedy decoding; (per-step logits [N, V] as the generate loop hands them out, new tokens [N])."""
    import torch

    out = model.generate(ids, do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS, use_cache=True,
                         output_scores=True, return_dict_in_generate=True, **kwargs)
    scores = torch.cat(out.scores, 0).float()
    assert scores.shape[0] == NEW_TOKENS, f"stopped after {scores.shape[0]} steps"
    return scores, out.sequences[0, -NEW_TOKENS:].clone()


def _save(work: Path, method: str, tensors: dict, info: dict) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(work / f"{method}.safetensors"))
    (work / f"{method}.json").write_text(json.dumps({**info, "environment": _environment()}, indent=1))


def run_vcd(work: Path) -> None:
    import torch
    import transformers
    from transformers import LogitsProcessorList

    tree = work / "src" / "vcd"
    sys.path[:0] = [str(tree / "experiments"), str(tree)]
    from llava.model.language_model.llava_llama import LlavaConfig, LlavaLlamaForCausalLM
    from vcd_utils import vcd_sample
    from vcd_utils.vcd_add_noise import add_diffusion_noise

    config, inputs, weights = _common(work)
    model = build_llava(work, LlavaLlamaForCausalLM, LlavaConfig, config, weights)
    ids, pixels = inputs["reference_ids"], inputs["pixel_values"]
    out = {}
    with torch.inference_mode():
        out["plain.logits"], out["plain.tokens"] = _greedy(model, ids, images=pixels)

    randn_like = torch.randn_like
    try:  # the schedule's factors, from the release's function
        torch.randn_like = torch.zeros_like
        sqrt_ab = add_diffusion_noise(torch.ones(1), VCD["noise_step"])
        torch.randn_like = torch.ones_like
        sqrt_1mab = add_diffusion_noise(torch.zeros(1), VCD["noise_step"])
    finally:
        torch.randn_like = randn_like
    out["noise.sqrt_alpha_bar"], out["noise.sqrt_one_minus_alpha_bar"] = sqrt_ab, sqrt_1mab
    transformers.set_seed(VCD["noise_seed"])
    image_cd = add_diffusion_noise(pixels[0], VCD["noise_step"]).unsqueeze(0)
    out["image_cd"] = image_cd

    vcd_sample.evolve_vcd_sampling()
    streams = []

    def hook(module, args, kwargs, output):
        noised = torch.equal(kwargs["images"], image_cd)  # generate's input expansion copies the tensors
        streams.append(("noised" if noised else "clean", output.logits[:, -1].detach().float().clone()))

    handle = model.register_forward_hook(hook, with_kwargs=True)
    for name, s in VCD["settings"].items():
        streams.clear()
        rec = Recorder()
        with torch.inference_mode():
            seq = model.generate(ids, images=pixels, images_cd=image_cd, cd_alpha=s["cd_alpha"], cd_beta=s["cd_beta"],
                                 do_sample=True, top_k=1, temperature=1.0, top_p=1.0, max_new_tokens=NEW_TOKENS,
                                 use_cache=True, logits_processor=LogitsProcessorList([rec]))
        tokens = seq[0, ids.shape[1]:]
        logits = torch.cat(rec.seen, 0).float()
        assert tokens.numel() == NEW_TOKENS and logits.shape[0] == NEW_TOKENS
        assert [k for k, _ in streams] == ["clean", "noised"] * NEW_TOKENS, [k for k, _ in streams]
        assert torch.equal(logits.argmax(-1), tokens), "top_k=1 sampling must give the argmax"
        out[f"{name}.logits"], out[f"{name}.tokens"] = logits, tokens.clone()
        out[f"{name}.clean_logits"] = torch.cat([v for k, v in streams if k == "clean"], 0)
        out[f"{name}.noised_logits"] = torch.cat([v for k, v in streams if k == "noised"], 0)
    handle.remove()
    info = {"reference": "github.com/DAMO-NLP-SG/VCD vcd_utils/vcd_sample.py (evolve_vcd_sampling), "
                         "vcd_utils/vcd_add_noise.py (add_diffusion_noise), experiments/llava",
            "noise_step": VCD["noise_step"], "noise_seed": VCD["noise_seed"],
            "alpha_bar": float(sqrt_ab.double() ** 2), "sqrt_alpha_bar": float(sqrt_ab),
            "sqrt_one_minus_alpha_bar": float(sqrt_1mab), "settings": VCD["settings"],
            "decoding": "do_sample=True, top_k=1, temperature=1.0, top_p=1.0",
            "kept_by_cut": {n: [int(torch.isfinite(r).sum()) for r in out[f"{n}.logits"]] for n in VCD["settings"]},
            "tokens": {n: out[f"{n}.tokens"].tolist() for n in VCD["settings"]},
            "plain_tokens": out["plain.tokens"].tolist()}
    _save(work, "vcd", out, info)


def _stub_pai_encoders() -> None:
    """PAI's clip_encoder.py imports EVA-CLIP / InternViT / InternVL at module level (timm, torchvision, flash_attn);
    a CLIP tower never uses them."""
    base = "llava.model.multimodal_encoder."
    for package, modules in {"eva_clip": {"configuration_evaclip": "EvaCLIPVisionConfig",
                                          "modeling_evaclip": "EvaCLIPVisionModel"},
                             "intern_vit_6b": {"configuration_intern_vit": "InternVisionConfig",
                                               "modeling_intern_vit": "InternVisionModel"},
                             "internvl_14b": {"configuration_internvl": "InternVLConfig",
                                              "modeling_internvl": "InternVLModel"}}.items():
        pkg = types.ModuleType(base + package)
        pkg.__path__ = []
        sys.modules[base + package] = pkg
        for module, cls in modules.items():
            mod = types.ModuleType(f"{base}{package}.{module}")
            setattr(mod, cls, type(cls, (), {}))
            sys.modules[f"{base}{package}.{module}"] = mod


def run_pai(work: Path) -> None:
    import torch
    from transformers import LogitsProcessorList

    tree = work / "src" / "pai"
    sys.path[:0] = [str(tree)]
    _stub_pai_encoders()
    from attention import llama_modify
    from CFG import CFGLogits
    from llava.model.language_model.llava_llama import LlavaConfig, LlavaLlamaForCausalLM

    config, inputs, weights = _common(work)
    ids, pixels, uncond = inputs["reference_ids"], inputs["pixel_values"], inputs["uncond_ids"]
    img_start = int((ids[0] == -200).nonzero()[0, 0])  # = len(token_before) + 1 (the bos), as prepare_llava_inputs
    img_end = img_start + config["image_tokens"]
    start, end = PAI["start_layer"], PAI["end_layer"]
    out = {}

    def fresh():
        return build_llava(work, LlavaLlamaForCausalLM, LlavaConfig, config, weights, attn_implementation="eager")

    model = fresh()
    assert model.config._attn_implementation == "eager"
    with torch.inference_mode():
        out["plain.logits"], out["plain.tokens"] = _greedy(model, ids, images=pixels)
    for name, s in PAI["settings"].items():
        model = fresh()
        llama_modify(model, start, end, s["use_attn"], s["alpha"], s["use_cfg"], img_start, img_end)
        streams = []

        def hook(module, args, kwargs, output, streams=streams):
            kind = "cond" if kwargs.get("images") is not None else "uncond"
            streams.append((kind, output.logits[:, -1].detach().float().clone()))

        handle = model.register_forward_hook(hook, with_kwargs=True)
        kwargs = {}
        if s["use_cfg"]:  # as chair_eval.py: a CFGLogits per batch, after llama_modify
            kwargs["logits_processor"] = LogitsProcessorList(
                [CFGLogits(s["gamma"], uncond, model, start_layer=start, end_layer=end)])
        with torch.inference_mode():
            out[f"{name}.logits"], out[f"{name}.tokens"] = _greedy(model, ids, images=pixels, **kwargs)
        handle.remove()
        assert torch.equal(out[f"{name}.logits"].argmax(-1), out[f"{name}.tokens"])
        cond = torch.cat([v for k, v in streams if k == "cond"], 0)
        if s["use_cfg"]:
            assert [k for k, _ in streams] == ["cond", "uncond"] * NEW_TOKENS, [k for k, _ in streams]
            out[f"{name}.cond_logits"] = cond
            out[f"{name}.uncond_logits"] = torch.cat([v for k, v in streams if k == "uncond"], 0)
        else:  # no CFGLogits: the generate loop's scores are the model's logits
            assert [k for k, _ in streams] == ["cond"] * NEW_TOKENS and torch.equal(cond, out[f"{name}.logits"])
    info = {"reference": "github.com/LALBJ/PAI attention.py (llama_modify), CFG.py (CFGLogits), llava/",
            "img_start_idx": img_start, "img_end_idx": img_end, "start_layer": start, "end_layer": end,
            "settings": PAI["settings"], "attn_implementation": "eager",
            "kept_by_cut": {n: [int(torch.isfinite(r).sum()) for r in out[f"{n}.logits"]]
                            for n, s in PAI["settings"].items() if s["use_cfg"]},
            "tokens": {n: out[f"{n}.tokens"].tolist() for n in PAI["settings"]},
            "plain_tokens": out["plain.tokens"].tolist()}
    _save(work, "pai", out, info)


def run_memvr(work: Path) -> None:
    import torch
    import transformers

    tree = work / "src"
    sys.path[:0] = [str(tree / "llava"), str(tree / "memvr")]
    from llava.model.language_model.llava_llama import LlavaConfig, LlavaLlamaForCausalLM

    config, inputs, weights = _common(work)
    ids, pixels = inputs["reference_ids"], inputs["pixel_values"]
    size = [tuple(pixels.shape[-2:])]
    gen = dict(images=pixels, image_sizes=size, temperature=0, top_p=None)  # as the eval scripts pass them
    out = {}
    plain = build_llava(work, LlavaLlamaForCausalLM, LlavaConfig, config, weights)
    with torch.inference_mode():
        out["plain.logits"], out["plain.tokens"] = _greedy(plain, ids, **gen)
    attn = plain.config._attn_implementation
    del plain

    import memvr

    transformers.models.llama.modeling_llama.LlamaMLP = memvr.LlamaMLP  # before building, as the eval scripts do
    model = build_llava(work, LlavaLlamaForCausalLM, LlavaConfig, config, weights)
    assert all(type(layer.mlp) is memvr.LlamaMLP for layer in model.model.layers)

    source, first = inspect.getsourcelines(memvr.forward)
    line = first + next(i for i, s in enumerate(source) if "entropy_list.append(formatted_entropy)" in s)
    code = memvr.forward.__code__
    forwards = []  # per forward: {"entropy": [per layer], "memory": [(layer, rows)]}

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line:
            entropies = forwards[-1]["entropy"]
            assert frame.f_locals["layer"] == len(entropies)
            entropies.append(frame.f_locals["entropy"])
        return local

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is code:
            forwards.append({"entropy": [], "memory": []})
            return local
        return None

    def hook(i):
        def record(module, args, output):
            if module.adpt_sign == 1:
                forwards[-1]["memory"].append((i, args[0].shape[1]))
        return record

    for i, layer in enumerate(model.model.layers):
        layer.mlp.register_forward_hook(hook(i))

    def run(threshold: float) -> dict:
        memvr.apply_memvr_llama(self=model, starting_layer=MEMVR["starting_layer"], ending_layer=MEMVR["ending_layer"],
                                entropy_threshold=threshold, retracing_ratio=MEMVR["retracing_ratio"])
        forwards.clear()
        sys.settrace(tracer)
        try:
            with torch.inference_mode():
                logits, tokens = _greedy(model, ids, **gen)
        finally:
            sys.settrace(None)
        assert len(forwards) == NEW_TOKENS and all(len(f["entropy"]) == len(model.model.layers) for f in forwards)
        assert all(len(f["memory"]) <= 1 for f in forwards)
        memory = [f["memory"][0] if f["memory"] else (-1, 0) for f in forwards]
        lo, hi = MEMVR["starting_layer"], MEMVR["ending_layer"]
        probed = [[e for layer, e in enumerate(f["entropy"]) if lo < layer < hi] for f in forwards]
        triggered = [next((lo + 1 + j for j, e in enumerate(p) if e > threshold), -1) for p in probed]
        assert [t + 1 if t >= 0 else -1 for t in triggered] == [m for m, _ in memory], (triggered, memory)
        compared = [p[: t - lo] if t >= 0 else p for p, t in zip(probed, triggered)]  # what the release compared
        return {"logits": logits, "tokens": tokens, "entropy": torch.tensor([f["entropy"] for f in forwards],
                                                                            dtype=torch.float64),
                "trigger_layer": torch.tensor(triggered), "memory_layer": torch.tensor([m for m, _ in memory]),
                "memory_rows": torch.tensor([r for _, r in memory]), "threshold": threshold,
                "margin": min(abs(e - threshold) for c in compared for e in c), "window_max": [max(p) for p in probed]}

    settings = {"released": run(MEMVR["entropy_threshold"])}
    out["visual_token"] = model.model.layers[0].mlp.visual_token.detach().float().clone()
    note = None
    fired = settings["released"]["trigger_layer"] >= 0
    if bool(fired.all()) or not bool(fired.any()):
        maxima = sorted(set(settings["released"]["window_max"]))
        candidates = sorted(((b - a, (a + b) / 2) for a, b in zip(maxima, maxima[1:])), reverse=True)
        for _, threshold in candidates:
            result = run(threshold)
            fired = result["trigger_layer"] >= 0
            if bool(fired.any()) and not bool(fired.all()):
                settings["split"] = result
                note = ("the released threshold triggers on every forward or on none; 'split' uses the midpoint of "
                        "the widest gap between the forwards' largest probed entropies in the released run, the "
                        "first such midpoint (widest gap first) with which some forwards trigger and some do not")
                break
        else:
            raise SystemExit(f"no threshold splits the forwards: {settings['released']['window_max']}")
    info = {"reference": "github.com/1zhou-Wang/MemVR memvr.py (LlamaMLP, forward, apply_memvr_llama) and "
                         "llava_llama.py over github.com/haotian-liu/LLaVA", "attn_implementation": attn,
            "settings": {}, "plain_tokens": out["plain.tokens"].tolist(), "threshold_note": note}
    for name, r in settings.items():
        for key in ("logits", "tokens", "entropy", "trigger_layer", "memory_layer", "memory_rows"):
            out[f"{name}.{key}"] = r[key]
        info["settings"][name] = {**MEMVR, "entropy_threshold": r["threshold"],
                                  "trigger_layer": r["trigger_layer"].tolist(),
                                  "memory_layer": r["memory_layer"].tolist(), "memory_rows": r["memory_rows"].tolist(),
                                  "tokens": r["tokens"].tolist(), "threshold_margin": r["margin"]}
    _save(work, "memvr", out, info)


INNER = {"vcd": run_vcd, "pai": run_pai, "memvr": run_memvr}


if __name__ == "__main__":
    main()
