"""Load a checkpoint with a method and decode: the one path behind ``keepsight eval``, the lmms-eval model, the
world's scoring and experiments, and the benchmarks that time decoding (``Pipeline.from_model`` around a model in
memory): the chat prompt, the encoding, the autoregressive generate or the diffusion sampler (``diffuse``), the
end-of-answer cut (``texts``). Code that applies several decoding methods in turn to one model (the diffusion
experiment's sweeps) applies the same ``Decoders`` around ``diffuse``; ``bench pvm-decode`` times single decode steps.

    from keepsight.inference import Pipeline
    pipe = Pipeline("runs/full/base", baseline="vcd")             # any supported checkpoint directory
    out = pipe.generate(["What is in the image?"], [image], max_new_tokens=32)
    out.texts, out.stats                                           # the answers; how often VCD acted

``method`` names how the model is set up (a ``"load"`` entry of ``keepsight.inference.METHODS``: ``none``,
``pvm`` with ``pvm=<adapter dir>``, ``bridge``, ``diffusion``; the entry checks the checkpoint, attaches itself and
names the settings only it takes); ``baseline`` (autoregressive) or ``mps`` /
``mrs`` (diffusion) name the decoding methods applied around each batch, with their settings as dicts of
their config's fields. Greedy decoding unless ``do_sample`` / ``temperature > 0``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..data import padding_side
from ..diffusion import DiffusionOutput
from ..diffusion import generate as diffusion_generate
from ..diffusion.ends import bans_mask, cut_at_end, end_ids, suppressed_ids
from ..diffusion.sampler import SCHEDULE_SETTINGS, user_settings
from ..models import ARCHITECTURES, arch_info, checkpoint_kind, load_checkpoint, resolve_device, resolve_dtype
from ..models.arch import check_finite, check_length, kind_of
from .arguments import DECODING_KEYS, decoding_settings
from .decoders import Decoders
from .registry import METHODS, get_method, method_names
from .settings import DECODE, DecodeSettings

# what generate_ids may ask of transformers' generate beside the ids
GENERATE_OUTPUTS = ("output_hidden_states", "output_attentions", "output_scores", "return_dict_in_generate")


@dataclass
class Generation:
    """Answers to one batch and what each decoding method reported (``stats()`` by method name)."""

    texts: list[str]
    stats: dict = field(default_factory=dict)


def _user_turn(context: str, n_images: int, system_prompt: str | None) -> list[dict]:
    content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": context}]
    messages = [{"role": "user", "content": content}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": [{"type": "text", "text": system_prompt}]})
    return messages


class Pipeline:
    """A loaded checkpoint, its method and its decoding methods. See the module docstring.

    ``mps`` / ``mrs``: None (off) or their settings (``{}`` for the defaults); ``decoding``: ``{registry name:
    settings}`` of any diffusion decoding method (``mps`` and ``mrs`` among them), applied after ``mps`` / ``mrs`` in
    its order. ``steps``, ``gen_length``,
    ``block_length``, ``cfg_scale``, ``remasking`` and ``seed`` are the diffusion sampler's, and ``sampler`` its
    further settings (``keepsight.diffusion.sampler.USER_SETTINGS``: ``cache``, ``threshold``, ``threshold_rule``,
    ``refresh_every``, ``schedule``, ``shift``, ``ban_mask``; ``ban_mask`` defaults to the model's released sampler:
    ``keepsight.diffusion.ends.bans_mask``)."""

    def __init__(self, pretrained: str | os.PathLike, method: str = "none", pvm: str | os.PathLike | None = None,
                 baseline: str | None = None, baseline_args: dict | None = None, mps: dict | None = None,
                 mrs: dict | None = None, dtype: str = "auto", device: str | None = "auto",
                 max_new_tokens: int = DECODE.max_new_tokens, steps: int | None = DECODE.steps,
                 gen_length: int | None = DECODE.gen_length, block_length: int | None = DECODE.block_length,
                 cfg_scale: float = DECODE.cfg_scale, remasking: str = DECODE.remasking, seed: int = DECODE.seed,
                 system_prompt: str | None = DECODE.system_prompt, sampler: dict | None = None,
                 decoding: dict | None = None):
        # every setting is checked before the (minutes long) load
        self._settings(method=method, pvm=pvm, baseline=baseline, baseline_args=baseline_args, mps=mps, mrs=mrs,
                       decoding=decoding, max_new_tokens=max_new_tokens, steps=steps, gen_length=gen_length, block_length=block_length,
                       cfg_scale=cfg_scale, remasking=remasking, seed=seed, system_prompt=system_prompt,
                       sampler=sampler)
        self.path = Path(pretrained).expanduser()
        if not self.path.is_dir():
            raise FileNotFoundError(f"pretrained={pretrained}: no such directory (keepsight loads local "
                                    "checkpoint directories only; download a hub model first)")
        self._device = resolve_device(device)
        self._dtype = resolve_dtype(dtype, self._device)
        self.kind = checkpoint_kind(self.path)
        self._check_kind()
        self._model, self._processor = self._load()
        self._decoders.prepare(self._model, self.tokenizer)

    @classmethod
    def from_model(cls, model, processor, **settings) -> Pipeline:
        """A pipeline around a ``model`` already in memory, used as it is: a world experiment's arm (the base with its
        method attached, or with a decoding method applied around the calls), a benchmark's model. ``settings``:
        ``__init__``'s, less those of the load (``pretrained``, ``method``, ``pvm``, ``dtype``, ``device``); a
        masked-diffusion model is decoded by ``method="diffusion"`` and takes the sampler's settings, an autoregressive
        one ``baseline`` / ``baseline_args`` (applied around each batch, so pipelines with and without one can share
        the model). Greedy unless asked otherwise."""
        unknown = sorted(set(settings) - set(FROM_MODEL_SETTINGS))
        if unknown:
            raise TypeError(f"Pipeline.from_model() got unknown settings {unknown}; it takes {list(FROM_MODEL_SETTINGS)}")
        self = cls.__new__(cls)
        kind = kind_of(model.config)
        method = "diffusion" if ARCHITECTURES[kind].family == "diffusion" else "none"
        defaults = {k: v for k, v in pipeline_defaults().items() if k in FROM_MODEL_SETTINGS}
        self._settings(method=method, pvm=None, **{**defaults, **settings})
        self.path = None
        self.kind = kind
        first = next(model.parameters())
        self._device, self._dtype = first.device, first.dtype
        self._model, self._processor = model, processor
        self._decoders.prepare(model, self.tokenizer)
        return self

    # ------------------------------------------------------------------ setup

    def _settings(self, *, method, pvm, baseline, baseline_args, mps, mrs, decoding, max_new_tokens, steps, gen_length,
                  block_length, cfg_scale, remasking, seed, system_prompt, sampler) -> None:
        """``__init__``'s settings, checked, on ``self``."""
        self._entry = get_method(method, stage="load")  # how the model is set up: its checks and its attach
        self.method = self._entry.name
        # the decoding methods, applied in this order around each batch, prepared on the model once it is loaded
        self._decoders = Decoders()
        requested = self._diffusion_methods(mps, mrs, decoding)
        if self._entry.family == "diffusion":  # elsewhere _check_method_arguments refuses them
            for name, settings in requested.items():
                self._decoders.add(get_method(name, stage="decode", family="diffusion"), settings)
        self._baseline = self._requested_baseline(baseline, baseline_args)
        self.sampler = user_settings(sampler)
        self.pvm_dir = None if pvm in (None, "") else Path(pvm).expanduser()
        self.mps, self.mrs = requested.get("mps"), requested.get("mrs")
        self.decoding = requested
        self.decode = DecodeSettings(max_new_tokens=max_new_tokens, steps=steps, gen_length=gen_length,
                                     block_length=block_length, cfg_scale=cfg_scale, remasking=remasking, seed=seed,
                                     system_prompt=system_prompt or None)  # checked
        self._check_method_arguments()

    @staticmethod
    def _diffusion_methods(mps, mrs, decoding) -> dict:
        """``{name: settings}`` of the diffusion decoding methods asked for, ``mps`` / ``mrs`` first."""
        if decoding is not None and not isinstance(decoding, dict):
            raise TypeError(f"decoding must be a dict {{method name: settings}}, got {type(decoding).__name__}")
        requested = {name: s for name, s in (("mps", mps), ("mrs", mrs)) if s is not None}
        for name, settings in (decoding or {}).items():
            if name in requested:
                raise ValueError(f"{name} given both as {name}= and in decoding=; give it once")
            requested[name] = settings if settings is not None else {}
        return requested

    def _requested_baseline(self, baseline, baseline_args):
        """The baseline's method object (added to the decoding methods), built (its settings checked) before the
        model loads, or None; a ValueError where it does not fit ``method``."""
        if baseline not in (None, "", "none"):
            if self._entry.family != "autoregressive":
                raise ValueError(f"baseline={baseline} decodes autoregressive models; method is {self.method}")
            return self._decoders.add(get_method(baseline, stage="decode", family="autoregressive"), baseline_args)
        if baseline_args:
            raise ValueError(f"baseline settings given without a baseline "
                             f"({'|'.join(method_names('decode', 'autoregressive'))})")
        return None

    def _check_method_arguments(self) -> None:
        """Each setting given belongs to ``method`` (the registry entries' ``takes``), and those it requires are
        given."""
        given = ["pvm"] if self.pvm_dir is not None else []
        given += [n for n in self.decode.given() if n in SCHEDULE_SETTINGS]
        given += [name if name in ("mps", "mrs") else f"decoding.{name}" for name in self.decoding]
        given += [f"sampler.{k}" for k in self.sampler]

        def owner(name: str) -> str:  # the model-side method that takes the setting
            return next(m.name for m in METHODS.values() if m.stage == "load" and name.split(".")[0] in m.takes)

        foreign = [name for name in given if name.split(".")[0] not in self._entry.takes]
        if foreign:
            first = owner(foreign[0])
            names = [name for name in foreign if owner(name) == first]
            raise ValueError(f"{', '.join(names)} only apply to method={first} (method is {self.method}): pass "
                             f"method={first} to use them")
        for name in self._entry.requires:
            if name not in given:
                raise ValueError(f"method={self.method} needs {name}=<{self._entry.needs}>")

    def _check_kind(self) -> None:
        """What ``method`` needs of the checkpoint: its family (the architecture table's row), then the method's own
        check."""
        kind, where = self.kind, self.path
        spec = ARCHITECTURES[kind]
        if spec.family != self._entry.family:
            raise ValueError(f"method={self.method} runs on {self._entry.family} checkpoints ({self._entry.needs}); "
                             f"{where} has model_type {kind!r} ({spec.family}): evaluate it with method="
                             f"{'|'.join(method_names('load', spec.family))}")
        if self._entry.check is not None:
            self._entry.check(spec, kind, where)

    def _load(self):
        """Through ``keepsight.models.load_checkpoint`` (the loader of every ``--model`` command)."""
        model, processor = load_checkpoint(self.path, dtype=self._dtype, device=self._device)
        if not getattr(processor, "chat_template", None) and not getattr(processor.tokenizer, "chat_template", None):
            raise ValueError(f"the processor in {self.path} has no chat template; keepsight formats every request "
                             "with it")
        if self._entry.family == "autoregressive":
            arch_info(model)  # the layout keepsight's methods rely on
        if self._entry.attach is not None:
            self._entry.attach(model, self)
        return model, processor

    # ------------------------------------------------------------------ properties

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
    def decoders(self) -> Decoders:
        """The decoding methods applied around each batch (``Decoders.get(name)``: one of them, prepared)."""
        return self._decoders

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    # ------------------------------------------------------------------ inputs

    def chat_prompt(self, context: str, n_images: int) -> str:
        """One user turn (the images, then the context) in the processor's chat template, ready for the answer."""
        messages = _user_turn(context, n_images, self.decode.system_prompt)
        return self._processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def sample_prompt(self, sample) -> str:
        """A ``keepsight.data.Sample``'s conversation before its last assistant turn (every earlier turn, several
        images) in the processor's chat template, ready for the answer; the system prompt when none is given."""
        messages = list(sample.prompt_messages)
        if self.decode.system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": [{"type": "text", "text": self.decode.system_prompt}]})
        return self._processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def encode(self, texts: list[str], images: list[list], side: str = "left"):
        """Processor batch on the model's device (floating tensors in the model dtype), padded on ``side``.
        ``images``: one list per text (every family's processor takes that form; Gemma 3's and Idefics 3's need it
        to tell the rows' images apart)."""
        if len(images) != len(texts):
            raise ValueError(f"{len(images)} image lists for {len(texts)} prompts (give one list per prompt)")
        kwargs: dict = {"text": texts, "return_tensors": "pt", "padding": True}
        if any(images):
            kwargs["images"] = [list(row) for row in images]
        bos = self.tokenizer.bos_token
        if bos and all(t.startswith(bos) for t in texts):
            kwargs["add_special_tokens"] = False  # the chat template wrote the bos already
        with padding_side(self.tokenizer, side):
            enc = self._processor(**kwargs)
        enc = enc.to(self._device)
        for k, v in list(enc.items()):
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                check_finite(k, v)
                enc[k] = v.to(self._dtype)
        return enc

    # ------------------------------------------------------------------ generation

    def generate(self, contexts: list[str], images: list | None = None, images_per_prompt: list[int] | None = None,
                 **gen_kwargs) -> Generation:
        """Answers to user questions ``contexts`` (one user turn each, in the chat template), with ``images`` in
        order (``images_per_prompt`` of them per context; default: one each when there are as many images as
        contexts, else none), and the decoding methods' stats. ``gen_kwargs`` as ``generate_prompts``."""
        if isinstance(contexts, str) or not all(isinstance(c, str) for c in contexts):
            raise TypeError(f"contexts must be a list of strings (one prompt each), got {type(contexts).__name__}"
                            + (f" {contexts[:40]!r}: wrap it in a list" if isinstance(contexts, str) else ""))
        unknown = sorted(set(gen_kwargs) - set(DECODING_KEYS))
        if unknown:
            raise TypeError(f"generate() got unknown decoding settings {unknown}; it takes {list(DECODING_KEYS)}")
        images = list(images or [])
        if images_per_prompt is None:
            if images and len(images) != len(contexts):
                raise ValueError(f"{len(images)} images for {len(contexts)} prompts: give images_per_prompt")
            images_per_prompt = [1 if images else 0] * len(contexts)
        if len(images_per_prompt) != len(contexts) or sum(images_per_prompt) != len(images):
            raise ValueError(f"images_per_prompt {images_per_prompt} does not fit {len(contexts)} prompts and "
                             f"{len(images)} images")
        prompts = [self.chat_prompt(c, n) for c, n in zip(contexts, images_per_prompt)]
        ends = [sum(images_per_prompt[: i + 1]) for i in range(len(images_per_prompt))]
        texts = self.generate_prompts(prompts, [images[e - n: e] for e, n in zip(ends, images_per_prompt)], gen_kwargs)
        return Generation(texts, self.decoding_stats())

    def generate_samples(self, samples: list, gen_kwargs=None) -> list[str]:
        """Answers to a batch of ``Sample``s (a user's dataset: ``keepsight eval generate``), by this model's
        method; ``gen_kwargs`` as lmms-eval's (greedy, ``max_new_tokens`` by default)."""
        return self.generate_prompts([self.sample_prompt(s) for s in samples], [list(s.images) for s in samples],
                                     gen_kwargs)

    def decoding_stats(self) -> dict:
        """``{method name: its stats()}`` for the decoding methods that report them, after the last batch."""
        return self._decoders.stats()

    def baseline_stats(self) -> dict | None:
        """How often the baseline acted in the last generation batch (``keepsight.baselines``), or None."""
        return self._baseline.stats() if self._baseline is not None else None

    def settings(self, gen_kwargs) -> dict:
        """Decoding settings from lmms-eval-style ``gen_kwargs`` (``until``, ``max_new_tokens``, ``temperature``,
        ``do_sample``, ``num_beams``, ``top_p``, ``top_k``); greedy unless sampling is asked for."""
        return decoding_settings(gen_kwargs, self.decode.max_new_tokens)

    @staticmethod
    def cut(text: str, until: list[str]) -> str:
        """``text`` up to the first of the ``until`` strings, stripped."""
        for stop in until:
            at = text.find(stop)
            if at >= 0:
                text = text[:at]
        return text.strip()

    def generate_prompts(self, prompts: list[str], images: list[list], gen_kwargs) -> list[str]:
        """Answers to chat-formatted ``prompts`` (``images``: one list per prompt) by this model's method."""
        return self.answer(self.encode(prompts, images, "left"), gen_kwargs)

    @torch.no_grad()
    def answer(self, enc, gen_kwargs) -> list[str]:
        """Answers to a left-padded batch ``enc`` (``encode``'s) by this model's method, decoded and cut."""
        s = self.settings(gen_kwargs)
        if self._entry.family == "diffusion":
            if s.get("min_new_tokens"):
                raise ValueError("min_new_tokens applies to autoregressive decoding; a diffusion model fills "
                                 "gen_length (set gen_length instead)")
            out = self.diffuse(enc, s["max_new_tokens"], temperature=s["temperature"] if s["do_sample"] else 0.0)
            texts = self.texts(out.generated)
        else:
            gen = self._generate(enc, s)
            texts = self.tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return [self.cut(t, s["until"]) for t in texts]

    @torch.no_grad()
    def generate_ids(self, enc, gen_kwargs=None, **outputs):
        """An autoregressive model's ``generate`` output for a left-padded batch ``enc`` (``encode``'s) by this model's
        method: the prompt's ids and the new ones, or with ``outputs`` (transformers' ``output_hidden_states``,
        ``output_attentions``, ``output_scores``, ``return_dict_in_generate``) its output object, what a probe reads
        (``keepsight.probes.LogitLens.steps``). ``gen_kwargs`` as ``answer``'s: greedy unless sampling is asked for."""
        if self._entry.family == "diffusion":
            raise ValueError("generate_ids() runs an autoregressive model's generate; a masked-diffusion model "
                             "samples with diffuse()")
        unknown = sorted(set(outputs) - set(GENERATE_OUTPUTS))
        if unknown:
            raise TypeError(f"generate_ids() got unknown outputs {unknown}; it takes {list(GENERATE_OUTPUTS)}")
        return self._generate(enc, self.settings(gen_kwargs or {}), **outputs)

    def _generate(self, enc, s: dict, **outputs):
        """``generate_ids`` with the decoding settings ``s`` already read (``settings``)."""
        kw: dict = {"max_new_tokens": s["max_new_tokens"], "do_sample": s["do_sample"], "num_beams": s["num_beams"]}
        if "min_new_tokens" in s:
            kw["min_new_tokens"] = s["min_new_tokens"]
        if s["do_sample"]:
            kw["temperature"] = s["temperature"]
            kw.update({k: s[k] for k in ("top_p", "top_k") if k in s})
        check_length(self._model, s["max_new_tokens"], "max_new_tokens", prompt=enc["input_ids"].shape[1])
        if self._model.generation_config.pad_token_id is None and self.tokenizer.pad_token_id is not None:
            kw["pad_token_id"] = self.tokenizer.pad_token_id
        with self._applied(enc["input_ids"].shape[1]):
            return self._model.generate(**enc, **kw, **outputs)

    def _applied(self, prompt_len: int) -> contextlib.ExitStack:
        return self._decoders.applied(self._model, prompt_len)

    def diffusion_settings(self, max_new_tokens: int) -> tuple[int, int, int]:
        """(gen_length, steps, block_length) for a request asking ``max_new_tokens``: ``gen_length`` and
        ``block_length`` from the settings when given, else the request's length (rounded up to a whole number of
        blocks); ``steps`` defaults to one token per step."""
        if self.decode.gen_length is not None:
            gen_length = self.decode.gen_length
            block = self.decode.block_length or gen_length
        else:
            block = self.decode.block_length or max_new_tokens
            gen_length = -(-max_new_tokens // block) * block
        return gen_length, self.decode.steps or gen_length, block

    @torch.no_grad()
    def diffuse(self, enc, max_new_tokens: int | None = None, *, temperature: float = 0.0, callback=None,
                **overrides) -> DiffusionOutput:
        """The masked-diffusion sampler's output (``generated [B, G]``, its forward counts) for a left-padded batch
        ``enc`` (``encode``'s), this pipeline's decoding methods applied: ``gen_length`` / ``steps`` /
        ``block_length`` from ``diffusion_settings(max_new_tokens)``, the pipeline's sampler settings, the model's
        banned ids and mask rule (``keepsight.diffusion.ends``), then ``overrides`` (``SamplerConfig`` fields:
        ``steps``, ``block_length``, ``cache``, ...) in their place; ``callback`` as ``keepsight.diffusion.generate``'s.
        ``texts(out.generated)`` reads the answers."""
        if self._entry.family != "diffusion":
            raise ValueError(f"diffuse() decodes masked-diffusion models; method is {self.method}")
        gen_length, steps, block = self.diffusion_settings(max_new_tokens or self.decode.max_new_tokens)
        settings = {"gen_length": gen_length, "steps": steps, "block_length": block, "temperature": temperature,
                    "cfg_scale": self.decode.cfg_scale, "remasking": self.decode.remasking, **self._model_rules,
                    **self.sampler, **overrides}
        extra = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask", "pixel_values")}
        with self._applied(enc["input_ids"].shape[1]):
            return diffusion_generate(self._model, enc["input_ids"], enc.get("attention_mask"), enc.get("pixel_values"),
                                      generator=torch.Generator().manual_seed(self.decode.seed), callback=callback,
                                      model_kwargs=extra, **settings)

    @functools.cached_property
    def _model_rules(self) -> dict:
        """The sampler settings the model's release fixes (``keepsight.diffusion.ends``), read once per pipeline."""
        return {"suppress_token_ids": suppressed_ids(self._model, self.tokenizer), "ban_mask": bans_mask(self._model)}

    @functools.cached_property
    def _ends(self) -> set[int]:
        return end_ids(self._model, self.tokenizer)

    def texts(self, generated: torch.Tensor) -> list[str]:
        """Generated ids ``[B, G]`` (``diffuse``'s) -> each row's answer: its ids before its first end id
        (``keepsight.diffusion.ends.end_ids``), decoded without special tokens and stripped."""
        return [self.tokenizer.decode(row, skip_special_tokens=True).strip()
                for row in cut_at_end(generated, self._ends)]

    # ------------------------------------------------------------------ scoring

    def continuation_check(self) -> None:
        """Refuse scoring where it is undefined: with a decoding method (it changes generation only) or on a
        masked-diffusion model."""
        if self._baseline is not None:
            raise ValueError(f"baseline={self._baseline.name} changes generation only; loglikelihood tasks score the "
                             "model itself")
        if self._entry.family == "diffusion":
            raise NotImplementedError("loglikelihood is not defined for a masked-diffusion model (method=diffusion) "
                                      "here: it has no left-to-right token probabilities; evaluate it on "
                                      "generate_until tasks")

    @torch.no_grad()
    def continuation_logprob(self, context: str, continuation: str, images: list) -> tuple[float, bool]:
        """(sum of log p(continuation token | everything before it), all of them the argmax). The continuation
        is appended to the chat prompt as text; tokens the tokenizer merges across the boundary count as
        continuation."""
        self.continuation_check()
        prompt = self.chat_prompt(context, len(images))
        ctx_ids = self.encode([prompt], [images], "right")["input_ids"][0]
        full = self.encode([prompt + continuation], [images], "right")
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


def pipeline_defaults() -> dict:
    """``{setting: default}`` of ``Pipeline``: what a command that passes a setting on shows as its default (one place
    where each default is written)."""
    return {k: p.default for k, p in inspect.signature(Pipeline.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


# the settings of a pipeline around a model in memory (``Pipeline.from_model``): all but the load's
FROM_MODEL_SETTINGS = tuple(k for k in inspect.signature(Pipeline.__init__).parameters
                            if k not in ("self", "pretrained", "method", "pvm", "dtype", "device"))
