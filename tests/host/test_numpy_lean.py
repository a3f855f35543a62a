"""numpy_lean loads numpy without OpenBLAS's threads and leaves the environment as it was (the
workload `damon-hp run` starts inherits it)."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = ("import os; import damon_hp.numpy_lean; "
         "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))")


def probe(env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_one_thread_and_the_environment_as_it_was() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert probe(env) == "1 None"
    assert probe({**env, "OPENBLAS_NUM_THREADS": "2"}) == "1 2"  # put back, not dropped
