"""The ``keepsight`` console script: OpenMP's wait policy (``keepsight.openmp``, from the threads the command will run
at and the cores free now) set before anything loads torch, then the command line (``keepsight.cli``)."""

import sys

from .openmp import requested_threads, set_wait_policy

set_wait_policy(threads=requested_threads(sys.argv[1:]))

from .cli import main  # noqa: E402  (torch loads here, after the policy is set)

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
