"""Parity fixtures for OPERA as released (github.com/shikiw/OPERA, commit 61426ef): runs the authors'
``opera_beam_search`` under its own transformers (4.29.2) on a tiny LLaVA-1.5-layout model built from keepsight's
config, and writes what it computed to ``tests/fixtures/reference/opera/`` for ``tests/baselines/test_opera.py``.

    python scripts/reference/opera_released.py --opera /path/to/OPERA   # a checkout (or bare clone) of shikiw/OPERA

Two processes. This one (keepsight's environment) builds the model: keepsight's ``tiny-llava-1.5`` preset (LLaMA text
model, width 64, 4 heads, CLIP tower, 16 image tokens) with 4 text layers instead of 32 (the rollback cases run a few
hundred beam steps of 6 forwards each; 4 layers keep the test fast) and seeded weights, then edits three tensors so
that the model has a *summary token*, the pattern OPERA's retrospection looks for:

- a chain: the prompt's last token and the ids ``CHAIN`` each carry a marker dimension in their embedding, and the
  lm_head maps each marker to the next chain token (the last one to eos), so beam search writes the chain
  (``g6 g7 g8 ...``) and ends;
- the chain's 13th token (response position ``SUMMARY_AT`` = 12) carries one more marker that the last decoder layer's
  keys read, while every query reads a dimension all token embeddings share: from its appearance on, every later
  token attends to it (rotary pair 7 of 8, whose frequency is ~3e-4 rad per position, so RoPE hardly moves it).

Its over-trust score grows as ~50^n (float16 inf, banning every candidate, after 8 tokens), its column is the argmax
of every beam at every step, and the release rolls back (to position 13, then 12) once the location count passes the
threshold. The variant ``image_in_chain`` writes the image placeholder id at response position 3 (a text token
there; each rollback then rebuilds the cache with it in the prefix). The prompt is an image
question in keepsight's chat template; the prompt's embeddings (image features merged) as keepsight's LLaVA computes
them, the language model's weights under the LLaMA names of transformers 4.29.2, and the key positions (first /
last image token, response start) go to a work directory.

A second environment, ``.venv-reference/opera`` (created on first use: torch 2.13.0, transformers 4.29.2, numpy<2,
safetensors, from the package index; never installed into keepsight's), imports OPERA's ``generation/utils.py``
(read from the checkout, or from a bare clone's HEAD into a temporary directory, never copied into the project) as
``transformers.generation.utils`` before transformers loads it (the only file OPERA changed in its copy of 4.29.2),
loads the weights into 4.29.2's ``LlamaForCausalLM`` and runs the release's call on the prompt's ``inputs_embeds``
(the path of MiniGPT-4 / InstructBLIP; the input_ids-only path crashes in the rollback, KeyError 'inputs_embeds'):
``generate(inputs_embeds=..., num_beams=5, do_sample=False, opera_decoding=True, key_position=..., scale_factor=50,
penalty_weights=1, output_attentions=True, threshold=..., num_attn_candidates=..., max_new_tokens=...)`` for the cases
in ``CASES`` (each on its model variant). It records the generated ids, every beam step (``BeamSearchScorer.process``: the step's length, the
chosen tokens, parent beams and beam scores; a shorter length than the step before is a rollback) and the best
beam's score (``finalize``). Everything is fp32 with eager attention on the CPU; rerunning writes identical files.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ensure_venv, git_commit, state_digest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "reference" / "opera"
VENV = ROOT / ".venv-reference" / "opera"
PINS = ("torch==2.13.0", "transformers==4.29.2", "numpy<2", "safetensors")
UTILS = "transformers-4.29.2/src/transformers/generation/utils.py"
SEED, TEXT_LAYERS = 0, 4
CHAIN = list(range(100, 124))  # "g6" .. "i5" in the world tokenizer (none is in the prompt), then eos
SUMMARY_AT = 12  # response position of the summary token (OPERA only rolls back to positions >= 10)
SHARED, MARKER, SUMMARY, GAIN, ATTEND = 1.0, 1.0, 1.0, 2.0, 0.8  # embedding / lm_head / q, k values: summary_token_edit
COMMON = {"num_beams": 5, "scale_factor": 50, "penalty_weights": 1}  # README / pope_eval.py / chair_eval.py
# model variants: where the chain writes the image placeholder id (a text token there: a rollback then rebuilds the
# cache with a generated id that HF's LLaVA would read as an image placeholder), None: nowhere
VARIANTS = {"chain": None, "image_in_chain": 3}
CASES = {  # the paper's settings, a low threshold, the README's "more efficient version"
    "paper": {"variant": "chain", "threshold": 15, "num_attn_candidates": 5, "max_new_tokens": 32},
    "threshold3": {"variant": "image_in_chain", "threshold": 3, "num_attn_candidates": 5, "max_new_tokens": 24},
    "efficient": {"variant": "chain", "threshold": 25, "num_attn_candidates": 1, "max_new_tokens": 48},
}


# ----------------------------------------------------------------------------- keepsight's side


def preset():
    from dataclasses import replace

    from keepsight.world.models import PRESETS

    return replace(PRESETS["tiny-llava-1.5"], text_layers=TEXT_LAYERS)


def processor():
    from keepsight.world.models import preset_processor

    return preset_processor("tiny-llava-1.5")


def prompt(proc, question: str = "describe the scene ."):
    """An image question (one 64x64 image with some texture) in keepsight's chat template: (text, image)."""
    from PIL import Image

    from keepsight.data import Sample, render_prompt

    img = Image.new("RGB", (64, 64), (200, 40, 40))
    px = img.load()
    for x in range(0, 64, 4):
        for y in range(0, 64, 4):
            px[x, y] = ((x * 7) % 256, (y * 11) % 256, (x * y) % 256)
    return render_prompt(proc, Sample.single_turn(question, image=img)), img


def prompt_inputs(proc=None) -> dict:
    """The fixture's prompt as model inputs."""
    proc = proc or processor()
    text, img = prompt(proc)
    return dict(proc(text=[text], images=[img], return_tensors="pt"))


def summary_token_edit(model, prompt_ids, image_at: int | None = None) -> dict:
    """Give the model a chain it writes and a summary token every later position attends to (module docstring);
    ``image_at``: the chain's response position that holds the image placeholder id instead. Returns the chain (the
    prompt's last token first) and the summary token's id."""
    import torch

    chain = [int(prompt_ids[0, -1])] + CHAIN
    if image_at is not None:  # its embedding row is free: at the prompt's image positions the features replace it
        chain[1 + image_at] = model.config.image_token_id
    assert not set(CHAIN) & set(prompt_ids[0].tolist()), "a chain token is in the prompt"
    lm = model.model.language_model
    head_dim = lm.config.hidden_size // lm.config.num_attention_heads
    slot = head_dim // 2 - 1  # the lowest-frequency rotary pair (slot, slot + head_dim / 2): keep only `slot`
    summary = chain[1 + SUMMARY_AT]
    with torch.no_grad():
        emb, head = lm.embed_tokens.weight, model.lm_head.weight
        emb[:, 0] = SHARED  # a dimension every token shares: the queries read it
        nxt = chain[1:] + [model.generation_config.eos_token_id]  # the chain ends with eos
        for k, token in enumerate(chain):
            emb[token, 2 + k] = MARKER  # the chain marker of position k ...
            head[nxt[k], 2 + k] = GAIN  # ... predicts the next chain token
        emb[summary, 1] = SUMMARY  # the summary marker: the last layer's keys read it
        attn = lm.layers[-1].self_attn
        for h in range(lm.config.num_attention_heads):
            row = h * head_dim + slot
            attn.q_proj.weight[row] = 0.0
            attn.q_proj.weight[row, 0] = ATTEND
            attn.k_proj.weight[row] = 0.0
            attn.k_proj.weight[row, 1] = ATTEND
    return {"chain": chain, "summary_token": summary}


def keepsight_model(variant: str = "chain"):
    """The tiny LLaVA (seeded, edited as ``variant``) in keepsight's classes, and its prompt; the test rebuilds both
    this way."""
    from keepsight.world.models import build_model

    proc = processor()
    model = build_model(preset(), proc.tokenizer, seed=SEED)
    inputs = prompt_inputs(proc)
    info = summary_token_edit(model, inputs["input_ids"], VARIANTS[variant])
    return model, inputs, info


def key_position(model, input_ids) -> dict:
    """The release's key_position (llava.py:206-210): first and last image token (inclusive), response start."""
    pos = (input_ids[0] == model.config.image_token_id).nonzero().flatten()
    return {"image_start": int(pos[0]), "image_end": int(pos[-1]), "response_start": int(input_ids.shape[1])}


def setup(work: Path) -> dict:
    import torch
    from safetensors.torch import save_file

    variants = {}
    for variant in VARIANTS:
        model, inputs, info = keepsight_model(variant)
        lm = model.model.language_model
        captured = {}

        def grab(module, args, kwargs, captured=captured):  # the LM's input: text embeddings, image features merged
            captured["embeds"] = kwargs["inputs_embeds"].detach().clone()

        handle = lm.register_forward_pre_hook(grab, with_kwargs=True)
        with torch.no_grad():
            # as keepsight's OPERA prefills: the prompt expanded to the 5 beams (the image encoded 5 times)
            k = COMMON["num_beams"]
            model(input_ids=inputs["input_ids"].expand(k, -1), pixel_values=inputs["pixel_values"].repeat(k, 1, 1, 1))
        handle.remove()
        embeds = captured["embeds"]
        assert all(torch.equal(embeds[0], e) for e in embeds), "the 5 copies of the prompt embed differently"
        weights = {("lm_head.weight" if name == "lm_head.weight" else
                    "model." + name.removeprefix("model.language_model.")): p.detach().contiguous()
                   for name, p in model.state_dict().items()
                   if name.startswith("model.language_model.") or name == "lm_head.weight"}
        save_file(weights, str(work / f"lm_{variant}.safetensors"))
        save_file({"inputs_embeds": embeds[:1].contiguous()}, str(work / f"embeds_{variant}.safetensors"))
        variants[variant] = {**info, "image_at": VARIANTS[variant], "base_digest": state_digest(model.state_dict()),
                             "embeds_digest": state_digest({"e": embeds[0]})}
    save_file({k: v.contiguous() for k, v in inputs.items()}, str(work / "inputs.safetensors"))
    text = model.config.text_config
    config = dict(vocab_size=text.vocab_size, hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
                  num_hidden_layers=text.num_hidden_layers, num_attention_heads=text.num_attention_heads,
                  max_position_embeddings=text.max_position_embeddings, rms_norm_eps=text.rms_norm_eps,
                  hidden_act=text.hidden_act, bos_token_id=text.bos_token_id, eos_token_id=text.eos_token_id,
                  pad_token_id=text.pad_token_id, tie_word_embeddings=False)
    assert text.num_key_value_heads == text.num_attention_heads, "transformers 4.29.2's LLaMA has no GQA"
    kp = key_position(model, inputs["input_ids"])
    (work / "config.json").write_text(json.dumps({"llama": config, "key_position": kp}))
    return {"llama_config": config, "key_position": kp, "variants": variants, "torch_threads": torch.get_num_threads(),
            "text_layers": TEXT_LAYERS, "common": COMMON, "cases": CASES}


# ----------------------------------------------------------------------------- the sources


def source(repo: Path, scratch: Path) -> Path:
    """OPERA's generation/utils.py in a checkout, or extracted from a bare clone's HEAD into ``scratch``."""
    if (repo / UTILS).is_file():
        return repo / UTILS
    text = subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{UTILS}"], capture_output=True, check=True).stdout
    out = scratch / "opera_generation_utils.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(text)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--opera", required=True, help="a checkout or bare clone of github.com/shikiw/OPERA")
    ap.add_argument("--opera-commit", help="the OPERA commit, when --opera is not a git checkout")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    ap.add_argument("--utils", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return run_reference(Path(args.inner), Path(args.utils))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = Path(args.opera)
        utils = source(repo, work / "opera")
        meta = setup(work)
        meta["reference_commit"] = git_commit(repo) or args.opera_commit
        meta["reference_file"] = UTILS
        python = ensure_venv(VENV, PINS)
        env = {**os.environ, "OMP_NUM_THREADS": str(meta["torch_threads"]), "HF_HUB_OFFLINE": "1"}
        subprocess.run([str(python), __file__, "--opera", args.opera, "--inner", str(work), "--utils", str(utils)],
                       check=True, env=env)
        FIXTURES.mkdir(parents=True, exist_ok=True)
        for name in ("inputs.safetensors", "outputs.safetensors"):
            (FIXTURES / name).write_bytes((work / name).read_bytes())
        meta.update(json.loads((work / "reference.json").read_text()))
        (FIXTURES / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {FIXTURES}")


# ----------------------------------------------------------------------------- the reference's side (transformers 4.29.2)


def load_opera(utils: Path):
    """OPERA's generation/utils.py as ``transformers.generation.utils`` (before anything imports the stock one)."""
    assert "transformers.generation.utils" not in sys.modules
    spec = importlib.util.spec_from_file_location("transformers.generation.utils", utils)
    module = importlib.util.module_from_spec(spec)
    sys.modules["transformers.generation.utils"] = module
    spec.loader.exec_module(module)
    assert hasattr(module.GenerationMixin, "opera_beam_search")
    return module


def run_reference(work: Path, utils: Path) -> None:
    load_opera(utils)
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.generation import beam_search

    cfg = json.loads((work / "config.json").read_text())
    model = LlamaForCausalLM(LlamaConfig(**cfg["llama"])).eval()
    assert hasattr(model, "opera_beam_search"), "OPERA's generation utils did not load"
    steps: list = []
    final: dict = {}
    scorer = beam_search.BeamSearchScorer
    process, finalize = scorer.process, scorer.finalize

    def traced_process(self, input_ids, *args, **kwargs):  # one beam step: its length and what it chose
        out = process(self, input_ids, *args, **kwargs)
        steps.append((input_ids.shape[-1] - 1, out["next_beam_tokens"].clone(), out["next_beam_indices"].clone(),
                      out["next_beam_scores"].clone()))
        return out

    def traced_finalize(self, *args, **kwargs):
        out = finalize(self, *args, **kwargs)
        final["score"] = out["sequence_scores"].clone()
        return out

    scorer.process, scorer.finalize = traced_process, traced_finalize
    outputs, summary = {}, {}
    for name, case in CASES.items():
        missing, unexpected = model.load_state_dict(load_file(str(work / f"lm_{case['variant']}.safetensors")),
                                                    strict=False)
        assert not unexpected and all(k.endswith("rotary_emb.inv_freq") for k in missing), (missing, unexpected)
        embeds = load_file(str(work / f"embeds_{case['variant']}.safetensors"))["inputs_embeds"]
        steps.clear()
        final.clear()
        with torch.no_grad():
            seq = model.generate(inputs_embeds=embeds, attention_mask=torch.ones(embeds.shape[:2], dtype=torch.long),
                                 do_sample=False, output_attentions=True, opera_decoding=True,
                                 key_position=cfg["key_position"], num_beams=COMMON["num_beams"],
                                 scale_factor=COMMON["scale_factor"], penalty_weights=COMMON["penalty_weights"],
                                 threshold=case["threshold"], num_attn_candidates=case["num_attn_candidates"],
                                 max_new_tokens=case["max_new_tokens"])
        ts = [s[0] for s in steps]
        rollbacks = sum(b <= a for a, b in zip(ts, ts[1:]))  # a step not one longer than the last: a rollback
        outputs[f"{name}_tokens"] = seq[0, 1:]  # the inputs_embeds path's output starts with a BOS placeholder
        outputs[f"{name}_step_t"] = torch.tensor(ts)
        outputs[f"{name}_step_tokens"] = torch.stack([s[1] for s in steps])
        outputs[f"{name}_step_beams"] = torch.stack([s[2] for s in steps])
        outputs[f"{name}_step_scores"] = torch.stack([s[3] for s in steps])
        outputs[f"{name}_score"] = final["score"]
        summary[name] = {"tokens": seq[0, 1:].tolist(), "steps": len(ts), "rollbacks": rollbacks,
                         "score": float(final["score"][0])}
        print(name, summary[name])
    save_file({k: v.contiguous() for k, v in outputs.items()}, str(work / "outputs.safetensors"))
    (work / "reference.json").write_text(json.dumps({
        "reference": "github.com/shikiw/OPERA transformers-4.29.2/src/transformers/generation/utils.py "
                     "(opera_beam_search)", "transformers": transformers.__version__, "torch": torch.__version__,
        "results": summary}, indent=1))


if __name__ == "__main__":
    main()
