"""``keepsight`` command line: assembles the command groups of ``keepsight.commands``."""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
from safetensors import SafetensorError

from .atomic import release_outputs
from .commands import GROUPS
from .commands.options import threads
from .cores import free_cores
from .determinism import busy_note, resolve_threads
from .train.distributed import is_main_process, launch_options


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="keepsight", description="Keep vision-language models looking at the image "
                                "through long generation.")
    sub = p.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_parser(sub)
    _threads_everywhere(p)
    _once(p)
    return p


def _threads_everywhere(parser: argparse.ArgumentParser) -> None:
    """Give every command that has no ``--threads`` of its own (the demo and ``world train`` have one, fixed at the
    published results' count) ``--threads N | auto``, default auto: the cores free when it starts."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subs:
        for child in set(action.choices.values()):
            _threads_everywhere(child)
    if not subs and parser.get_default("func") is not None and "--threads" not in parser._option_string_actions:
        parser.add_argument("--threads", type=threads, default="auto", help="intra-op threads, or auto (default): the "
                            "cores no other process keeps busy when the command starts, at least 1 (results then "
                            "depend on the count chosen; give a number to pin it)")


class _threads:
    """The command's intra-op thread count for its duration (``--threads``, auto resolved), with a warning on stderr
    when other processes keep busy some of the cores it would use; torch's previous count comes back on exit."""

    def __init__(self, args):
        self.args = args

    def __enter__(self):
        self._saved = torch.get_num_threads()
        if getattr(self.args, "threads", None) is None:
            return
        free = free_cores()  # read once: for auto and for the warning
        self.args.threads = resolve_threads(self.args.threads, free)
        torch.set_num_threads(self.args.threads)
        note = busy_note(self.args.threads, free)
        if note:
            print(f"keepsight: warning: {note}", file=sys.stderr)

    def __exit__(self, *exc):
        torch.set_num_threads(self._saved)


# actions that take one value (or a flag): given twice, argparse would keep the last without a word
_SINGLE = (argparse._StoreAction, argparse._StoreConstAction, argparse.BooleanOptionalAction)
_GIVEN = "_keepsight_given"


def _once(parser: argparse.ArgumentParser) -> None:
    """Make every single-valued option of ``parser`` and its subcommands an error when given twice (``--vcd.alpha
    nan --vcd.alpha 1``, ``--pai.amplify_prefill --no-pai.amplify_prefill``): which one was meant is not ours to
    guess. Repeatable options (append / extend / count) are left as they are."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                _once(child)
        elif action.option_strings and isinstance(action, _SINGLE) and not isinstance(action, _Once):
            action.__class__ = type(f"Once{type(action).__name__}", (_Once, type(action)), {})


class _Once:
    """Mixed into an action: records its ``dest`` on the namespace and refuses a second occurrence."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, _GIVEN, None)
        if given is None:
            given = {}
            setattr(namespace, _GIVEN, given)
        if self.dest in given:
            parser.error(f"{option_string} given twice (first as {given[self.dest]}); give it once")
        given[self.dest] = option_string
        super().__call__(parser, namespace, values, option_string)


def _terminate(signum, frame):  # a signal ends the command like an error: every partial output is cleaned up
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if hasattr(args, _GIVEN):
        delattr(args, _GIVEN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, _terminate)
        except (ValueError, OSError):  # not the main thread (e.g. called from a test harness thread)
            pass
    try:
        with _threads(args):
            if getattr(args, "precision", None) is not None:  # a training command
                if not is_main_process():  # under `accelerate launch`, one process prints the summaries
                    sys.stdout = open(os.devnull, "w")  # noqa: SIM115
                with launch_options(args.precision, args.device):
                    return args.func(args)
            return args.func(args)
    except (ValueError, OSError, RuntimeError, SafetensorError) as e:  # FileNotFoundError, a full disk: OSErrors
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"keepsight: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("keepsight: interrupted", file=sys.stderr)
        return 130
    finally:
        release_outputs()  # the outputs this command held (keepsight.atomic.lock_output)


if __name__ == "__main__":
    sys.exit(main())
