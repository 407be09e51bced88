"""Command-line options generated from config dataclasses: ``--<prefix>.<field>`` for every field, its value read by
the field's converter (``keepsight.inference.arguments.field_converter``, the one lmms-eval's model arguments use),
its help from the field's comment, its default shown from the dataclass (the one source of it); values are checked by
the config itself when it is built (litgpt's way of exposing configs).

    add_config_options(parser, "pvm", PVMConfig, skip={"layers"})   # --pvm.expander_init zero, --no-pvm.output_norm, ...
    settings = given_settings(args, "pvm", PVMConfig)                 # only what the user gave: {"expander_init": "zero"}

A command's everyday settings take the short spelling (``short``): ``--steps 7`` is the field ``steps`` of the same
config, generated the same way (its default and help the dataclass's), with an argparse type that checks its range
when the command line is parsed.
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import inspect
import re
import types
import typing

from ..inference.arguments import field_converter

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


def _parsed(convert, name: str):
    """An argparse ``type`` from a field's converter (``keepsight.inference.arguments.field_converter``): its
    ValueError becomes argparse's error, which names the option itself ("argument --vcd.alpha: must be ...")."""
    def parse(text: str):
        try:
            return convert(name, text)
        except ValueError as e:
            message = str(e)
            raise argparse.ArgumentTypeError(message.removeprefix(name).lstrip(": ")) from None
    parse.__name__ = name
    return parse


def _option_kwargs(hint, name: str) -> dict:
    """argparse keywords for the field ``name`` annotated ``hint``, values converted by the field's converter (the
    same as lmms-eval's model arguments); ``post`` turns a list of words (``nargs``) into the field's value."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    if hint is bool or (union and args == [bool]):
        return {"action": argparse.BooleanOptionalAction}
    if union and len(args) == 1:  # X | None: a value is given, None is the default of an option not given
        hint = args[0]
        args, union = [a for a in typing.get_args(hint) if a is not type(None)], False
    convert = field_converter(hint)
    origins = {typing.get_origin(a) for a in ([hint] if not union else args)}
    if origins & {list, tuple, set, frozenset, collections.abc.Iterable}:  # several words: "strided" or 8 16 24
        if union:  # a single word stays the word, numbers become a list
            return {"nargs": "+", "metavar": "VALUE", "post": lambda v: convert(name, v[0] if len(v) == 1 else v)}
        # list[int], tuple[float, ...]: each word converted as argparse parses it, the field's container after
        return {"nargs": "+", "type": _parsed(field_converter(args[0] if args else str), name),
                "post": typing.get_origin(hint)}
    if hint is dict or typing.get_origin(hint) is dict:
        return {"type": _parsed(convert, name), "metavar": "JSON"}
    return {"type": _parsed(convert, name)}


def _dest(prefix: str, name: str) -> str:
    return f"config__{prefix}__{name}"


def _shown(f: dataclasses.Field):
    default = _default(f)
    return default if not isinstance(default, (tuple, list, frozenset, set)) else list(default)


def short_option(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_config_options(parser, prefix: str, cls, *, skip=(), short: dict | None = None, title: str | None = None,
                       note: str = "") -> None:
    """Add ``--<prefix>.<field>`` for every init field of the dataclass ``cls`` not in ``skip`` (in a group
    titled ``title``); unset options leave the config's default. ``short`` maps fields to their short spelling's
    argparse type (``{"steps": positive_int}``: ``--steps``, its range checked at parse time; None: the field's
    converter), listed first. ``cls`` may also be ``{label: dataclass}``, for a command whose one spelling of a
    setting reaches whichever of several configs a run builds (``keepsight pvm train``'s two stages): one option per
    field name, its help giving each config's default (or the configs it applies to); read it with
    ``given_settings`` for the config the run builds."""
    short = short or {}
    classes = cls if isinstance(cls, dict) else {None: cls}
    found: dict[str, list] = {}  # field name -> [(label, field, annotation, comment)] over the classes that have it
    for label, klass in classes.items():
        hints, comments = typing.get_type_hints(klass), field_comments(klass)
        for f in dataclasses.fields(klass):
            if f.init and f.name not in skip:
                found.setdefault(f.name, []).append((label, f, hints[f.name], comments.get(f.name, "")))
    unknown = sorted(set(short) - set(found))
    if unknown:
        raise TypeError(f"short options {unknown}: not init fields of {[c.__name__ for c in classes.values()]}")
    group = parser.add_argument_group(title or f"{next(iter(classes.values())).__name__} (--{prefix}.FIELD)",
                                      note or None)
    parser.set_defaults(**{_dest(prefix, ".short"): tuple(short)})  # read by option_names
    for name, where in sorted(found.items(), key=lambda item: item[0] not in short):
        _, f, hint, text = where[0]
        if any(c != text for _, _, _, c in where):  # each config's own comment, named
            text = "; ".join(f"{label}: {c}" for label, _, _, c in where if c)
        if any(h != hint for _, _, h, _ in where):
            raise TypeError(f"--{prefix}.{name}: the configs annotate it differently ({[h for _, _, h, _ in where]})")
        option = short_option(name) if name in short else f"--{prefix}.{name}"
        kwargs = _option_kwargs(hint, option)
        kwargs.pop("post", None)
        if short.get(name) is not None:
            kwargs["type"] = short[name]
        if kwargs.get("action") is None:
            kwargs.setdefault("metavar", name.upper())
        shown = [(label, _shown(g)) for label, g, _, _ in where]
        every = len(where) == len(classes)
        if every and all(v == shown[0][1] for _, v in shown):
            default = f"(default: {shown[0][1]})"
        else:  # "(default: sft 0.0001, grpo 1e-06)", "(default: grpo 0.04; grpo only)"
            default = (f"(default: {', '.join(f'{label} {v}' for label, v in shown)}"
                       f"{'' if every else '; ' + ' and '.join(label for label, _ in shown) + ' only'})")
        required = name in short and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required:
            default = "(required)"
        group.add_argument(option, dest=_dest(prefix, name), default=None, required=required,
                           help=f"{text} {default}".strip().replace("%", "%%"), **kwargs)


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
        post = _option_kwargs(hints[f.name], f"--{prefix}.{f.name}").get("post")
        out[f.name] = post(value) if post is not None else value
    return out


def option_names(prefix: str, settings: dict, args=None) -> str:
    """The options that gave ``settings``, as the command spells them (``args``: the parsed command line, whose
    short options are spelled ``--field-name``)."""
    short = getattr(args, _dest(prefix, ".short"), ()) if args is not None else ()
    return ", ".join(short_option(k) if k in short else f"--{prefix}.{k}" for k in settings)
