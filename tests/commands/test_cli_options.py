"""Every numeric CLI option rejects a value outside its range with argparse's error: exit code 2 and a message
naming the option and what it accepts (the table is every such option of every command, read from the
parser itself, so a new option is covered as soon as it uses one of the range types)."""

import argparse

import pytest

from keepsight.cli import build_parser
from keepsight.commands.options import nonneg_float, nonneg_int, positive_float, positive_int, run_name

NAMES = ["../../x", "", ".", "..", "a/b", "-x"]


def bad_values(kind) -> list[str] | None:
    """Values outside what an option type accepts (its declared range), or None for other types."""
    if kind is run_name:
        return NAMES
    accepts = getattr(kind, "accepts", None)
    if accepts is None:
        return None
    if accepts[0] == "int":
        _, low, high = accepts
        return [str(low - 1), str(low - 5), "1.5", "nan", "x", "1e12", *([str(high + 1)] if high is not None else [])]
    _, low, open_low = accepts
    return [str(low - 1), "nan", "inf", "-inf", "x", *([str(low)] if open_low else [])]


GOOD = {positive_int: "3", nonneg_int: "0", positive_float: "0.5", nonneg_float: "0", run_name: "ok-1.run"}


def _commands(parser, prefix=()):
    """(argv prefix, subparser) for every leaf command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))
            return
    yield prefix, parser


def _cases():
    for prefix, parser in _commands(build_parser()):
        required = []
        for a in parser._actions:
            if a.required and a.option_strings:
                required += [a.option_strings[0], "1" if bad_values(a.type) else str(a.choices[0] if a.choices else "x")]
            elif a.required and not a.option_strings:  # a positional (bench NAME)
                required.append(str(list(a.choices)[0]) if a.choices else "x")
        for a in parser._actions:
            if bad_values(a.type) and a.option_strings:
                for bad in bad_values(a.type):
                    nargs = a.nargs if isinstance(a.nargs, int) else 1
                    yield pytest.param(prefix, required, a, bad, nargs, id=f"{' '.join(prefix)} {a.option_strings[0]}={bad}")


CASES = list(_cases())


def test_the_table_covers_every_command_with_numbers():
    covered = {" ".join(c.values[0]) for c in CASES}
    assert {"world build", "world train", "world eval", "diagnose", "pvm train", "lora train", "bridge train",
            "diffusion train", "bench", "demo"} <= covered
    assert len(CASES) > 150


@pytest.mark.parametrize("prefix, required, action, bad, nargs", CASES)
def test_a_bad_value_is_an_error_naming_the_option(prefix, required, action, bad, nargs, capsys):
    argv = [*prefix, *required, action.option_strings[0], *([bad] * nargs)]
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {'/'.join(action.option_strings)}" in err and "expected" in err, err


@pytest.mark.parametrize("kind", list(GOOD))
def test_good_values_pass(kind):
    assert kind(GOOD[kind]) is not None
