"""Decoding methods by registry name, applied around decoding of a loaded model: what ``Pipeline`` holds, and what
code with its own decoding loop (the world's scoring, the experiments, the benchmarks) applies the same way.

    decoders = Decoders([("mps", {"lam": 0.2}), ("mrs", {})])   # built: bad settings are ValueErrors here
    decoders.prepare(model, tokenizer)                          # once per model (MPS fits its prior)
    with decoders.applied(model, prompt_len):                   # around one batch whose prompts are prompt_len long
        out = diffusion.generate(model, ...)
    decoders.stats()                                            # {"mps": {...}, "mrs": {...}}
"""

from __future__ import annotations

import contextlib

from .registry import Method, get_method


class Decoders:
    """An ordered list of (registry entry, method object); applied in that order (the first is the outermost)."""

    def __init__(self, requests=(), *, family: str | None = None):
        """``requests``: ``(name, settings)`` pairs (settings: a dict of the method config's fields, None or {}
        for its defaults) of ``"decode"`` entries of ``family`` (any when None); in place of a name, a ``Method``
        entry kept outside the registry (our earlier readings, ``keepsight.baselines.readings``)."""
        self.items: list[tuple[Method, object]] = []
        if isinstance(requests, (str, bytes)):
            raise TypeError(f"Decoders takes (name, settings) pairs, got the string {requests!r}: write "
                            f"Decoders([({requests!r}, None)])")
        for request in requests:
            if not isinstance(request, (tuple, list)) or len(request) != 2 or not isinstance(request[0], (str, Method)):
                raise TypeError(f"Decoders takes (name, settings) pairs, got {request!r}")
            name, settings = request
            if not isinstance(name, Method):  # a registry name: get_method checks its stage and family
                self.add(get_method(name, stage="decode", family=family), settings)
                continue
            if name.stage != "decode" or family not in (None, name.family):
                raise ValueError(f"{name.name} is a {name.family} method of stage {name.stage!r}; expected a "
                                 f"decoding method{'' if family is None else ' of family ' + repr(family)}")
            self.add(name, settings)

    def add(self, entry: Method, settings: dict | None = None):
        """Build ``entry``'s method object with ``settings`` and append it; returns the object. A method already
        held is refused (applied twice, its effect would compound)."""
        if entry.name in self.names():
            raise ValueError(f"decoding method {entry.name!r} given twice; give it once, with all its settings")
        obj = entry.make(settings)
        self.items.append((entry, obj))
        return obj

    def prepare(self, model, tokenizer) -> Decoders:
        """Run each method's one-time preparation on ``model`` (e.g. MPS fits its prior subspace)."""
        for entry, obj in self.items:
            if entry.prepare is not None:
                entry.prepare(obj, model, tokenizer)
        return self

    def applied(self, model, prompt_len: int | None = None) -> contextlib.ExitStack:
        """A context manager applying every method to ``model`` for a batch whose prompts are ``prompt_len`` long
        (the first generation column; None where the prompts differ in length: a method that needs it says so);
        every hook and swapped buffer is restored on exit."""
        stack = contextlib.ExitStack()
        try:
            for entry, obj in self.items:
                stack.enter_context(entry.applied(obj, model, prompt_len))
        except BaseException:
            stack.close()
            raise
        return stack

    def stats(self) -> dict:
        """``{method name: its stats()}`` for the methods that report them, after the last batch."""
        return {entry.name: obj.stats() for entry, obj in self.items if hasattr(obj, "stats")}

    def get(self, name: str):
        """The method object registered as ``name`` (a KeyError naming the ones held when there is none)."""
        for entry, obj in self.items:
            if entry.name == name:
                return obj
        raise KeyError(f"no decoding method {name!r} here; held: {self.names()}")

    def names(self) -> list[str]:
        return [entry.name for entry, _ in self.items]

    def __len__(self) -> int:
        return len(self.items)
