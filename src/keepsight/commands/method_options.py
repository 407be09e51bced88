"""The decoding-method options shared by ``eval generate``, ``eval pope`` and ``world eval``, generated from the
method registry (``keepsight.inference.registry``): ``--baseline NAME`` and, for every decoding method, one
``--<method>.<field>`` per field of its config dataclass (``--vcd.alpha 1.0``, ``--mps.k 5``, ``--mrs.beta 0.02``).

A method's settings come from its dotted options and, as before, from one JSON object (``--baseline-args`` /
``--mps JSON`` / ``--mrs JSON``); a field given both ways is an error. A dotted option turns its method on:
``--vcd.alpha 1`` alone means ``--baseline vcd --vcd.alpha 1``, ``--mps.k 5`` means ``--mps --mps.k 5``.
"""

from __future__ import annotations

from ..inference import get_method, method_names
from .config_options import add_config_options, given_settings, option_names
from .options import json_settings

# the diffusion methods that have their own on / off switch (--mps, --mrs) rather than --baseline
SWITCHED = ("mps", "mrs")


def add_method_options(parser, families: tuple[str, ...]) -> None:
    """``--baseline`` / ``--baseline-args`` (autoregressive), and every decoding method's ``--<method>.FIELD``
    options of ``families``, one help group per method."""
    if "autoregressive" in families:
        parser.add_argument("--baseline", choices=method_names("decode", "autoregressive"),
                            help="a training-free decoding baseline (keepsight.baselines) on top of the model; "
                            "its settings are the --<baseline>.FIELD options below")
        parser.add_argument("--baseline-args", metavar="JSON", help="the baseline's settings as one JSON object, "
                            'e.g. \'{"alpha": 1.0}\' (the same as --<baseline>.alpha 1.0)')
    for family in families:
        for name in method_names("decode", family):
            entry = get_method(name)
            turns_on = f"--{name}" if name in SWITCHED else f"--baseline {name}"
            add_config_options(parser, name, entry.config, title=f"{name} settings (--{name}.FIELD)",
                               note=f"{entry.config.__name__}; any of these turns on {turns_on}")


def _merged(name: str, json_option: str, text: str | None, args) -> dict:
    """The settings of method ``name``: its JSON object merged with its dotted options (no field given twice)."""
    from_json = json_settings(json_option, text)
    dotted = given_settings(args, name, get_method(name).config)
    twice = sorted(set(from_json) & set(dotted))
    if twice:
        raise ValueError(f"{option_names(name, {k: None for k in twice})} given both as an option and in "
                         f"{json_option}; give each setting once")
    return {**from_json, **dotted}


def baseline_choice(args) -> tuple[str | None, dict | None]:
    """``(baseline name or None, its settings or None)`` from ``--baseline``, ``--baseline-args`` and the
    ``--<baseline>.FIELD`` options; settings of another baseline than the chosen one are an error."""
    dotted = [n for n in method_names("decode", "autoregressive")
              if given_settings(args, n, get_method(n).config)]
    name = args.baseline
    if name is None and len(dotted) > 1:
        raise ValueError(f"settings of {len(dotted)} baselines given ({', '.join(dotted)}); one baseline at a time")
    if name is None and dotted:
        name = dotted[0]
    others = [n for n in dotted if n != name]
    if others:
        given = option_names(others[0], given_settings(args, others[0], get_method(others[0]).config))
        raise ValueError(f"{given} set {others[0]}, but --baseline is {name}; one baseline at a time")
    if name is None:
        if args.baseline_args:
            raise ValueError("--baseline-args needs --baseline")
        return None, None
    return name, _merged(name, "--baseline-args", args.baseline_args, args)


def switched_settings(args, name: str) -> dict | None:
    """``--mps`` / ``--mrs``: None when neither the switch nor a ``--<name>.FIELD`` option is given, else the
    settings (``{}``: the released defaults)."""
    text = getattr(args, name)
    dotted = given_settings(args, name, get_method(name).config)
    if text is None and not dotted:
        return None
    return _merged(name, f"--{name}", text, args)
