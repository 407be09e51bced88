"""``keepsight.openmp``: the console script sets OpenMP's wait policy before torch loads, and leaves a user's."""

import os
import subprocess
import sys

from keepsight.openmp import SPINCOUNT, set_wait_policy

PROBE = ("import sys, os; assert 'torch' not in sys.modules; import keepsight.launch; "
         "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))")


def _probe(**env) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    return subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_console_script_sets_the_spin_count_unless_the_user_did():
    assert _probe() == f"{SPINCOUNT} None"
    assert _probe(GOMP_SPINCOUNT="300000") == "300000 None"
    assert _probe(OMP_WAIT_POLICY="PASSIVE") == "None PASSIVE"


def test_set_wait_policy_on_a_mapping():
    env: dict = {}
    assert set_wait_policy(env) == SPINCOUNT and env == {"GOMP_SPINCOUNT": SPINCOUNT}
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert set_wait_policy(env) is None and env == {"OMP_WAIT_POLICY": "ACTIVE"}
