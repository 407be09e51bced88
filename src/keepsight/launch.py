"""The ``keepsight`` console script: OpenMP's wait policy (``keepsight.openmp``, from the threads the command will run
at and the cores free now) set before anything loads torch, and a lower priority beside a pinned keepsight run; then
the command line (``keepsight.cli``)."""

import sys

from .openmp import passive_note, requested_threads, set_wait_policy, yield_note, yield_to_pinned

_threads = requested_threads(sys.argv[1:])
if set_wait_policy(threads=_threads) == "PASSIVE":  # chosen once, for the whole run: say so
    print(passive_note(_threads), file=sys.stderr)
if _pinned := yield_to_pinned(sys.argv[1:]):
    print(yield_note(_pinned), file=sys.stderr)

from .cli import main  # noqa: E402  (torch loads here, after the policy is set)

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
