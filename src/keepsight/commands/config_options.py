"""Command-line options generated from config dataclasses: ``--<prefix>.<field>`` for every field, its type from
the annotation, its help from the field's comment, its default shown from the dataclass (the one source of it);
values are checked by the config itself when it is built (litgpt's way of exposing configs).

    add_config_options(parser, "pvm", PVMConfig, skip={"layers"})   # --pvm.normalize_v rms, --pvm.key_proj, ...
    settings = given_settings(args, "pvm", PVMConfig)                 # only what the user gave: {"normalize_v": "rms"}
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
import typing

from ..inference.arguments import json_object

_FIELD = re.compile(r"^\s+(\w+)\s*:[^#]*?(?:#\s*(.*))?$")
_CONTINUATION = re.compile(r"^\s+#\s{2,}(.*)$")  # "#" and two or more spaces: the comment above goes on
_ABOVE = re.compile(r"^\s+#\s(\S.*)$")  # "# text": a comment over the next field (or over a group of fields)


def field_comments(cls) -> dict[str, str]:
    """``{field: its help}`` for ``cls`` and its bases: the comment on the field's line with the indented comment
    lines right below it (``#   more``), or, for a field with none, the comment lines right above it."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        current, above = None, []
        for line in lines:
            m = _FIELD.match(line)
            if m and not line.strip().startswith(("def ", "return", "#")):
                current = m.group(1)
                if m.group(2):
                    out[current] = m.group(2).strip()
                elif above:
                    out[current] = " ".join(above)
                above = []
                continue
            c = _CONTINUATION.match(line)
            if c and current in out:
                out[current] += " " + c.group(1).strip()
                continue
            a = _ABOVE.match(line)
            above = [*above, a.group(1).strip()] if a else []
            current = None
    return out


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _scalar(kind):
    """An argparse ``type`` for one value of ``kind`` (int, float, str), with a message naming what it expects."""
    def convert(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
    convert.__name__ = kind.__name__
    return convert


def _json_object(text: str) -> dict:
    try:
        return json_object("", text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _option_kwargs(hint) -> dict:
    """argparse keywords for a field annotated ``hint``; ``post`` turns the parsed value into the field's."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if len(args) == 1:
            return _option_kwargs(args[0])
        if str in args and any(typing.get_origin(a) in (list, tuple) for a in args):  # "strided" or [8, 16, 24]
            return {"nargs": "+", "metavar": "VALUE",
                    "post": lambda v: [int(x) for x in v] if all(re.fullmatch(r"-?\d+", x) for x in v) else
                    (v[0] if len(v) == 1 else v)}
        return {"type": str}
    if origin in (list, tuple, set, frozenset):
        elem = args[0] if args else str
        return {"nargs": "+", "type": _scalar(elem if elem in (int, float) else str), "post": origin}
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if hint in (int, float, str):
        return {"type": _scalar(hint)}
    if hint is dict or origin is dict:
        return {"type": _json_object, "metavar": "JSON"}
    return {"type": str}


def _dest(prefix: str, name: str) -> str:
    return f"config__{prefix}__{name}"


def add_config_options(parser, prefix: str, cls, *, skip=(), title: str | None = None, note: str = "") -> None:
    """Add ``--<prefix>.<field>`` for every init field of the dataclass ``cls`` not in ``skip`` (in a group
    titled ``title``); unset options leave the config's default."""
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    group = parser.add_argument_group(title or f"{cls.__name__} (--{prefix}.FIELD)", note or None)
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        kwargs = _option_kwargs(hints[f.name])
        kwargs.pop("post", None)
        if kwargs.get("action") is None:
            kwargs.setdefault("metavar", f.name.upper())
        default = _default(f)
        shown = default if not isinstance(default, (tuple, list, frozenset, set)) else list(default)
        text = comments.get(f.name, "")
        group.add_argument(f"--{prefix}.{f.name}", dest=_dest(prefix, f.name), default=None,
                           help=f"{text} (default: {shown})".strip().replace("%", "%%"), **kwargs)


def given_settings(args, prefix: str, cls, *, skip=()) -> dict:
    """``{field: value}`` of the ``--<prefix>.<field>`` options the user gave (converted to the field's type)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        value = getattr(args, _dest(prefix, f.name), None)
        if value is None:
            continue
        post = _option_kwargs(hints[f.name]).get("post")
        out[f.name] = post(value) if post is not None else value
    return out


def option_names(prefix: str, settings: dict) -> str:
    return ", ".join(f"--{prefix}.{k}" for k in settings)
