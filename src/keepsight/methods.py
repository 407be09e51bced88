"""The method registry: every method keepsight can run at inference time, each registered once, by the package
that holds it (a baseline's module, ``keepsight.diffusion``'s MPS and MRS; the model-side methods, which
``keepsight.inference.Pipeline`` sets up while loading, by ``keepsight.pvm``, ``keepsight.bridge`` and
``keepsight.diffusion``'s sampler, and ``none`` by ``keepsight.inference``).

A method is one of two stages:

- ``"load"``: part of the model itself, set up when the checkpoint loads: ``none`` (the checkpoint as it is),
  ``pvm`` (a Persistent Visual Memory adapter directory attached), ``bridge`` (a LIA-MTR-bridged checkpoint,
  checked), ``diffusion`` (a masked-diffusion VLM, decoded by the LLaDA-style sampler).
- ``"decode"``: a training-free method applied around decoding, built from its config dataclass:
  the baselines (VCD, PAI, MemVR, DeCo, OPERA) on autoregressive models, Mask Prior Suppression and
  Monotonic RoPE Scaling on masked-diffusion ones.

A decoding method is any object with ``apply(model)`` (a context manager that installs the method and removes
it on exit) and ``stats()`` (a dict: how often it acted). Its config declares the settings its tests run at:
``ZERO`` (the method leaves decoding unchanged) and ``STRONG`` (it must act), or ``TESTED_BY`` (the test file of a
method those generic tests do not fit, such as a beam search); the tests run every registered method of the
autoregressive family at both on every family row. Adding one is a module that registers itself with one call:

    from dataclasses import dataclass
    from typing import ClassVar
    from keepsight.baselines import Baseline
    from keepsight.methods import register_method

    @dataclass
    class DampConfig:
        ZERO: ClassVar[dict] = {"factor": 1.0}
        STRONG: ClassVar[dict] = {"factor": 4.0}
        factor: float = 0.5  # multiplies every logit (a temperature on the scores)

    class Damp(Baseline):
        name = "damp"
        def _install(self, model, stack):
            self._logits_hook(model, stack, lambda kwargs, logits, prefill: logits * self.config.factor)

    register_method("damp", DampConfig, Damp, family="autoregressive", needs="nothing")

A package outside keepsight declares that module under the ``keepsight.methods`` entry point group (in its
``pyproject.toml``: ``[project.entry-points."keepsight.methods"] damp = "damp"``); ``keepsight.inference`` imports
every module declared there (``load_method_packages``), so the method reaches the command line and lmms-eval with no
file of keepsight's touched. Once registered (or imported in your own script),
``keepsight.inference.Pipeline(..., baseline="damp")`` decodes with it and reports its stats,
``keepsight.inference.Decoders([("damp", {"factor": 2.0})])`` applies it around any decoding loop, and
``keepsight eval generate`` / ``keepsight world eval`` take ``--damp.factor``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

GROUP = "keepsight.methods"  # the entry point group of the modules that register methods

STAGES = ("load", "decode")
MODEL_SIDE = ("none", "pvm", "bridge", "diffusion")  # the "load" methods: Pipeline sets each up while loading
FAMILIES = ("autoregressive", "diffusion")


@dataclass(frozen=True)
class Method:
    """One registry entry. A decoding method: ``build(config) -> method object``; ``prepare(obj, model, tokenizer)``
    runs once after the model loads (MPS fits its prior there); ``enter(obj, model, prompt_len)`` returns the context
    manager that applies it around one batch's decoding (default: ``obj.apply(model)``). A model-side method:
    ``check(spec, kind, where)`` refuses a checkpoint it cannot run on (``spec``: its row of the architecture
    table) before the load; ``attach(model, pipe)`` sets it up on the loaded model; ``takes`` names the Pipeline
    settings that only it takes, ``requires`` those it cannot run without."""

    name: str
    stage: str  # "load" (part of the model) or "decode" (applied around decoding)
    family: str  # "autoregressive" or "diffusion": the models it runs on
    needs: str  # what it needs beyond a checkpoint of its family, in words (docs and errors)
    config: type | None = None  # the settings dataclass (decode stage); its fields are the method's settings
    build: Callable | None = None
    prepare: Callable | None = None
    enter: Callable | None = None
    check: Callable | None = None
    attach: Callable | None = None
    takes: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()

    @property
    def zero(self) -> dict | None:
        """Settings at which the method leaves decoding unchanged (its config's ``ZERO``; None: not declared)."""
        return getattr(self.config, "ZERO", None)

    @property
    def strong(self) -> dict | None:
        """Settings at which the method must act on any model of its family (its config's ``STRONG``)."""
        return getattr(self.config, "STRONG", None)

    @property
    def tested_by(self) -> str | None:
        """Where a method the generic tests do not fit is tested instead (its config's ``TESTED_BY``)."""
        return getattr(self.config, "TESTED_BY", None)

    def make(self, settings: dict | None = None, model=None, tokenizer=None):
        """The method object with ``settings`` (the config's fields; unknown or bad ones are ValueErrors naming the
        method), prepared on ``model`` when given."""
        if self.stage != "decode":
            raise ValueError(f"{self.name} is part of the model (stage {self.stage!r}); it has no decoding object")
        try:
            obj = self.build(self.config(**(settings or {})))
        except TypeError as e:
            fields = sorted(f.name for f in dataclasses.fields(self.config))
            raise ValueError(f"{self.name}: {e} (its settings: {fields})") from None
        if model is not None and self.prepare is not None:
            self.prepare(obj, model, tokenizer)
        return obj

    def applied(self, obj, model, prompt_len: int | None) -> contextlib.AbstractContextManager:
        """The context manager that applies ``obj`` to ``model`` for a batch whose prompts are ``prompt_len`` long."""
        return self.enter(obj, model, prompt_len) if self.enter is not None else obj.apply(model)


METHODS: dict[str, Method] = {}


def register_method(name: str, config: type | None = None, build: Callable | None = None, *,
                    stage: str = "decode", family: str = "autoregressive", needs: str = "nothing",
                    prepare: Callable | None = None, enter: Callable | None = None, check: Callable | None = None,
                    attach: Callable | None = None, takes: tuple[str, ...] = (), requires: tuple[str, ...] = (),
                    replace: bool = False) -> Method:
    """Register a method once under ``name`` (see the module docstring and ``Method``); returns its entry. A decoding
    method needs its ``config`` dataclass and ``build`` (``config -> method object``, e.g. the method's class); a
    second registration of a name is an error unless ``replace``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a method name must be an identifier, got {name!r}")
    if name in METHODS and not replace:
        raise ValueError(f"method {name!r} is already registered; pass replace=True to replace it")
    if name in METHODS and METHODS[name].stage == "load":
        raise ValueError(f"method {name!r} is one of keepsight's model-side methods (Pipeline sets it up while "
                         "loading); it cannot be replaced")
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if stage == "load" and name not in MODEL_SIDE:  # Pipeline sets up only its own: another would be the plain model
        raise ValueError(f"method {name!r}: stage 'load' is for keepsight's model-side methods {list(MODEL_SIDE)}, "
                         "which Pipeline sets up while loading; register a decoding method (stage 'decode', a config "
                         "dataclass and build) instead")
    if stage == "load" and any(v is not None for v in (config, build, prepare, enter)):
        raise ValueError(f"method {name!r}: config, build, prepare and enter apply to decoding methods (stage "
                         "'decode')")
    if stage == "decode" and (check is not None or attach is not None or takes or requires):
        raise ValueError(f"method {name!r}: check, attach, takes and requires apply to model-side methods (stage "
                         "'load')")
    if not set(requires) <= set(takes):
        raise ValueError(f"method {name!r}: requires {sorted(set(requires) - set(takes))}, which it does not take")
    clash = next((m for m, e in METHODS.items() if m != name and e.stage == "decode" and e.family == "diffusion"
                  and (m.startswith(f"{name}_") or name.startswith(f"{m}_"))), None)
    if stage == "decode" and family == "diffusion" and clash:  # only diffusion methods take NAME_FIELD arguments
        raise ValueError(f"method {name!r}: its settings' flat names ({name}_FIELD, lmms-eval's model arguments) could "
                         f"not be told from those of the registered method {clash!r}; register it under another name")
    for what, fn in (("check", check), ("attach", attach)):
        if fn is not None and not callable(fn):
            raise ValueError(f"method {name!r}: {what} must be callable, got {fn!r}")
    if stage == "decode":
        if not isinstance(config, type) or not dataclasses.is_dataclass(config):
            raise ValueError(f"decoding method {name!r} needs a config dataclass (the class), got {config!r}")
        for what, fn in (("build", build), ("prepare", prepare), ("enter", enter)):
            if (fn is not None or what == "build") and not callable(fn):
                raise ValueError(f"decoding method {name!r}: {what} must be callable, got {fn!r}")
    entry = Method(name, stage, family, needs, config, build, prepare, enter, check, attach, tuple(takes),
                   tuple(requires))
    METHODS[name] = entry
    return entry


def get_method(name: str, stage: str | None = None, family: str | None = None) -> Method:
    """The entry named ``name``; a ValueError listing the choices if there is none (of that stage / family)."""
    entry = METHODS.get(name)
    if entry is None or (stage and entry.stage != stage) or (family and entry.family != family):
        raise ValueError(f"unknown method {name!r}; choose from {method_names(stage, family)}")
    return entry


def build_method(name: str, **settings):
    """The decoding method ``name`` with ``settings`` (its config's fields): ``get_method(name).make(settings)``."""
    return get_method(name, stage="decode").make(settings)


def method_names(stage: str | None = None, family: str | None = None) -> list[str]:
    return sorted(n for n, m in METHODS.items() if (not stage or m.stage == stage) and (not family or m.family == family))


def load_method_packages() -> list[str]:
    """Import every module declared under the ``keepsight.methods`` entry point group (each registers its methods
    when imported); returns the entry points' names. A module that fails to import is an error naming it."""
    names = []
    for ep in entry_points(group=GROUP):
        try:
            importlib.import_module(ep.value.split(":")[0])
        except Exception as e:
            raise ImportError(f"the {GROUP} entry point {ep.name} = {ep.value} did not import: {e}") from e
        names.append(ep.name)
    return names
