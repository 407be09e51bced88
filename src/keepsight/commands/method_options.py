"""The decoding-method options shared by ``eval generate``, ``eval pope`` and ``world eval``, generated from the
method registry (``keepsight.methods``): ``--baseline NAME`` and, for every decoding method, one
``--<method>.<field>`` per field of its config dataclass (``--vcd.alpha 1.0``, ``--mps.k 5``, ``--mrs.beta 0.02``).

A method's settings come from its dotted options and, as before, from one JSON object (``--baseline-args`` /
``--mps JSON`` / ``--mrs JSON``); a field given both ways is an error. A dotted option turns its method on:
``--vcd.alpha 1`` alone means ``--baseline vcd --vcd.alpha 1``, ``--mps.k 5`` means ``--mps --mps.k 5``.
"""

from __future__ import annotations

import dataclasses

from ..diffusion.sampler import USER_SETTINGS, SamplerConfig
from ..inference import get_method, method_names
from .config_options import add_config_options, given_settings, option_names, short_option
from .options import json_settings


def title(entry) -> str:
    """A method's name in words: its config's docstring up to the first " (" or "." ("Mask Prior Suppression")."""
    doc = (entry.config.__doc__ or "").strip()
    if not doc or doc.startswith(f"{entry.config.__name__}("):  # no docstring: the dataclass's generated signature
        return entry.name
    return doc.split(" (")[0].split(".")[0].strip()


def add_method_options(parser, families: tuple[str, ...]) -> None:
    """``--baseline`` / ``--baseline-args`` (autoregressive, one baseline at a time), a ``--<method> [JSON]`` switch
    for each diffusion method (they stack), and every decoding method's ``--<method>.FIELD`` options of ``families``,
    one help group per method. Call it after the command's own options: a method named like one is refused."""
    if "autoregressive" in families:
        parser.add_argument("--baseline", choices=method_names("decode", "autoregressive"),
                            help="a training-free decoding baseline (keepsight.baselines) on top of the model; "
                            "its settings are the --<baseline>.FIELD options below")
        parser.add_argument("--baseline-args", metavar="JSON", help="the baseline's settings as one JSON object, "
                            'e.g. \'{"alpha": 1.0}\' (the same as --<baseline>.alpha 1.0)')
    if "diffusion" in families:
        add_sampler_options(parser)
        for name in method_names("decode", "diffusion"):
            _refuse_taken(parser, name)
            parser.add_argument(f"--{name}", nargs="?", const="{}", metavar="JSON", help=f"diffusion: "
                                f"{title(get_method(name))} (the released defaults, or the --{name}.FIELD options "
                                "below, or their JSON object)")
    for family in families:
        for name in method_names("decode", family):
            entry = get_method(name)
            if family != "diffusion":
                _refuse_taken(parser, name)
            turns_on = f"--{name}" if family == "diffusion" else f"--baseline {name}"
            add_config_options(parser, name, entry.config, title=f"{name} settings (--{name}.FIELD)",
                               note=f"{entry.config.__name__}; any of these turns on {turns_on}")


# options keepsight.cli gives every command after its own
EVERY_COMMAND = ("threads",)


def _refuse_taken(parser, name: str) -> None:
    """A method whose options (``--NAME``, ``--NAME.FIELD``, the value ``NAME``) the command already uses for its own
    is an error naming the method and the module that registered it (argparse would refuse the parser, or the two would
    mix). Called after the command's own options (``add_method_options`` comes last)."""
    taken = sorted(o for o in parser._option_string_actions
                   if o in (f"--{name}", short_option(name)) or o.startswith(f"--{name}."))
    taken += sorted(a.option_strings[0] for a in parser._actions if a.dest == name and a.option_strings)
    taken += [f"--{name}"] * (name in EVERY_COMMAND)
    if taken:
        taken = sorted(set(taken))
        raise ValueError(f"decoding method {name!r} (registered by {get_method(name).config.__module__}): the command "
                         f"uses {', '.join(taken)} itself; register the method under another name")


# the diffusion sampler's fast-decoding settings, as --sampler.FIELD options (the other fields have options of their own)
_SAMPLER_SKIP = tuple(f.name for f in dataclasses.fields(SamplerConfig) if f.name not in USER_SETTINGS)


def add_sampler_options(parser) -> None:
    """``--sampler.FIELD`` for each of ``USER_SETTINGS`` (cache, threshold, threshold_rule, refresh_every, schedule,
    shift, ban_mask)."""
    add_config_options(parser, "sampler", SamplerConfig, skip=_SAMPLER_SKIP,
                       title="diffusion sampler (--sampler.FIELD)",
                       note="keepsight.diffusion.SamplerConfig: cache 'prefix' / 'dual' (ours, after Fast-dLLM), "
                            "'prompt' (LaViDa's Prefix-DLM), a confidence threshold; LaViDa's slots-per-step schedule "
                            "(schedule shift, shift 3); ban_mask (default: the model's released sampler)")


def sampler_settings(args) -> dict:
    """The ``--sampler.FIELD`` options the user gave."""
    return given_settings(args, "sampler", SamplerConfig, skip=_SAMPLER_SKIP)


def _dotted(args, name: str) -> dict:
    """The ``--<name>.FIELD`` options of method ``name`` the user gave."""
    return given_settings(args, name, get_method(name).config)


def _merged(name: str, json_option: str, text: str | None, dotted: dict) -> dict:
    """The settings of method ``name``: its JSON object merged with its dotted options (no field given twice)."""
    from_json = json_settings(json_option, text)
    twice = sorted(set(from_json) & set(dotted))
    if twice:
        raise ValueError(f"{option_names(name, {k: None for k in twice})} given both as an option and in "
                         f"{json_option}; give each setting once")
    return {**from_json, **dotted}


def baseline_choice(args) -> tuple[str | None, dict | None]:
    """``(baseline name or None, its settings or None)`` from ``--baseline``, ``--baseline-args`` and the
    ``--<baseline>.FIELD`` options; settings of another baseline than the chosen one are an error."""
    given = {n: d for n in method_names("decode", "autoregressive") if (d := _dotted(args, n))}
    name = args.baseline
    if name is None and len(given) > 1:
        raise ValueError(f"settings of {len(given)} baselines given ({', '.join(given)}); one baseline at a time")
    if name is None and given:
        name = next(iter(given))
    others = [n for n in given if n != name]
    if others:
        raise ValueError(f"{option_names(others[0], given[others[0]])} set {others[0]}, but --baseline is {name}; "
                         "one baseline at a time")
    if name is None:
        if args.baseline_args:
            raise ValueError("--baseline-args needs --baseline")
        return None, None
    return name, _merged(name, "--baseline-args", args.baseline_args, given.get(name, {}))


def switched_settings(args, name: str) -> dict | None:
    """A diffusion method's switch (``--mps``, ``--mrs``, ...): None when neither the switch nor a
    ``--<name>.FIELD`` option is given, else the settings (``{}``: the released defaults)."""
    text, dotted = getattr(args, name), _dotted(args, name)
    if text is None and not dotted:
        return None
    return _merged(name, f"--{name}", text, dotted)


def diffusion_methods(args) -> dict:
    """``{name: settings}`` of every diffusion method switched on (``switched_settings``), in registry order."""
    return {n: s for n in method_names("decode", "diffusion") if (s := switched_settings(args, n)) is not None}
