"""The ``keepsight`` console script: OpenMP's wait policy (``keepsight.openmp``) set before anything loads torch,
then the command line (``keepsight.cli``)."""

from .openmp import set_wait_policy

set_wait_policy()

from .cli import main  # noqa: E402  (torch loads here, after the policy is set)

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
