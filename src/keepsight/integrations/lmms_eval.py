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
  ``remasking``, ``seed``; fast decoding with ``sampler_cache=prefix|dual|prompt``, ``sampler_threshold``,
  ``sampler_threshold_rule``, ``sampler_refresh_every``; LaViDa's slots-per-step schedule with
  ``sampler_schedule=shift,sampler_shift=3``; ``sampler_ban_mask``), optionally with Mask Prior Suppression (``mps=true`` or
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

import inspect
import os
import sys

from PIL import Image
from tqdm import tqdm

from ..diffusion import SamplerConfig
from ..diffusion.sampler import USER_SETTINGS
from ..inference import Pipeline, get_method, method_names
from ..inference.arguments import (
    as_choice,
    as_int,
    as_str,
    baseline_settings,
    config_keys,
    fix_settings,
)
from ..inference.settings import DecodeSettings
from ..train.distributed import process_rank

MODEL_NAME = "keepsight"
CLASS_PATH = "keepsight.integrations.lmms_eval.KeepsightLMMEval"
METHODS = tuple(method_names("load"))  # how the model is set up (keepsight.inference.METHODS)
# the sampler's fast decoding, as sampler_<field>=... (sampler_cache=prompt, sampler_threshold=0.9)
SAMPLER_KEYS = config_keys(SamplerConfig, only=USER_SETTINGS)
DECODE_KEYS = config_keys(DecodeSettings)  # max_new_tokens=, steps=, ...: the fields of keepsight eval's options


# ----------------------------------------------------------------------------- the model

FLAT_PREFIXES = ("baseline", "sampler")  # baseline_FIELD=..., sampler_FIELD=...


class KeepsightLMM(Pipeline):
    """lmms-eval's simple-model interface over ``keepsight.inference.Pipeline`` (the loading, methods and decoding
    every keepsight command uses). See the module docstring.

    Works without lmms-eval (requests need only ``.args``; ``task_dict`` maps task -> split -> docs);
    ``KeepsightLMMEval`` is this class plus lmms-eval's ``lmms`` base."""

    is_simple = True
    LL_OUTPUT = "logprob"  # what loglikelihood returns unless ll_output= says otherwise

    def __init__(self, pretrained: str | os.PathLike | None = None, method: str = "none", pvm=None, dtype=None,
                 device=None, batch_size=1, ll_output=None, max_batch_size=None, baseline=None, baseline_args=None,
                 **extra):
        """Model arguments as lmms-eval passes them (strings, or values); a setting not given takes
        ``Pipeline``'s default (the one place it is written). The decoding settings are ``DecodeSettings``' fields
        (``max_new_tokens=64``, ``steps=32``, ...), read by the same converters as ``keepsight eval``'s options and
        checked by the dataclass. Each registered diffusion decoding method ``NAME`` (``mps``, ``mrs``, ...) is
        ``NAME=true|JSON`` and ``NAME_FIELD=value``."""
        del max_batch_size  # lmms-eval passes it for --batch_size auto, which is not supported
        decode = {k: DECODE_KEYS[k](k, v) for k in DECODE_KEYS if (v := extra.pop(k, None)) not in (None, "")}
        decoding = {}
        for name in method_names("decode", "diffusion"):
            config = get_method(name).config
            keys = config_keys(config)
            if (name in OWN_ARGUMENTS or any(name == p or name.startswith(f"{p}_") for p in FLAT_PREFIXES)
                    or OWN_ARGUMENTS & {f"{name}_{k}" for k in keys}):
                raise ValueError(f"diffusion method {name!r} (registered by {config.__module__}) is "
                                 "named like one of keepsight's own model arguments (or its settings are); register it "
                                 "under another name")
            flat = {k[len(name) + 1:]: extra.pop(k) for k in list(extra) if k.startswith(f"{name}_")}
            defaults = config.paper_defaults() if hasattr(config, "paper_defaults") else {}
            settings = fix_settings(name, extra.pop(name, None), flat, keys, defaults)
            if settings is not None:
                decoding[name] = settings
        baseline_flat = {k[9:]: extra.pop(k) for k in list(extra) if k.startswith("baseline_")}
        sampler_flat = {k[8:]: extra.pop(k) for k in list(extra) if k.startswith("sampler_")}
        if extra:
            methods = ", ".join(f"{n}, {n}_*" for n in method_names("decode", "diffusion"))
            raise ValueError(f"unknown model argument(s) {sorted(extra)}; keepsight accepts pretrained, method, pvm, "
                             f"{methods}, dtype, device, batch_size, {', '.join(DECODE_KEYS)}, ll_output, baseline, "
                             "baseline_args, baseline_*, sampler_*")
        unknown = sorted(set(sampler_flat) - set(SAMPLER_KEYS))
        if unknown:
            raise ValueError(f"unknown sampler setting(s) {['sampler_' + k for k in unknown]}; known: "
                             f"{['sampler_' + k for k in SAMPLER_KEYS]}")
        if pretrained is None:
            raise ValueError("pretrained=<checkpoint directory> is required")
        method = as_choice("method", method, METHODS)
        pretrained = as_str("pretrained", pretrained)
        self.batch_size_per_gpu = self._batch_size(batch_size)
        self.ll_output = as_choice("ll_output", self.LL_OUTPUT if ll_output is None else ll_output,
                                    ("logprob", "nll"))
        settings = None
        if baseline not in (None, "", "none"):
            settings = baseline_settings(baseline_args, baseline_flat)
            baseline = as_str("baseline", baseline)
        elif baseline_args is not None or baseline_flat:
            raise ValueError(f"baseline settings given without baseline={'|'.join(method_names('decode', 'autoregressive'))}")
        self._rank, self._world_size = process_rank()
        self.task_dict = getattr(self, "task_dict", None) or {}
        load = {name: value for name, value in (("dtype", dtype), ("device", device)) if value is not None}
        Pipeline.__init__(  # the loader checks dtype and device, DecodeSettings the decoding settings
            self, pretrained, method=method, pvm=None if pvm in (None, "") else as_str("pvm", pvm),
            baseline=baseline, baseline_args=settings, decoding=decoding,
            sampler={k: SAMPLER_KEYS[k](f"sampler_{k}", v) for k, v in sampler_flat.items()}, **load, **decode)

    @staticmethod
    def _batch_size(value) -> int:
        if isinstance(value, str) and value.strip().lower().startswith("auto"):
            raise ValueError(f"batch_size={value!r}: automatic batch sizing is not supported; give an integer")
        return as_int("batch_size", value, 1)

    # ------------------------------------------------------------------ lmms-eval properties

    @property
    def batch_size(self) -> int:
        return self.batch_size_per_gpu

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    # ------------------------------------------------------------------ requests

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
                images.append(list(vis))
            prompts = [self.chat_prompt(c, n) for c, n in zip(contexts, counts)]
            texts = self.generate_prompts(prompts, images, parsed[group[0]][1])
            for i, text in zip(group, texts):
                out[i] = text
                hook = getattr(self, "cache_hook", None)
                if hook is not None:
                    hook.add_partial("generate_until", (parsed[i][0], parsed[i][1]), text)
            bar.update(len(group))
        bar.close()
        return out

    def generate_until_multi_round(self, requests) -> list[str]:
        raise NotImplementedError("keepsight's lmms-eval model does not implement generate_until_multi_round "
                                  "(multi-round tasks); use tasks whose output_type is generate_until, "
                                  "loglikelihood or multiple_choice")

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        self.continuation_check()
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


# the model arguments KeepsightLMM takes by name: a diffusion method called like one could not be switched on
OWN_ARGUMENTS = (frozenset(inspect.signature(KeepsightLMM.__init__).parameters) - {"self", "extra"}) | set(DECODE_KEYS)


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
