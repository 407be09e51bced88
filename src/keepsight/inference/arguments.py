"""Arguments as users give them (typed, or strings: lmms-eval's ``--model_args``, gen_kwargs), converted with
errors that name the argument.

lmms-eval turns "true"/"false" into bools and numbers into int/float; called directly, values may be any
of those or the raw strings. ``fix_settings`` reads MPS / MRS settings given as ``true``, a JSON object or
flat ``mps_k=3`` style arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

from ..checks import number, requirement


def as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def as_int(name: str, value: Any, minimum: int | None = None) -> int:
    out = None
    if isinstance(value, int) and not isinstance(value, bool):
        out = value
    elif isinstance(value, float) and value.is_integer():
        out = int(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            out = int(value.strip())
    if out is None:
        raise ValueError(f"{name} must be {requirement(minimum, integer=True)}, got {value!r}")
    return number(name, out, minimum, integer=True)


def as_float(name: str, value: Any, minimum: float | None = None) -> float:
    out = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            out = float(value.strip())
    if out is None:
        raise ValueError(f"{name} must be {requirement(minimum)}, got {value!r}")
    return number(name, out, minimum)


def as_str(name: str, value: Any) -> str:
    if isinstance(value, (str, Path)) and str(value).strip():
        return str(value).strip()
    raise ValueError(f"{name} must be a non-empty string, got {value!r}")


def as_choice(name: str, value: Any, choices) -> str:
    v = str(value).strip().lower() if isinstance(value, str) else value
    if v not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return v


def as_list(name: str, value: Any) -> list:
    """A JSON list (``[-1,-2]``), a ``;``- or ``+``-separated string, a single value, or a list."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            try:
                out = json.loads(s)
            except json.JSONDecodeError as e:
                raise ValueError(f"{name}: {value!r} is not a JSON list ({e})") from None
            if not isinstance(out, list):
                raise ValueError(f"{name} must be a list, got {value!r}")
            return out
        return [p.strip() for p in s.replace("+", ";").split(";") if p.strip()]
    return [value]


def int_list(name: str, value: Any) -> list[int]:
    return [as_int(name, v) for v in as_list(name, value)]


def _word_or(convert):
    """A converter for ``str | list[...]`` fields: a single word stays the word ("final", "all"), anything else is
    a list converted by ``convert``."""
    def word_or_list(name: str, value: Any):
        if isinstance(value, str) and value.strip().isidentifier():
            return value.strip().lower()
        return convert(name, value)
    return word_or_list


_SCALARS = {int: as_int, float: as_float, bool: as_bool, str: as_str}


def _or_none(convert):
    """A converter for ``X | None`` fields: None, "none" or "null" is None, anything else ``convert``'s."""
    def optional(name: str, value: Any):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            return None
        return convert(name, value)
    return optional


def _sequence(origin, element):
    """A converter for ``list[X]`` / ``tuple[X, ...]`` fields: a list, or a string ``as_list`` reads, each element
    converted; the field's own container type back."""
    convert = _SCALARS.get(element, as_str)

    def sequence(name: str, value: Any):
        return origin(convert(name, v) for v in as_list(name, value))
    return sequence


def _mapping(name: str, value: Any) -> dict:
    if isinstance(value, dict):
        return value
    return json_object(name, as_str(name, value))


def field_converter(hint):
    """``convert(name, value)`` for a config field annotated ``hint``: the one converter from a field to a value,
    for lmms-eval's ``--model_args`` (strings or typed values) and the command line's ``--<prefix>.<field>``
    options alike. ``X | None`` takes "none" / "null" as None; ``str | list[...]`` a word or a list."""
    if hint in _SCALARS:
        return _SCALARS[hint]
    if hint is dict or typing.get_origin(hint) is dict:
        return _mapping
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if origin in (list, tuple, set, frozenset):
        return _sequence(origin, args[0] if args else str)
    if origin in (typing.Union, types.UnionType):
        if len(args) == 1:
            return _or_none(field_converter(args[0]))
        if str in args:  # str | list[int] or str | Iterable[str]
            inner = [typing.get_args(a)[0] for a in args if a is not str and typing.get_args(a)]
            if inner and inner[0] is int:
                return _word_or(int_list)
            return _word_or(lambda n, v: [as_str(n, x) for x in as_list(n, v)])
    raise TypeError(f"no argument converter for {hint!r}")


def config_keys(cls, only=None) -> dict:
    """``{field: converter(name, value)}`` for every init field of the config dataclass ``cls`` (those in ``only``
    when given), from its annotation (the config checks the values themselves when it is built)."""
    hints = typing.get_type_hints(cls)
    return {f.name: field_converter(hints[f.name]) for f in dataclasses.fields(cls)
            if f.init and (only is None or f.name in only)}


def json_object(name: str, text: str) -> dict:
    """``text`` as a JSON object of settings, each key given once; anything else is a ValueError naming ``name``
    (an empty ``name``: the message names only the text, for argparse, which names the option itself)."""
    where = f"{name}: " if name else ""

    def once(pairs: list) -> dict:
        keys = [k for k, _ in pairs]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"{where}settings {twice} given twice; give each once")
        return dict(pairs)

    try:
        value = json.loads(text, object_pairs_hook=once)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}{text!r} is not a JSON object ({e.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}expected a JSON object of settings, got {text!r}")
    return value


def fix_settings(name: str, value: Any, flat: dict, keys: dict, defaults: dict) -> dict | None:
    """``mps`` / ``mrs``: None/false = off, true = defaults, a dict or JSON object = settings; ``flat``
    (``mps_lam=...``) entries override and switch the fix on unless it was explicitly turned off."""
    settings: dict | None
    if value is None:
        settings = dict(defaults) if flat else None
    elif isinstance(value, dict):
        settings = {**defaults, **value}
    elif isinstance(value, str) and value.strip().startswith("{"):
        settings = {**defaults, **json_object(name, value)}
    else:
        settings = dict(defaults) if as_bool(name, value) else None
        if settings is None and flat:
            raise ValueError(f"{name}=false contradicts {sorted(f'{name}_{k}' for k in flat)}")
    if settings is None:
        return None
    settings.update(flat)
    unknown = sorted(set(settings) - set(keys))
    if unknown:
        raise ValueError(f"{name}: unknown setting(s) {unknown}; known: {sorted(keys)}")
    return {k: keys[k](f"{name}.{k}", v) for k, v in settings.items()}


def _scalar(value):
    """A model-argument string as a JSON scalar or list when it reads as one (1.0, true, [2, 3]), else as is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def baseline_settings(as_json, flat: dict) -> dict:
    """A baseline's settings from ``baseline_args`` (a JSON object or a dict) and flat ``baseline_*`` arguments."""
    settings = {}
    if as_json is not None:
        value = json_object("baseline_args", as_json) if isinstance(as_json, str) else as_json
        if not isinstance(value, dict):
            raise ValueError(f"baseline_args must be a JSON object, got {as_json!r}")
        settings.update(value)
    settings.update({k: _scalar(v) for k, v in flat.items()})
    return settings


DECODING_KEYS = ("until", "do_sample", "max_new_tokens", "min_new_tokens", "temperature", "num_beams", "top_p", "top_k")


def decoding_settings(gen_kwargs, max_new_tokens: int) -> dict:
    """Decoding settings from lmms-eval-style ``gen_kwargs``: ``until`` (a list), ``do_sample``, ``max_new_tokens``
    (``max_new_tokens`` when not given), ``temperature``, ``num_beams`` and, when given, ``top_p`` / ``top_k`` and
    ``min_new_tokens`` (no end of sequence before that many tokens: what a benchmark asks to time a fixed length).
    Greedy unless ``temperature > 0`` or ``do_sample``."""
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
         "max_new_tokens": as_int("max_new_tokens", max_new_tokens if gk.get("max_new_tokens") is None
                                  else gk["max_new_tokens"], 1),
         "temperature": temperature if temperature is not None else (1.0 if do_sample else 0.0),
         "num_beams": as_int("num_beams", gk.get("num_beams") or 1, 1)}
    if gk.get("top_p") is not None:
        s["top_p"] = as_float("top_p", gk["top_p"], 0.0)
    if gk.get("top_k") is not None:
        s["top_k"] = as_int("top_k", gk["top_k"], 0)
    if gk.get("min_new_tokens") is not None:
        s["min_new_tokens"] = as_int("min_new_tokens", gk["min_new_tokens"], 0)
        if s["min_new_tokens"] > s["max_new_tokens"]:
            raise ValueError(f"min_new_tokens {s['min_new_tokens']} is more than max_new_tokens {s['max_new_tokens']}")
    return s
