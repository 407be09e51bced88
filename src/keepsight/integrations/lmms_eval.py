"""A ``keepsight`` model for lmms-eval: evaluate a local Hugging Face checkpoint with a keepsight method.

    lmms-eval --model keepsight --tasks pope --batch_size 1 \\
        --model_args pretrained=runs/cache/base-<hash>,method=pvm,pvm=adapters/pvm-grpo

``method`` (model argument; default ``none``):

- ``none``: the checkpoint as it is: LLaVA-family, Qwen3-VL, Qwen2.5-VL, or a bridge-converted LLaVA
  (model type ``keepsight_llava``; the loader registers it).
- ``pvm``: the same checkpoints with the Persistent Visual Memory adapter ``pvm=<adapter dir>``
  (``keepsight.pvm.load_pvm``, which checks that the adapter fits the model).
- ``bridge``: as ``none``, but the checkpoint must be bridge-converted (a guard against evaluating the
  wrong directory).
- ``diffusion``: a LLaDA-V-style masked-diffusion VLM (LLaVA with a ``llada`` text model: a directory
  written by ``keepsight diffusion train``, or a LLaDA-V-layout checkpoint that ``load_llada_v`` maps),
  decoded by ``keepsight.diffusion.generate`` (``steps``, ``gen_length``, ``block_length``, ``cfg_scale``,
  ``remasking``, ``seed``), optionally with Mask Prior Suppression (``mps=true`` or
  ``mps={"k":3,"lam":0.1}`` or ``mps_k=3,mps_lam=0.1``) and Monotonic RoPE Scaling (``mrs=true`` or
  ``mrs={"beta":0.01}`` or ``mrs_beta=0.01,mrs_eta=8``). Defaults are the papers' (MPS k 3, lam 0.1;
  MRS beta 0.01, eta 8, tau0 0.6).

A training-free baseline (``keepsight.baselines``) decodes on top of ``none`` / ``pvm`` / ``bridge``:
``baseline=vcd|pai|memvr|deco|opera`` with its settings flat (``baseline_alpha=1.0,baseline_beta=0.1``) or as JSON
(``baseline_args={"alpha": 1.0}``); generation only (``loglikelihood`` with a baseline is an error).

Other model arguments: ``dtype`` (``auto``: float32 on CPU, bfloat16 on a GPU that has it, else float16),
``device`` (``auto``: ``cuda:$LOCAL_RANK`` / ``cuda`` when available, else ``cpu``), ``batch_size``,
``max_new_tokens`` (used when a task gives none), ``system_prompt``, ``ll_output`` (below).

Requests (lmms-eval's simple-model layout): ``generate_until`` args ``(context, gen_kwargs, doc_to_visual,
doc_id, task, split)``; the image(s) from ``doc_to_visual(self.task_dict[task][split][doc_id])`` and the
context go through the processor's chat template as one user turn. Greedy unless ``gen_kwargs`` has
``temperature > 0``; ``max_new_tokens``, ``top_p``, ``top_k``, ``num_beams`` are honoured (by the
autoregressive methods; ``method=diffusion`` uses ``max_new_tokens`` / ``gen_length``, ``steps``,
``block_length`` and ``temperature`` only) and the text is cut at the first ``until`` string. ``loglikelihood`` args ``(context, continuation or doc_to_target,
doc_to_visual, doc_id, task, split)``: the summed log-probability of the continuation's tokens appended to
the chat prompt, and whether greedy decoding would produce them. Not supported: multi-round generation,
and loglikelihood for ``method=diffusion`` (both raise ``NotImplementedError``).

Sign of the loglikelihood (``ll_output``): lmms-eval 0.7.3 scores ``multiple_choice`` tasks with
``argmin`` over the returned values, because its own models return a loss (lmms-eval issue #370); a
log-probability there would pick the least likely choice. So ``KeepsightLMMEval`` (the class lmms-eval
loads) returns the summed negative log-likelihood by default (``ll_output=nll``: ``acc`` is then the
argmax of the summed log-probability, ``acc_norm`` its per-character version), while ``KeepsightLMM``
alone returns the log-probability of lmms-eval's interface docstring (``ll_output=logprob``). Also,
lmms-eval 0.7.3's evaluator turns a plain ``(float, bool)`` pair into its ``str()``;
``KeepsightLMMEval.loglikelihood`` wraps the pairs so they arrive intact.

Registration: lmms-eval 0.7 reads the entry-point group ``lmms_eval.models``; keepsight's
``pyproject.toml`` declares ``keepsight = "keepsight.integrations.lmms_eval:manifest"``, so an installed
keepsight is found by ``lmms-eval --model keepsight`` with nothing else to do. Without the installed
metadata (a source tree on ``PYTHONPATH``) call ``register()`` before ``lmms_eval.evaluator.simple_evaluate``,
or run ``python -m keepsight.integrations.lmms_eval --model keepsight ...`` (same arguments as ``lmms-eval``).
(``lmms-eval models`` lists only lmms-eval's built-in table, so an installed ``keepsight`` is usable but not
listed there; the ``python -m`` form lists it.)
This module imports lmms-eval only inside ``manifest``, ``register``, ``main`` and when the
``KeepsightLMMEval`` attribute is first read, so ``KeepsightLMM`` works (and is tested) without it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import torch
from PIL import Image
from tqdm import tqdm

from ..baselines import build_baseline
from ..data import padding_side
from ..diffusion import MaskPriorSuppression, MonotonicRoPEScaling, MPSConfig, MRSConfig, generate
from ..models import ARCHITECTURES, arch_info, checkpoint_kind, load_checkpoint, resolve_device, resolve_dtype
from ..models.llada_official import shipped_decoding
from ..pvm import load_pvm
from ..train.distributed import process_rank
from .model_args import (
    MPS_KEYS,
    MRS_KEYS,
    as_bool,
    as_choice,
    as_float,
    as_int,
    as_str,
    baseline_settings,
    fix_settings,
)

MODEL_NAME = "keepsight"
CLASS_PATH = "keepsight.integrations.lmms_eval.KeepsightLMMEval"
METHODS = ("none", "pvm", "bridge", "diffusion")
MPS_DEFAULTS = MPSConfig.paper_defaults()  # {"k": 3, "lam": 0.1}
MRS_DEFAULTS = MRSConfig.paper_defaults()  # {"beta": 0.01, "eta": 8.0, "tau0": 0.6}


# ----------------------------------------------------------------------------- the model


class KeepsightLMM:
    """lmms-eval's simple-model interface over a keepsight-loaded checkpoint. See the module docstring.

    Works without lmms-eval (requests need only ``.args``; ``task_dict`` maps task -> split -> docs);
    ``KeepsightLMMEval`` is this class plus lmms-eval's ``lmms`` base."""

    is_simple = True
    LL_OUTPUT = "logprob"  # what loglikelihood returns unless ll_output= says otherwise

    def __init__(self, pretrained: str | os.PathLike | None = None, method: str = "none", pvm=None, mps=None,
                 mrs=None, dtype: str = "auto", device: str | None = "auto", batch_size=1, max_new_tokens=128,
                 steps=None, gen_length=None, block_length=None, cfg_scale=0.0, remasking="low_confidence",
                 seed=0, system_prompt=None, ll_output=None, max_batch_size=None, baseline=None, baseline_args=None,
                 **extra):
        del max_batch_size  # lmms-eval passes it for --batch_size auto, which is not supported
        mps_flat = {k[4:]: extra.pop(k) for k in list(extra) if k.startswith("mps_")}
        mrs_flat = {k[4:]: extra.pop(k) for k in list(extra) if k.startswith("mrs_")}
        baseline_flat = {k[9:]: extra.pop(k) for k in list(extra) if k.startswith("baseline_")}
        if extra:
            raise ValueError(f"unknown model argument(s) {sorted(extra)}; keepsight accepts pretrained, method, pvm, "
                             "mps, mps_*, mrs, mrs_*, dtype, device, batch_size, max_new_tokens, steps, gen_length, "
                             "block_length, cfg_scale, remasking, seed, system_prompt, ll_output, baseline, "
                             "baseline_args, baseline_*")
        if pretrained is None:
            raise ValueError("pretrained=<checkpoint directory> is required")
        self.method = as_choice("method", method, METHODS)
        self.path = Path(as_str("pretrained", pretrained)).expanduser()
        if not self.path.is_dir():
            raise FileNotFoundError(f"pretrained={pretrained}: no such directory (keepsight loads local "
                                    "checkpoint directories only; download a hub model first)")
        self.batch_size_per_gpu = self._batch_size(batch_size)
        self.max_new_tokens = as_int("max_new_tokens", max_new_tokens, 1)
        self.system_prompt = None if system_prompt in (None, "") else str(system_prompt)
        self.ll_output = as_choice("ll_output", self.LL_OUTPUT if ll_output is None else ll_output,
                                    ("logprob", "nll"))
        self.pvm_dir = None if pvm in (None, "") else Path(as_str("pvm", pvm)).expanduser()
        self.mps = fix_settings("mps", mps, mps_flat, MPS_KEYS, MPS_DEFAULTS)
        self.mrs = fix_settings("mrs", mrs, mrs_flat, MRS_KEYS, MRS_DEFAULTS)
        self.steps = None if steps is None else as_int("steps", steps, 1)
        self.gen_length = None if gen_length is None else as_int("gen_length", gen_length, 1)
        self.block_length = None if block_length is None else as_int("block_length", block_length, 1)
        self.cfg_scale = as_float("cfg_scale", cfg_scale, 0.0)
        self.remasking = as_choice("remasking", remasking, ("low_confidence", "random"))
        self.seed = as_int("seed", seed)
        self._check_method_arguments(steps, gen_length, block_length)

        self._rank, self._world_size = process_rank()
        self.task_dict = getattr(self, "task_dict", None) or {}
        self._device = resolve_device(device)
        self._dtype = resolve_dtype(dtype, self._device)
        self.kind = checkpoint_kind(self.path)
        self._check_kind()
        self._model, self._processor = self._load()
        self._mps = None
        if self.mps is not None:
            self._mps = MaskPriorSuppression(**self.mps).fit(self._model, self.tokenizer)
        self._mrs = None
        if self.mrs is not None:
            self._mrs = MonotonicRoPEScaling(**self.mrs)
        self._baseline = None
        if baseline not in (None, "", "none"):
            if self.method == "diffusion":
                raise ValueError(f"baseline={baseline} decodes autoregressive models; method is diffusion")
            settings = baseline_settings(baseline_args, baseline_flat)
            self._baseline = build_baseline(as_str("baseline", baseline), **settings)
        elif baseline_args is not None or baseline_flat:
            raise ValueError("baseline settings given without baseline=vcd|pai|memvr|deco|opera")

    # ------------------------------------------------------------------ setup

    @staticmethod
    def _batch_size(value) -> int:
        if isinstance(value, str) and value.strip().lower().startswith("auto"):
            raise ValueError(f"batch_size={value!r}: automatic batch sizing is not supported; give an integer")
        return as_int("batch_size", value, 1)

    def _check_method_arguments(self, steps, gen_length, block_length) -> None:
        if self.pvm_dir is not None and self.method != "pvm":
            raise ValueError(f"pvm={self.pvm_dir} is given but method={self.method}; pass method=pvm to apply the "
                             "PVM adapter")
        if self.method == "pvm" and self.pvm_dir is None:
            raise ValueError("method=pvm needs pvm=<adapter directory> (pvm_config.json + pvm.safetensors)")
        if self.method != "diffusion":
            given = [n for n, v in (("mps", self.mps), ("mrs", self.mrs), ("steps", steps),
                                    ("gen_length", gen_length), ("block_length", block_length)) if v is not None]
            if self.cfg_scale != 0.0:
                given.append("cfg_scale")
            if self.remasking != "low_confidence":
                given.append("remasking")
            if given:
                raise ValueError(f"{', '.join(given)} only apply to method=diffusion (method is {self.method})")

    def _check_kind(self) -> None:
        """What ``method`` needs of the checkpoint, read from the architecture table."""
        kind, where = self.kind, self.path
        spec = ARCHITECTURES[kind]
        if self.method == "diffusion":
            if spec.family != "diffusion":
                raise ValueError(f"method=diffusion needs a masked-diffusion VLM (LLaVA with a llada text model); "
                                 f"{where} has model_type {kind!r}")
            if not spec.loadable:
                raise ValueError(f"{where}: {spec.note}")
            if not spec.vlm:
                raise ValueError(f"{where} is a text-only LLaDA language model; lmms-eval tasks need a VLM "
                                 "(LLaVA with a llada text model)")
            return
        if spec.family == "diffusion":
            raise ValueError(f"{where} is a masked-diffusion checkpoint ({kind}); evaluate it with method=diffusion")
        if self.method == "bridge" and kind != "keepsight_llava":
            raise ValueError(f"method=bridge expects a bridge-converted checkpoint (model_type keepsight_llava, from "
                             f"`keepsight bridge train` or replace_projector + save_pretrained); {where} has "
                             f"model_type {kind!r}")

    def _load(self):
        """Through ``keepsight.checkpoint.load_checkpoint`` (the loader of every ``--model`` command)."""
        model, processor = load_checkpoint(self.path, dtype=self._dtype, device=self._device)
        if not getattr(processor, "chat_template", None) and not getattr(processor.tokenizer, "chat_template", None):
            raise ValueError(f"the processor in {self.path} has no chat template; keepsight formats every request "
                             "with it")
        if self.method == "diffusion":
            return model, processor
        arch_info(model)  # the layout keepsight's methods rely on
        if self.method == "pvm":
            load_pvm(model, self.pvm_dir)
        return model, processor

    # ------------------------------------------------------------------ lmms-eval properties

    @property
    def model(self):
        return self._model

    @property
    def processor(self):
        return self._processor

    @property
    def tokenizer(self):
        return self._processor.tokenizer

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def batch_size(self) -> int:
        return self.batch_size_per_gpu

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    # ------------------------------------------------------------------ inputs

    def chat_prompt(self, context: str, n_images: int) -> str:
        """One user turn (the images, then the context) in the processor's chat template, ready for the answer."""
        content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": context}]
        messages = [{"role": "user", "content": content}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": [{"type": "text", "text": self.system_prompt}]})
        return self._processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _doc(self, task, split, doc_id):
        try:
            return self.task_dict[task][split][doc_id]
        except (KeyError, IndexError, TypeError):
            raise KeyError(f"no document {doc_id!r} in task_dict[{task!r}][{split!r}]; lmms-eval fills task_dict "
                           "before it sends requests") from None

    def _visuals(self, doc_to_visual, doc_id, task, split) -> list:
        if doc_to_visual is None:
            return []
        found = doc_to_visual(self._doc(task, split, doc_id))
        stack, out = [found], []
        while stack:
            v = stack.pop(0)
            if v is None:
                continue
            if isinstance(v, (list, tuple)):
                stack[:0] = list(v)
            elif isinstance(v, Image.Image):
                out.append(v.convert("RGB"))
            else:
                raise ValueError(f"task {task!r}: keepsight evaluates images only, doc_to_visual gave a "
                                 f"{type(v).__name__} ({str(v)[:80]!r})")
        return out

    def encode(self, texts: list[str], images: list, side: str = "left"):
        """Processor batch on the model's device (floating tensors in the model dtype), padded on ``side``."""
        kwargs: dict = {"text": texts, "return_tensors": "pt", "padding": True}
        if images:
            kwargs["images"] = images
        bos = self.tokenizer.bos_token
        if bos and all(t.startswith(bos) for t in texts):
            kwargs["add_special_tokens"] = False  # the chat template wrote the bos already
        with padding_side(self.tokenizer, side):
            enc = self._processor(**kwargs)
        enc = enc.to(self._device)
        for k, v in list(enc.items()):
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                enc[k] = v.to(self._dtype)
        return enc

    # ------------------------------------------------------------------ generation

    @staticmethod
    def _generate_args(req) -> tuple:
        args = req.args if hasattr(req, "args") else req
        if len(args) != 6:
            raise ValueError(f"generate_until request with {len(args)} arguments; keepsight expects lmms-eval's "
                             "simple-model layout (context, gen_kwargs, doc_to_visual, doc_id, task, split)")
        return args

    def generate_until(self, requests) -> list[str]:
        parsed = [self._generate_args(r) for r in requests]
        out: list[str | None] = [None] * len(parsed)
        groups: list[list[int]] = []
        for i, args in enumerate(parsed):  # consecutive requests with the same gen_kwargs share a batch
            if groups and len(groups[-1]) < self.batch_size and parsed[groups[-1][0]][1] == args[1]:
                groups[-1].append(i)
            else:
                groups.append([i])
        bar = tqdm(total=len(parsed), disable=self.rank != 0, desc="keepsight generate")
        for group in groups:
            contexts, images, counts = [], [], []
            for i in group:
                context, _, doc_to_visual, doc_id, task, split = parsed[i]
                vis = self._visuals(doc_to_visual, doc_id, task, split)
                contexts.append(context)
                counts.append(len(vis))
                images += vis
            texts = self._generate_batch(contexts, images, counts, parsed[group[0]][1])
            for i, text in zip(group, texts):
                out[i] = text
                hook = getattr(self, "cache_hook", None)
                if hook is not None:
                    hook.add_partial("generate_until", (parsed[i][0], parsed[i][1]), text)
            bar.update(len(group))
        bar.close()
        return out

    def _settings(self, gen_kwargs) -> dict:
        gk = dict(gen_kwargs or {})
        until = gk.get("until")
        if until is None:
            until = []
        elif isinstance(until, str):
            until = [until]
        elif not isinstance(until, (list, tuple)) or not all(isinstance(u, str) for u in until):
            raise ValueError(f"gen_kwargs until must be a string or a list of strings, got {until!r}")
        temperature = gk.get("temperature")
        temperature = None if temperature is None else as_float("temperature", temperature, 0.0)
        do_sample = as_bool("do_sample", gk.get("do_sample", False))
        if temperature is not None:
            do_sample = temperature > 0
        s = {"until": [u for u in until if u], "do_sample": do_sample,
             "max_new_tokens": as_int("max_new_tokens", gk.get("max_new_tokens") or self.max_new_tokens, 1),
             "temperature": temperature if temperature is not None else (1.0 if do_sample else 0.0),
             "num_beams": as_int("num_beams", gk.get("num_beams") or 1, 1)}
        if gk.get("top_p") is not None:
            s["top_p"] = as_float("top_p", gk["top_p"], 0.0)
        if gk.get("top_k") is not None:
            s["top_k"] = as_int("top_k", gk["top_k"], 0)
        return s

    @staticmethod
    def _cut(text: str, until: list[str]) -> str:
        for stop in until:
            at = text.find(stop)
            if at >= 0:
                text = text[:at]
        return text.strip()

    def _generate_batch(self, contexts: list[str], images: list, counts: list[int], gen_kwargs) -> list[str]:
        return self.generate_prompts([self.chat_prompt(c, n) for c, n in zip(contexts, counts)], images, gen_kwargs)

    def sample_prompt(self, sample) -> str:
        """A ``keepsight.data.Sample``'s conversation before its last assistant turn (every earlier turn, several
        images) in the processor's chat template, ready for the answer; the system prompt when none is given."""
        messages = list(sample.prompt_messages)
        if self.system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": [{"type": "text", "text": self.system_prompt}]})
        return self._processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def generate_samples(self, samples: list, gen_kwargs=None) -> list[str]:
        """Answers to a batch of ``Sample``s (a user's dataset: ``keepsight eval generate``), by this model's
        method; ``gen_kwargs`` as lmms-eval's (greedy, ``max_new_tokens`` by default)."""
        return self.generate_prompts([self.sample_prompt(s) for s in samples], [im for s in samples for im in s.images],
                                     gen_kwargs)

    @torch.no_grad()
    def generate_prompts(self, prompts: list[str], images: list, gen_kwargs) -> list[str]:
        """Answers to chat-formatted ``prompts`` (their ``images`` in order) by this model's method."""
        s = self._settings(gen_kwargs)
        enc = self.encode(prompts, images, "left")
        if self.method == "diffusion":
            new = self._diffuse(enc, s)
        else:
            kw: dict = {"max_new_tokens": s["max_new_tokens"], "do_sample": s["do_sample"], "num_beams": s["num_beams"]}
            if s["do_sample"]:
                kw["temperature"] = s["temperature"]
                kw.update({k: s[k] for k in ("top_p", "top_k") if k in s})
            if self._model.generation_config.pad_token_id is None and self.tokenizer.pad_token_id is not None:
                kw["pad_token_id"] = self.tokenizer.pad_token_id
            with self._baseline.apply(self._model) if self._baseline is not None else contextlib.nullcontext():
                gen = self._model.generate(**enc, **kw)
            new = gen[:, enc["input_ids"].shape[1]:]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
        return [self._cut(t, s["until"]) for t in texts]

    def _eos_ids(self) -> set[int]:
        ids = set()
        for v in (self.tokenizer.eos_token_id, self._model.generation_config.eos_token_id):
            if isinstance(v, int):
                ids.add(v)
            elif isinstance(v, (list, tuple)):
                ids.update(int(x) for x in v)
        return ids

    def diffusion_settings(self, max_new_tokens: int) -> tuple[int, int, int]:
        """(gen_length, steps, block_length) for a request asking ``max_new_tokens``: ``gen_length`` and
        ``block_length`` from the model arguments when given, else the request's length (rounded up to a
        whole number of blocks); ``steps`` defaults to one token per step."""
        if self.gen_length is not None:
            gen_length = self.gen_length
            block = self.block_length or gen_length
        else:
            block = self.block_length or max_new_tokens
            gen_length = -(-max_new_tokens // block) * block
        return gen_length, self.steps or gen_length, block

    def _diffuse(self, enc, s: dict) -> torch.Tensor:
        gen_length, steps, block = self.diffusion_settings(s["max_new_tokens"])
        tok = self.tokenizer
        suppress, stop = shipped_decoding(tok)  # LLaDA-V's bans at mask slots and its <|eot_id|> stop, as shipped
        if not suppress:  # another tokenizer: pad and bos are never generated
            suppress = [i for i in (tok.pad_token_id, tok.bos_token_id) if i is not None and i not in self._eos_ids()]
        extra = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask", "pixel_values")}
        prompt_len = enc["input_ids"].shape[1]
        with contextlib.ExitStack() as stack:
            if self._mps is not None:
                stack.enter_context(self._mps.apply(self._model))
            if self._mrs is not None:
                stack.enter_context(self._mrs.apply(self._model, gen_start=prompt_len))
            out = generate(self._model, enc["input_ids"], enc.get("attention_mask"), enc.get("pixel_values"),
                           gen_length=gen_length, steps=steps, block_length=block,
                           temperature=s["temperature"] if s["do_sample"] else 0.0, cfg_scale=self.cfg_scale,
                           remasking=self.remasking, suppress_token_ids=suppress,
                           generator=torch.Generator().manual_seed(self.seed), model_kwargs=extra)
        eos, pad = self._eos_ids() | set(stop), tok.pad_token_id if tok.pad_token_id is not None else 0
        rows = []
        for row in out.generated.tolist():  # cut at the first end-of-sequence token, pad to a rectangle
            rows.append(row[: next((j for j, t in enumerate(row) if t in eos), len(row))])
        width = max(len(r) for r in rows)
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long).view(len(rows), width)

    def generate_until_multi_round(self, requests) -> list[str]:
        raise NotImplementedError("keepsight's lmms-eval model does not implement generate_until_multi_round "
                                  "(multi-round tasks); use tasks whose output_type is generate_until, "
                                  "loglikelihood or multiple_choice")

    # ------------------------------------------------------------------ loglikelihood

    def baseline_stats(self) -> dict | None:
        """How often the baseline acted in the last generation batch (``keepsight.baselines``), or None."""
        return self._baseline.stats() if self._baseline is not None else None

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        if self._baseline is not None:
            raise ValueError(f"baseline={self._baseline.name} changes generation only; loglikelihood tasks score the "
                             "model itself")
        if self.method == "diffusion":
            raise NotImplementedError("loglikelihood is not defined for a masked-diffusion model (method=diffusion) "
                                      "here: it has no left-to-right token probabilities; evaluate it on "
                                      "generate_until tasks")
        out = []
        for req in tqdm(requests, disable=self.rank != 0, desc="keepsight loglikelihood"):
            args = req.args if hasattr(req, "args") else req
            if len(args) == 6:
                context, target, doc_to_visual, doc_id, task, split = args
                continuation = target if isinstance(target, str) else target(self._doc(task, split, doc_id))
                images = self._visuals(doc_to_visual, doc_id, task, split)
            elif len(args) == 2:
                (context, continuation), images = args, []
            else:
                raise ValueError(f"loglikelihood request with {len(args)} arguments; keepsight expects "
                                 "(context, continuation, doc_to_visual, doc_id, task, split)")
            if isinstance(continuation, (list, tuple)):
                if len(continuation) != 1:
                    raise ValueError(f"loglikelihood needs one continuation per request, got {continuation!r}")
                continuation = continuation[0]
            logprob, greedy = self.continuation_logprob(str(context), str(continuation), images)
            result = (-logprob if self.ll_output == "nll" else logprob, greedy)
            hook = getattr(self, "cache_hook", None)
            if hook is not None:
                hook.add_partial("loglikelihood", (context, continuation), result)
            out.append(result)
        return out

    @torch.no_grad()
    def continuation_logprob(self, context: str, continuation: str, images: list) -> tuple[float, bool]:
        """(sum of log p(continuation token | everything before it), all of them the argmax). The continuation
        is appended to the chat prompt as text; tokens the tokenizer merges across the boundary count as
        continuation."""
        prompt = self.chat_prompt(context, len(images))
        ctx_ids = self.encode([prompt], images, "right")["input_ids"][0]
        full = self.encode([prompt + continuation], images, "right")
        ids = full["input_ids"][0]
        n = min(len(ids), len(ctx_ids))
        differ = (ids[:n] != ctx_ids[:n]).nonzero()
        split = int(differ[0]) if len(differ) else n
        if split >= len(ids):
            return 0.0, True
        if split < 1:
            raise ValueError("the prompt has no token before the continuation")
        logits = self._model(**full, use_cache=False).logits[0, split - 1 : -1].float()  # [C, V]
        logp = logits.log_softmax(-1)
        target = ids[split:].to(logp.device)  # [C]
        total = float(logp.gather(-1, target[:, None]).sum())
        return total, bool((logp.argmax(-1) == target).all())


# ----------------------------------------------------------------------------- lmms-eval glue

_LMMS_CLASS = None


def lmms_class():
    """``KeepsightLMMEval``: ``KeepsightLMM`` + ``lmms_eval.api.model.lmms`` (built on first use)."""
    global _LMMS_CLASS
    if _LMMS_CLASS is None:
        try:
            from lmms_eval.api.model import lmms  # optional dependency (the `lmms` extra)
        except ImportError as e:
            raise ImportError("lmms-eval is not installed: pip install 'keepsight[lmms]' (it needs torchvision; "
                              "`make test-lmms` builds a separate .venv-lmms with both)") from e

        class KeepsightLMMEval(KeepsightLMM, lmms):
            """lmms-eval's ``keepsight`` model (see ``keepsight.integrations.lmms_eval``)."""

            is_simple = True
            LL_OUTPUT = "nll"  # lmms-eval's multiple_choice takes the argmin

            def __init__(self, **kwargs):
                lmms.__init__(self)
                KeepsightLMM.__init__(self, **kwargs)

            def loglikelihood(self, requests):
                return _through_unwrap(KeepsightLMM.loglikelihood(self, requests))

        KeepsightLMMEval.__module__ = "keepsight.integrations.lmms_eval"
        _LMMS_CLASS = KeepsightLMMEval
    return _LMMS_CLASS


def _through_unwrap(results: list) -> list:
    """lmms-eval 0.7.3's evaluator passes every model output through ``unwrap_generation_output``, which turns
    a ``(float, bool)`` loglikelihood pair into its ``str()`` (and multiple_choice scoring then fails); wrapped
    in its ``GenerationResult`` the pair comes out as it went in. A no-op where pairs already pass."""
    from lmms_eval.api import instance  # optional dependency (the `lmms` extra)

    if instance.unwrap_generation_output((0.0, True))[0] == (0.0, True):
        return results
    return [instance.GenerationResult(text=r) for r in results]


def __getattr__(name: str):
    if name == "KeepsightLMMEval":  # what lmms-eval's registry imports by class path
        return lmms_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def manifest():
    """The entry point (group ``lmms_eval.models``): lmms-eval 0.7 calls it and registers what it returns."""
    from lmms_eval.models.registry_v2 import ModelManifest  # optional dependency (the `lmms` extra)

    return ModelManifest(model_id=MODEL_NAME, simple_class_path=CLASS_PATH)


def register():
    """Register ``keepsight`` with an imported lmms-eval by hand (not needed when keepsight is installed: the
    entry point does it). Returns the model class."""
    cls = lmms_class()
    from lmms_eval import models  # optional dependency (the `lmms` extra)
    from lmms_eval.api.registry import register_model  # optional dependency

    register_model(MODEL_NAME)(cls)  # the legacy registry
    models.MODEL_REGISTRY_V2.register_manifest(manifest(), overwrite=True)  # what models.get_model reads
    models.AVAILABLE_MODELS[MODEL_NAME] = cls.__name__
    models.AVAILABLE_SIMPLE_MODELS[MODEL_NAME] = CLASS_PATH  # what `lmms-eval models` lists
    return cls


def main(argv: list[str] | None = None) -> None:
    """``python -m keepsight.integrations.lmms_eval ARGS``: ``lmms-eval ARGS`` with ``keepsight`` registered."""
    register()
    from lmms_eval.cli.dispatch import main as lmms_main  # optional dependency (the `lmms` extra)

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    lmms_main()


if __name__ == "__main__":
    main()
