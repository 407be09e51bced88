"""``keepsight`` command line: assembles the command groups of ``keepsight.commands``."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from safetensors import SafetensorError

from .atomic import release_outputs
from .commands import GROUPS
from .train.distributed import is_main_process, launch_options


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="keepsight", description="Keep vision-language models looking at the image "
                                "through long generation.")
    sub = p.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_parser(sub)
    return p


def _terminate(signum, frame):  # a signal ends the command like an error: every partial output is cleaned up
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, _terminate)
        except (ValueError, OSError):  # not the main thread (e.g. called from a test harness thread)
            pass
    try:
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
