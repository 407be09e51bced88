"""Parity fixtures for Fast-dLLM's confidence-threshold decoding: runs the authors' ``generate`` (github.com/NVlabs/
Fast-dLLM, ``llada/generate.py``: the plain loop, no cache) on a tiny LLaDA built from keepsight's config, and writes
the tokens and forward counts to ``tests/fixtures/reference/fast_dllm/`` for ``tests/diffusion/test_fast_dllm_reference.py``.

    python scripts/reference/fastdllm_threshold.py --fast-dllm /path/to/Fast-dLLM --mpd-pac /path/to/MPD-PAC \\
        --llada-v /path/to/LLaDA-V

The model: ``scripts/reference/mps_mrs_released.py``'s tiny LLaDA (same weights) with its LM head scaled by
``SHARP`` so the confidences spread over (0, 1) and thresholds 0.9 and 0.5 both split the slots; the reference
side runs it through MPD-PAC's released ``LLaDAModelLM`` (LLaDA-V's LLaMA-style layout, which loads keepsight's
weight names; MPS and MRS off: the plain LLaDA) in ``.venv-reference/mpd-pac`` (transformers 4.49). Fast-dLLM's
``generate`` only calls ``model(x).logits``; its own model file is not used (its import is stubbed). Settings:
threshold 0.9 (the release's scripts), 0.5, and None (its schedule mode). All fp32 on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mps_mrs_released as base  # noqa: E402  (the tiny LLaDA, the reference venv, the released model's loader)
from common import ensure_venv, git_commit  # noqa: E402

FIXTURES = base.ROOT / "tests" / "fixtures" / "reference" / "fast_dllm"
GENERATE = "llada/generate.py"
SHARP = 5.0  # the LM head's scale: confidences of the tiny model spread over (0, 1)
P, GEN, STEPS, BLOCK = base.P, 16, 8, 8
THRESHOLDS = {"t0.9": 0.9, "t0.5": 0.5, "schedule": None}


def keepsight_model():
    """The tiny LLaDA of the MPS / MRS fixtures with its LM head scaled by ``SHARP`` (the test rebuilds it)."""
    import torch

    m = base.keepsight_model()
    with torch.no_grad():
        m.lm_head.weight.mul_(SHARP)
    return m


def setup(work: Path) -> dict:
    from safetensors.torch import save_file

    model = keepsight_model()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(work / "weights.safetensors"))
    save_file({"prompt": base.prompt_ids()}, str(work / "prompt.safetensors"))
    (work / "config.json").write_text(json.dumps(base.tiny_config()))
    import torch

    return {"digest": base.state_digest(model.state_dict()), "torch_threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast-dllm", required=True, help="a checkout or bare clone of github.com/NVlabs/Fast-dLLM")
    ap.add_argument("--mpd-pac", required=True, help="a checkout or bare clone of github.com/hong-sujung/MPD-PAC")
    ap.add_argument("--llada-v", required=True, help="a checkout or bare clone of github.com/ML-GSAI/LLaDA-V")
    ap.add_argument("--mpd-pac-commit", help="the MPD-PAC commit, when --mpd-pac is not a git checkout")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return run_reference(Path(args.inner))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fast, mpd, llada = Path(args.fast_dllm), Path(args.mpd_pac), Path(args.llada_v)
        files = {"modeling_llada_ours.py": base.source(mpd, base.MODELING, work / "mpd"),
                 "generate.py": base.source(fast, GENERATE, work / "fast-dllm")}
        files.update({name: base.source(llada, rel, work / "llada-v") for name, rel in base.LLADA_V_FILES.items()})
        (work / "sources.json").write_text(json.dumps({k: str(v) for k, v in files.items()}))
        meta = setup(work)
        meta["reference_commits"] = {"Fast-dLLM": git_commit(fast), "MPD-PAC": git_commit(mpd) or args.mpd_pac_commit,
                                     "LLaDA-V": git_commit(llada)}
        python = ensure_venv(base.VENV, base.PINS)
        env = {**os.environ, "OMP_NUM_THREADS": str(meta["torch_threads"]), "HF_HUB_OFFLINE": "1"}
        subprocess.run([str(python), __file__, "--fast-dllm", args.fast_dllm, "--mpd-pac", args.mpd_pac,
                        "--llada-v", args.llada_v, "--inner", str(work)], check=True, env=env)
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / "outputs.safetensors").write_bytes((work / "outputs.safetensors").read_bytes())
        meta.update(json.loads((work / "reference.json").read_text()))
        (FIXTURES / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {FIXTURES}")


def run_reference(work: Path) -> None:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    _, _, _, model = base.load_released(work)
    files = {k: Path(v) for k, v in json.loads((work / "sources.json").read_text()).items()}
    stub = types.ModuleType("model.modeling_llada")  # generate.py imports Fast-dLLM's model class at the top
    stub.LLaDAModelLM = None
    base._package("model").modeling_llada = stub
    sys.modules["model.modeling_llada"] = stub
    fast = base._load("fast_dllm_generate", files["generate.py"])
    prompt = load_file(str(work / "prompt.safetensors"))["prompt"]

    class Logits:  # ``model(x).logits`` as the released LLaDA-V sampler computes them (its forward() trains)
        device = torch.device("cpu")

        def __call__(self, x):
            hidden = model.model(inputs_embeds=model.model.embed_tokens(x))[0]
            return types.SimpleNamespace(logits=model.lm_head(hidden).float())

    out, counts = {}, {}
    for name, threshold in THRESHOLDS.items():
        x, nfe = fast.generate(Logits(), prompt, steps=STEPS, gen_length=GEN, block_length=BLOCK, temperature=0.0,
                               remasking="low_confidence", mask_id=126336, threshold=threshold)
        out[f"{name}_tokens"] = x[0, P:]
        counts[name] = int(nfe)
    save_file({k: v.contiguous() for k, v in out.items()}, str(work / "outputs.safetensors"))
    (work / "reference.json").write_text(json.dumps({
        "reference": "github.com/NVlabs/Fast-dLLM llada/generate.py generate (no cache)",
        "transformers": transformers.__version__, "torch": torch.__version__, "thresholds": THRESHOLDS,
        "nfe": counts, "sharp": SHARP, "prompt_length": P, "gen_length": GEN, "steps": STEPS,
        "block_length": BLOCK}, indent=1))


if __name__ == "__main__":
    main()
