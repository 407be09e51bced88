"""Parity fixtures for Mask Prior Suppression, Monotonic RoPE Scaling and LLaDA-V's prompt as released: runs the
authors' code under its own transformers on a tiny LLaDA built from keepsight's config, and writes what it computed
to ``tests/fixtures/reference/mps_mrs/`` for ``tests/diffusion/test_mps_mrs_reference.py``.

    python scripts/reference/mps_mrs_released.py --mpd-pac /path/to/MPD-PAC --llada-v /path/to/LLaDA-V

``--mpd-pac``: a checkout of github.com/hong-sujung/MPD-PAC (its ``LLaDA-V/llava/model/language_model/
modeling_llada_ours.py``: LLaDA with MPS and MRS); ``--llada-v``: a checkout (or bare clone) of
github.com/ML-GSAI/LLaDA-V (its ``configuration_llada.py``, ``conversation.py``, ``mm_utils.py``, ``constants.py``).
They are read where they lie (or extracted to a temporary directory), never copied into the project.

Two processes. This one (keepsight's environment) builds a tiny LLaDA (6 layers, width 64, LLaDA's vocabulary of
126,464 rows so the released sampler's hard-coded token ids exist) with keepsight's config and seeded weights, a
prompt, and LLaDA-V's tokenizer layout (keepsight's tiny LLaDA-style tokenizer), in a work directory. A second
environment, ``.venv-reference/mpd-pac`` (created on first use: torch 2.13.0 and transformers 4.49.0, the release's
version, from the package index; never installed into keepsight's), runs the released ``LLaDAModelLM`` with those
weights: its MRS angle scales (``make_monotonic_freq_mask``), its MPS fit (``init_prior_lastlayer_subspace_from_32
layers``: mu, V_k, u) and ``generate_with_embeds`` at three settings (plain; the LLaDA-V defaults lam 0.1, beta 0.01;
a strong lam 0.8, beta 0.5), recording the slots committed at every step, the final tokens and, per step, the 64
largest logits at every generation slot with their log-sum-exp (the full logits are 126,464 wide); and the released
``conv_llava_llada`` + ``tokenizer_image_token`` ids of an image question, a text question and a two-image question.
Everything is fp32 with eager attention on the CPU; rerunning on the same machine writes identical files.
"""

from __future__ import annotations

import argparse
import importlib
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
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "mps_mrs"
VENV = ROOT / ".venv-reference" / "mpd-pac"
PINS = ("torch==2.13.0", "transformers==4.49.0", "safetensors", "numpy", "pillow")
SEED, P, GEN, STEPS, BLOCK, TOP = 0, 12, 16, 8, 8, 64
SETTINGS = {"plain": None, "released": {"lam": 0.1, "beta": 0.01}, "strong": {"lam": 0.8, "beta": 0.5}}
ETA, TAU0, K = 8.0, 0.6, 3
QUESTIONS = {"image": "<image>\nPlease describe the image in detail.", "text": "What is a scene?",
             "two_images": "<image> <image>\nWhat differs between the images?"}
MODELING = "LLaDA-V/llava/model/language_model/modeling_llada_ours.py"
LLADA_V_FILES = {"configuration_llada.py": "train/llava/model/language_model/configuration_llada.py",
                 "conversation.py": "train/llava/conversation.py", "mm_utils.py": "train/llava/mm_utils.py",
                 "constants.py": "train/llava/constants.py"}


def tiny_config() -> dict:
    return dict(vocab_size=126464, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=500000.0,
                initializer_range=0.2, mask_token_id=126336)


# ----------------------------------------------------------------------------- keepsight's side


def keepsight_model():
    """The tiny LLaDA in keepsight's classes (seeded; the test rebuilds it the same way)."""
    import torch

    from keepsight.models import LladaConfig, LladaForMaskedDiffusion

    c = tiny_config()
    cfg = LladaConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
                      num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_attention_heads"],
                      num_key_value_heads=c["num_key_value_heads"], head_dim=c["hidden_size"] // c["num_attention_heads"],
                      max_position_embeddings=c["max_position_embeddings"], rms_norm_eps=c["rms_norm_eps"],
                      rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]},
                      initializer_range=c["initializer_range"], mask_token_id=c["mask_token_id"],
                      tie_word_embeddings=False)
    torch.manual_seed(SEED)
    return LladaForMaskedDiffusion(cfg).eval()


def prompt_ids():
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    return torch.randint(100, 126000, (1, P), generator=g)  # ordinary ids, none of the special rows 126080 ..


def setup(work: Path) -> dict:
    from safetensors.torch import save_file

    from keepsight.world.models import llada_style_tokenizer

    model = keepsight_model()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(work / "weights.safetensors"))
    save_file({"prompt": prompt_ids()}, str(work / "prompt.safetensors"))
    llada_style_tokenizer().save_pretrained(work / "tokenizer")
    (work / "config.json").write_text(json.dumps(tiny_config()))
    import torch

    return {"base_digest": state_digest(model.state_dict()), "torch_threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------- the sources


def source(repo: Path, rel: str, scratch: Path) -> Path:
    """``rel`` in a checkout, or extracted from a bare clone's HEAD into ``scratch`` (a temporary directory)."""
    if (repo / rel).is_file():
        return repo / rel
    text = read_source(repo, rel)
    out = scratch / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(text)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mpd-pac", required=True, help="a checkout of github.com/hong-sujung/MPD-PAC")
    ap.add_argument("--llada-v", required=True, help="a checkout or bare clone of github.com/ML-GSAI/LLaDA-V")
    ap.add_argument("--mpd-pac-commit", help="the MPD-PAC commit, when --mpd-pac is not a git checkout")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return run_reference(Path(args.inner))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        mpd, llada = Path(args.mpd_pac), Path(args.llada_v)
        files = {"modeling_llada_ours.py": source(mpd, MODELING, work / "mpd")}
        files.update({name: source(llada, rel, work / "llada-v") for name, rel in LLADA_V_FILES.items()})
        (work / "sources.json").write_text(json.dumps({k: str(v) for k, v in files.items()}))
        meta = setup(work)
        meta["reference_commits"] = {"MPD-PAC": git_commit(mpd) or args.mpd_pac_commit, "LLaDA-V": git_commit(llada)}
        python = ensure_venv(VENV, PINS)
        env = {**os.environ, "OMP_NUM_THREADS": str(meta["torch_threads"]), "HF_HUB_OFFLINE": "1"}
        subprocess.run([str(python), __file__, "--mpd-pac", args.mpd_pac, "--llada-v", args.llada_v,
                        "--inner", str(work)], check=True, env=env)
        FIXTURES.mkdir(parents=True, exist_ok=True)
        for name in ("prompt.safetensors", "outputs.safetensors"):
            (FIXTURES / name).write_bytes((work / name).read_bytes())
        meta.update(json.loads((work / "reference.json").read_text()))
        (FIXTURES / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {FIXTURES}")


# ----------------------------------------------------------------------------- the reference's side


def _package(name: str, path: Path | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path else []
    sys.modules[name] = module
    return module


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_released(work: Path):
    """The released modules (modeling, conversation, mm_utils) and the released ``LLaDAModelLM`` with the work
    directory's weights, fp32, eager attention."""
    import torch
    from safetensors.torch import load_file

    files = {k: Path(v) for k, v in json.loads((work / "sources.json").read_text()).items()}
    # the LLaVA package the released files import from, assembled from the release's own files; two helpers that
    # need a GPU cache and video readers are stubbed (the paths here never call them)
    _package("llava")
    cache = _package("llava.cache")

    class _Cache:  # dLLM-Cache's feature cache: reset per prompt, unused without its hooks
        def reset_cache(self, *a, **k):
            return None

    cache.dLLMCache, cache.dLLMCacheConfig = _Cache, dict
    utils = _package("llava.utils")
    utils.rank0_print = print
    utils.process_video_with_pyav = utils.process_video_with_decord = None
    _load("llava.constants", files["constants.py"])
    _package("llava.model")
    lm_pkg = _package("llava.model.language_model")
    _load("llava.model.language_model.configuration_llada", files["configuration_llada.py"])
    modeling = _load("llava.model.language_model.modeling_llada_ours", files["modeling_llada_ours.py"])
    conversation = _load("llava.conversation", files["conversation.py"])
    mm_utils = _load("llava.mm_utils", files["mm_utils.py"])
    del lm_pkg

    torch.manual_seed(SEED)
    c = json.loads((work / "config.json").read_text())
    config = modeling.LLaDAConfig(**{k: v for k, v in c.items() if k != "mask_token_id"}, attention_bias=False,
                                  hidden_act="silu", pretraining_tp=1, rope_scaling=None, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    model = modeling.LLaDAModelLM(config).eval()
    missing, unexpected = model.load_state_dict(load_file(str(work / "weights.safetensors")), strict=False)
    assert not missing and not unexpected, (missing[:4], unexpected[:4])
    model.model.layer_prior_dirs = None  # the released forward loads a file from its authors' disk otherwise
    return modeling, conversation, mm_utils, model


def run_reference(work: Path) -> None:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    modeling, conversation, mm_utils, model = load_released(work)
    c = json.loads((work / "config.json").read_text())
    D = c["hidden_size"] // c["num_attention_heads"]
    rotary = model.model.layers[0].self_attn.rotary_emb
    out = {f"mrs_scale_{name}": rotary.make_monotonic_freq_mask(D, "cpu", 10 * s["beta"], mode="sigmoid", slope=ETA,
                                                                center=TAU0).reshape(D)
           for name, s in SETTINGS.items() if s}
    with torch.no_grad():
        model.init_prior_lastlayer_subspace_from_32layers(k=K)
    out.update(mps_mu=model.prior_mu, mps_V=model.prior_Vt, mps_u=model.prior_u)
    prompt = load_file(str(work / "prompt.safetensors"))["prompt"]
    for name, s in SETTINGS.items():
        kw = {} if s is None else dict(k=K, prior=s["lam"], rope=10 * s["beta"], mode="sigmoid", slope=ETA,
                                       center=TAU0)
        with torch.no_grad():
            embeds = model.model.embed_tokens(prompt)
            result, transfer, logits, _, _ = model.generate_with_embeds(
                embeds, steps=STEPS, gen_length=GEN, block_length=BLOCK, temperature=0.0, remasking="low_confidence",
                img_start=0, prompt_length=P, hs=True, **kw)
        stacked = torch.cat(logits, 0)  # [steps, GEN, V]: each step's logits at the generation slots
        top = stacked.topk(TOP, dim=-1)
        out[f"{name}_tokens"] = result[0]
        out[f"{name}_transfer"] = torch.stack([t.reshape(-1) for t in transfer])  # [steps, committed per step]
        out[f"{name}_top_values"], out[f"{name}_top_indices"] = top.values, top.indices
        out[f"{name}_logsumexp"] = stacked.logsumexp(-1)
    tok_cfg = json.loads((work / "tokenizer" / "tokenizer_config.json").read_text())
    tok = transformers.PreTrainedTokenizerFast(  # written by transformers 5; its tokenizer.json reads anywhere
        tokenizer_file=str(work / "tokenizer" / "tokenizer.json"),
        **{k: tok_cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")})
    tok.chat_template = (work / "tokenizer" / "chat_template.jinja").read_text()
    prompts = {}
    for name, question in QUESTIONS.items():
        conv = conversation.conv_templates["llava_llada"].copy()
        conv.tokenizer = tok  # the release loads GSAI-ML/LLaDA-V's tokenizer from the hub here
        conv.append_message(conv.roles[0], question)
        conv.append_message(conv.roles[1], None)
        prompts[name] = conv.get_prompt()
        out[f"prompt_ids_{name}"] = mm_utils.tokenizer_image_token(prompts[name], tok, -200, return_tensors="pt")
    save_file({k: v.contiguous() for k, v in out.items()}, str(work / "outputs.safetensors"))
    (work / "reference.json").write_text(json.dumps({
        "reference": "github.com/hong-sujung/MPD-PAC LLaDA-V (MPS, MRS, sampler); github.com/ML-GSAI/LLaDA-V "
                     "(conversation, tokenizer_image_token)", "transformers": transformers.__version__,
        "torch": torch.__version__, "settings": SETTINGS, "eta": ETA, "tau0": TAU0, "k": K, "prompt_length": P,
        "gen_length": GEN, "steps": STEPS, "block_length": BLOCK, "top": TOP, "questions": QUESTIONS,
        "prompts": prompts}, indent=1))


if __name__ == "__main__":
    main()
