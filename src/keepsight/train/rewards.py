"""Verifiable rewards for GRPO on a user's data with reference answers (the ``answer`` column), in the shape
TRL's GRPOTrainer calls them: ``reward(completions, answer, **columns) -> [float]``. The rules are
``keepsight.metrics.answers``'s; ``load_reward("module:function")`` takes a user's own function."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from ..metrics.answers import KINDS, match


def completion_text(completion) -> str:
    """TRL passes conversational completions as ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, str):
        return completion.strip()
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        if isinstance(content, list):  # content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        return str(content).strip()
    raise TypeError(f"unexpected completion type {type(completion).__name__}")


def match_reward(kind: str) -> Callable:
    """A reward of 1 when a completion matches its reference answer under ``kind``, else 0."""
    if kind not in KINDS:
        raise ValueError(f"unknown reward {kind!r}; choose from {KINDS} or give module:function")

    def reward(completions, answer, **_) -> list[float]:
        return [float(match(kind, completion_text(c), a)) for c, a in zip(completions, answer, strict=True)]

    reward.__name__ = f"{kind}_reward"
    return reward


def load_reward(spec: str) -> Callable:
    """``exact`` / ``yesno`` / ``choice`` / ``numeric``, or ``module:function`` (a user's reward with TRL's
    signature, imported from ``module``)."""
    if ":" not in spec:
        return match_reward(spec)
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--reward {spec}: cannot import {name!r} from {module!r} ({e})") from None
    if not callable(fn):
        raise ValueError(f"--reward {spec}: {name!r} is not callable")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        params = None
    takes = params is not None and (any(p.kind is p.VAR_KEYWORD for p in params)
                                    or any(p.name == "completions" for p in params))
    if not takes:
        raise ValueError(f"--reward {spec}: a reward takes TRL's keyword arguments (completions=..., plus the "
                         "dataset's columns; declare **kwargs) and returns one float per completion")
    return fn
