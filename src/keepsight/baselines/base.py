"""What every training-free baseline shares: a config dataclass with the paper's defaults, ``apply(model)`` (a
context manager that installs hooks / attention functions and removes them on exit, also on an exception), and
``stats()`` (how often the method acted, so a user can see it is active).

Logit-level methods (VCD, PAI's text-only subtraction, DeCo) work as a forward hook on the model itself: every
forward (a plain call, or each step of ``generate``) has its ``logits`` replaced, so greedy decoding, sampling and
beam search all see the adjusted scores. A second stream of the same model (VCD's distorted image, PAI's
text-only prompt) keeps its own KV cache (``Stream``), so decoding stays incremental.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from ..models.arch import arch_info, check_finite, check_method, rope_state_kept, starts_sequence


@dataclass
class Stats:
    """How often a method acted: forwards seen, steps (last-position predictions) whose argmax it changed, and
    the mean absolute change of the last-position logits."""

    forwards: int = 0
    acted: int = 0  # forwards where the method changed anything (MemVR: where it triggered)
    changed_argmax: int = 0  # rows whose next-token argmax moved
    rows: int = 0
    shift_sum: float = 0.0
    extra: dict = field(default_factory=dict)
    compares_logits: bool = True  # False where the method acts inside the forward (MemVR): no before / after pair

    def record(self, before: torch.Tensor, after: torch.Tensor) -> None:
        """``before`` / ``after``: last-position logits [B, V]."""
        self.forwards += 1
        self.rows += before.shape[0]
        self.acted += int(not torch.equal(before, after))
        self.changed_argmax += int((before.argmax(-1) != after.argmax(-1)).sum())
        finite = torch.isfinite(before) & torch.isfinite(after)
        self.shift_sum += float((after - before).abs().where(finite, torch.zeros_like(before)).mean(-1).sum())

    def as_dict(self) -> dict:
        measured = self.compares_logits  # None, not 0, where the logits before the method were never computed
        return {"forwards": self.forwards, "acted": self.acted, "rows": self.rows,
                "changed_argmax": self.changed_argmax if measured else None,
                "mean_logit_shift": (self.shift_sum / self.rows if self.rows else 0.0) if measured else None,
                **self.extra}


def cache_of(kwargs: dict):
    return kwargs.get("cache", kwargs.get("past_key_values"))


def is_prefill(kwargs: dict) -> bool:
    """A forward that starts a sequence: no cache yet, or an empty one."""
    cache = cache_of(kwargs)
    return starts_sequence(cache)


class Stream:
    """A second stream of the same model (other inputs, the same decoding steps) with its own KV cache.

    ``run(kwargs, prefill)`` calls the model with the main forward's keyword arguments, its cache replaced by the
    stream's own (a new one when ``prefill``: the main forward started a sequence); the positions the model caches (the table row's ``rope_state``) are restored afterwards so the main stream's
    positions are never disturbed."""

    def __init__(self, model):
        self.model = model
        self.cache = None
        self.inside = False  # set while the stream runs (hooks on the model skip it)

    def run(self, kwargs: dict, prefill: bool):
        kw = dict(kwargs)
        kw.pop("past_key_values", None)
        main = cache_of(kwargs)
        if main is not None:
            if prefill or self.cache is None:
                self.cache = DynamicCache(config=self.model.config)
            kw["cache"] = self.cache
        self.inside = True
        try:
            with rope_state_kept(self.model):
                return self.model(**kw)
        finally:
            self.inside = False


class Baseline:
    """A method's shared shape: ``config``, ``apply(model)``, ``stats()``. Subclasses implement ``_install(model,
    stack)`` (register hooks with ``stack.callback`` for their removal)."""

    name = "baseline"

    def __init__(self, config):
        self.config = config
        self._stats = Stats()
        self._active = False

    def stats(self) -> dict:
        return self._stats.as_dict()

    @contextlib.contextmanager
    def apply(self, model):
        if self._active:
            raise RuntimeError(f"{self.name} is already applied to a model")
        arch_info(model)  # an autoregressive VLM of the architecture table
        check_method(model, self.name)  # ... whose row does not rule this method out
        self._stats = Stats()
        self._active = True
        with contextlib.ExitStack() as stack:
            stack.callback(setattr, self, "_active", False)
            _guard_pixels(model, stack)
            self._install(model, stack)
            yield self

    def _install(self, model, stack: contextlib.ExitStack) -> None:
        raise NotImplementedError

    def _logits_hook(self, model, stack: contextlib.ExitStack, combine, skip=lambda: False) -> None:
        """Replace ``output.logits`` of every forward of ``model`` with ``combine(kwargs, logits, prefill)``
        (``prefill``: the forward started a sequence, read before it ran)."""
        state = {"prefill": True}

        def before_forward(module, args, kwargs):
            if not skip():
                state["prefill"] = is_prefill(kwargs)

        def hook(module, args, kwargs, output):
            if skip() or getattr(output, "logits", None) is None:
                return output
            before = output.logits
            after = combine(kwargs, before, state["prefill"])
            self._stats.record(before[:, -1].detach().float(), after[:, -1].detach().float())
            output.logits = after
            return output

        pre = model.register_forward_pre_hook(before_forward, with_kwargs=True)
        stack.callback(pre.remove)
        handle = model.register_forward_hook(hook, with_kwargs=True)
        stack.callback(handle.remove)


def _guard_pixels(model, stack: contextlib.ExitStack) -> None:
    """Refuse NaN / inf pixels where the model encodes its images (``generate`` encodes them before the prefill):
    a method would otherwise decode and report on garbage without a word."""
    base = model.base_model
    original = base.get_image_features

    @functools.wraps(original)  # generate reads the encoder's signature to pick its inputs
    def checked(*args, **kwargs):
        pixels = args[0] if args else kwargs.get("pixel_values")
        if isinstance(pixels, torch.Tensor):
            check_finite("pixel_values", pixels)
        return original(*args, **kwargs)

    base.get_image_features = checked  # an instance attribute: the class's method comes back on exit
    stack.callback(lambda: base.__dict__.pop("get_image_features", None))


def capture_image_inputs(model, stack: contextlib.ExitStack, skip=lambda: False) -> dict:
    """The inputs of the model's last image encoding (``pixel_values``, ``image_grid_thw``, ...), kept in the
    returned dict. ``generate`` encodes the images before the prefill and passes the features
    (``mm_encoder_outputs``), so a stream that needs other pixels (VCD) reads them here."""
    base = model.base_model
    original = base.get_image_features
    seen: dict = {}

    @functools.wraps(original)  # generate reads the encoder's signature to pick its inputs
    def wrapper(*args, **kwargs):
        if not skip():
            seen.clear()
            seen.update(kwargs)
            if args:
                seen["pixel_values"] = args[0]
        return original(*args, **kwargs)

    base.get_image_features = wrapper  # an instance attribute: the class's method comes back on exit
    stack.callback(lambda: base.__dict__.pop("get_image_features", None))
    return seen
