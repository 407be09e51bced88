"""OpenMP's wait policy for keepsight's commands, set before torch loads its OpenMP runtime (libgomp, in torch's
CPU wheel), which reads it once.

libgomp's idle threads spin for a while before they sleep; at 2 threads on 2 cores beside another busy process a
spinning thread takes the time slice its partner needs to finish the region both wait on, and training collapses
(README, "A busy machine"). A shorter spin keeps most of the speed of an idle machine and yields to a neighbour. The
policy changes how threads wait, never what they compute: results are the same bits under any setting.
"""

from __future__ import annotations

import os

SPINCOUNT = "5000"  # spins before an idle OpenMP thread sleeps (libgomp's default: 300,000; README, "A busy machine")
USER_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")  # a user who set either keeps it


def set_wait_policy(environ=os.environ) -> str | None:
    """Set ``GOMP_SPINCOUNT`` to keepsight's default unless the user set it or ``OMP_WAIT_POLICY``; returns the
    value set, or None where the user's setting stands. Effective only before torch is imported."""
    if any(name in environ for name in USER_SETTINGS):
        return None
    environ["GOMP_SPINCOUNT"] = SPINCOUNT
    return SPINCOUNT
