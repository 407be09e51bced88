"""Parity fixtures for Mask Prior Suppression and Monotonic RoPE Scaling as MPD-PAC's LaViDa fork releases them: runs
the fork's LLaDA (``LaViDa/llava/model/language_model/llada_ours/modeling_llada.py``) and its sampler (``generate.py``
there) under LaViDa's own transformers on a tiny LLaDA built from keepsight's config, and writes what they computed to
``tests/fixtures/reference/mps_mrs_lavida/`` for ``tests/diffusion/test_mps_mrs_lavida_reference.py``.

    python scripts/reference/mps_mrs_lavida_released.py --mpd-pac /path/to/MPD-PAC --lavida /path/to/LaViDa

``--mpd-pac``: a checkout of github.com/hong-sujung/MPD-PAC (its LaViDa fork's ``llada_ours`` holds no
``configuration_llada.py``); ``--lavida``: a checkout (or bare clone) of github.com/jacklishufan/LaViDa, whose
``llava/model/language_model/llada/configuration_llada.py`` the fork imports. They are read where they lie (or
extracted to a temporary directory), never copied into the project.

Two processes. This one (keepsight's environment) builds the same tiny LLaDA as ``mps_mrs_released.py`` (6 layers,
width 64, LLaDA's vocabulary) with keepsight's config and seeded weights, renames them to the OLMo-style names the
fork's ``LLaDAModelLM`` reads (``model.transformer.blocks.N.*``), and writes them with the prompt to a work directory.
A second environment, ``.venv-reference/lavida`` (created on first use: torch 2.13.0 and transformers 4.50.3, the
version LaViDa pins, from the package index; never installed into keepsight's), runs the fork's ``generate`` (16 slots,
blocks of 8, one slot a step: LaViDa's evaluation setting) at five settings: plain; MPS at LaViDa's lam 0.3 and a strong
0.8 (``prior``, ``k = 3``); MRS at LaViDa's setting (``rope = 0.1`` = beta 0.01, sigmoid, ``slope`` = eta 12, ``center``
= tau0 0.6); both. It records each run's tokens, the first step's logits with MRS on against plain (as released the
fork never hands MRS's arguments to the attention: ``LLaDAModel.forward`` calls its blocks without them), and the
fork's own angle scales (``RotaryEmbedding.make_monotonic_freq_mask``) at that setting: the math it ships but does not
reach. The fork imports DeepSpeed for activation checkpointing; a stand-in that calls the function directly is
installed (checkpointing does not change a forward). Everything is fp32 on the CPU; reruns write identical files.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ensure_venv, git_commit, read_source, state_digest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "mps_mrs_lavida"
VENV = ROOT / ".venv-reference" / "lavida"
PINS = ("torch==2.13.0", "transformers==4.50.3", "safetensors", "numpy")
FORK = "LaViDa/llava/model/language_model/llada_ours"
FORK_FILES = ("modeling_llada.py", "generate.py")
LAVIDA_CONFIG = "llava/model/language_model/llada/configuration_llada.py"
GEN, BLOCK, K = 16, 8, 3
MPS, MPS_STRONG = {"prior": 0.3, "k": K}, {"prior": 0.8, "k": K}
MRS = {"rope": 0.1, "mode": "sigmoid", "slope": 12.0, "center": 0.6}  # LaViDa's beta 0.01 (rope = 10 beta), eta 12
SETTINGS = {"plain": {}, "mps": MPS, "mps_strong": MPS_STRONG, "mrs": MRS, "both": {**MPS, **MRS}}
# keepsight's names -> the OLMo-style names of LLaDA's own modeling file (keepsight.models.llada.CHECKPOINT_KEY_MAP
# read backwards)
TO_OLMO = {r"^model\.layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj)\.": r"model.transformer.blocks.\1.\2.",
           r"^model\.layers\.(\d+)\.self_attn\.o_proj\.": r"model.transformer.blocks.\1.attn_out.",
           r"^model\.layers\.(\d+)\.mlp\.gate_proj\.": r"model.transformer.blocks.\1.ff_proj.",
           r"^model\.layers\.(\d+)\.mlp\.up_proj\.": r"model.transformer.blocks.\1.up_proj.",
           r"^model\.layers\.(\d+)\.mlp\.down_proj\.": r"model.transformer.blocks.\1.ff_out.",
           r"^model\.layers\.(\d+)\.input_layernorm\.": r"model.transformer.blocks.\1.attn_norm.",
           r"^model\.layers\.(\d+)\.post_attention_layernorm\.": r"model.transformer.blocks.\1.ff_norm.",
           r"^model\.embed_tokens\.": "model.transformer.wte.", r"^model\.norm\.": "model.transformer.ln_f.",
           r"^lm_head\.": "model.transformer.ff_out."}


def olmo_names(state: dict) -> dict:
    out = {}
    for key, value in state.items():
        new = key
        for pattern, repl in TO_OLMO.items():
            new, n = re.subn(pattern, repl, key)
            if n:
                break
        else:
            raise KeyError(f"no OLMo-style name for {key}")
        out[new] = value.contiguous()
    return out


# ----------------------------------------------------------------------------- keepsight's side


def setup(work: Path) -> dict:
    import torch
    from mps_mrs_released import keepsight_model, prompt_ids, tiny_config
    from safetensors.torch import save_file

    model = keepsight_model()
    save_file(olmo_names(model.state_dict()), str(work / "weights.safetensors"))
    save_file({"prompt": prompt_ids()}, str(work / "prompt.safetensors"))
    (work / "config.json").write_text(json.dumps(tiny_config()))
    return {"base_digest": state_digest(model.state_dict()), "torch_threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mpd-pac", required=True, help="a checkout of github.com/hong-sujung/MPD-PAC")
    ap.add_argument("--lavida", required=True, help="a checkout or bare clone of github.com/jacklishufan/LaViDa")
    ap.add_argument("--mpd-pac-commit", help="the MPD-PAC commit, when --mpd-pac is not a git checkout")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return run_reference(Path(args.inner))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        package = work / "llada_ours"
        package.mkdir()
        (package / "__init__.py").write_text("")
        mpd, lavida = Path(args.mpd_pac), Path(args.lavida)
        for name in FORK_FILES:
            (package / name).write_bytes(read_source(mpd, f"{FORK}/{name}"))
        (package / "configuration_llada.py").write_bytes(read_source(lavida, LAVIDA_CONFIG))
        meta = setup(work)
        meta["reference_commits"] = {"MPD-PAC": git_commit(mpd) or args.mpd_pac_commit,
                                     "LaViDa": git_commit(lavida)}
        python = ensure_venv(VENV, PINS)
        env = {**os.environ, "OMP_NUM_THREADS": str(meta["torch_threads"]), "HF_HUB_OFFLINE": "1"}
        subprocess.run([str(python), __file__, "--mpd-pac", args.mpd_pac, "--lavida", args.lavida,
                        "--inner", str(work)], check=True, env=env)
        FIXTURES.mkdir(parents=True, exist_ok=True)
        for name in ("prompt.safetensors", "outputs.safetensors"):
            (FIXTURES / name).write_bytes((work / name).read_bytes())
        meta.update(json.loads((work / "reference.json").read_text()))
        (FIXTURES / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {FIXTURES}")


# ----------------------------------------------------------------------------- the reference's side


def load_fork(work: Path):
    """The fork's modeling and sampler modules, imported as the package they are written as (relative imports), with
    a DeepSpeed stand-in for the activation checkpointing its model turns on."""
    import transformers.generation.utils  # noqa: F401  (before the stand-in: transformers probes for DeepSpeed)
    import transformers.modeling_utils  # noqa: F401

    deepspeed = types.ModuleType("deepspeed")
    deepspeed.checkpointing = types.SimpleNamespace(checkpoint=lambda f, *a, **k: f(*a, **k))
    sys.modules["deepspeed"] = deepspeed
    package = types.ModuleType("llada_ours")
    package.__path__ = [str(work / "llada_ours")]
    sys.modules["llada_ours"] = package
    mods = {}
    for name in ("configuration_llada", "modeling_llada", "generate"):
        spec = importlib.util.spec_from_file_location(f"llada_ours.{name}", work / "llada_ours" / f"{name}.py")
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[f"llada_ours.{name}"] = mods[name]
        spec.loader.exec_module(mods[name])
    return mods


def run_reference(work: Path) -> None:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    mods = load_fork(work)
    c = json.loads((work / "config.json").read_text())
    cfg = mods["configuration_llada"].LLaDAConfig(
        d_model=c["hidden_size"], n_heads=c["num_attention_heads"], n_kv_heads=c["num_key_value_heads"],
        n_layers=c["num_hidden_layers"], mlp_hidden_size=c["intermediate_size"], vocab_size=c["vocab_size"],
        embedding_size=c["vocab_size"], max_sequence_length=c["max_position_embeddings"], rope=True,
        rope_theta=c["rope_theta"], block_type="llama", layer_norm_type="rms", rms_norm_eps=c["rms_norm_eps"],
        activation_type="silu", include_bias=False, weight_tying=False, attention_dropout=0.0, residual_dropout=0.0,
        embedding_dropout=0.0, mask_token_id=c["mask_token_id"], flash_attention=False)
    lm = mods["modeling_llada"].LLaDAModelLM(cfg, init_params=False).eval()
    missing, unexpected = lm.load_state_dict(load_file(work / "weights.safetensors"), strict=False)
    assert not unexpected and not [k for k in missing if "rotary" not in k], (missing, unexpected)
    model = lm.model  # the sampler takes the inner LLaDAModel, as the fork's LlavaLladaForMaskedDiffusion passes it
    prompt = load_file(work / "prompt.safetensors")["prompt"]
    embeds = model.transformer.wte(prompt).detach()  # the sampler's prompt arrives as embeddings

    def quiet(fn, *a, **k):  # the fork prints its MRS mode / slope on every table it builds
        with contextlib.redirect_stdout(io.StringIO()):
            return fn(*a, **k)

    out, seen = {}, []
    rotary = mods["modeling_llada"].RotaryEmbedding
    forward = rotary.forward

    def recording(self, q, k, rope=None, *a, **kw):  # what strength the attention's RoPE is given
        seen.append(rope)
        return forward(self, q, k, rope, *a, **kw)

    rotary.forward = recording
    received = {}
    for name, setting in SETTINGS.items():
        for attr in ("prior_mu", "prior_Vt", "prior_u"):  # the fork keeps its first fit: fit afresh per setting
            if hasattr(model, attr):
                delattr(model, attr)
        seen.clear()
        with torch.no_grad():
            x = quiet(mods["generate"].generate, model, inputs_embeds=embeds, max_new_tokens=GEN, block_length=BLOCK,
                      step_per_block=BLOCK, temperature=0.0, **setting)
        out[f"{name}_tokens"] = x[0, -GEN:].clone()
        received[name] = sorted({str(r) for r in seen})
    rotary.forward = forward
    # the first step's logits (prompt + every slot masked), MRS's arguments passed as the sampler passes them
    ids = torch.cat([prompt, torch.full((1, GEN), c["mask_token_id"])], 1)
    with torch.no_grad():
        e = model.transformer.wte(ids)
        plain = quiet(model, None, input_embeddings=e).logits
        mrs = quiet(model, None, input_embeddings=e, rope=MRS["rope"], mode=MRS["mode"], slope=MRS["slope"],
                    center=MRS["center"]).logits
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    block = model.transformer.blocks[0]
    out["mrs_scale"] = quiet(block.rotary_emb.make_monotonic_freq_mask, head_dim, torch.device("cpu"), MRS["rope"],
                             mode=MRS["mode"], slope=MRS["slope"], center=MRS["center"]).reshape(-1).float()
    out["mps_mu"], out["mps_V"], out["mps_u"] = model.prior_mu.float(), model.prior_Vt.float(), model.prior_u.float()
    save_file({k: v.contiguous() for k, v in out.items()}, str(work / "outputs.safetensors"))
    (work / "reference.json").write_text(json.dumps({
        "reference": "github.com/hong-sujung/MPD-PAC LaViDa fork (llada_ours: modeling_llada.py, generate.py); "
                     "github.com/jacklishufan/LaViDa (configuration_llada.py)",
        "transformers": transformers.__version__, "torch": torch.__version__, "settings": SETTINGS,
        "gen_length": GEN, "block_length": BLOCK, "step_per_block": BLOCK,
        "rope_strength_received_by_attention": received,
        "mrs_first_step_max_abs_logit_difference": float((mrs - plain).abs().max()),
    }, indent=1))


if __name__ == "__main__":
    main()
