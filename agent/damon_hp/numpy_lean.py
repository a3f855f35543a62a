"""numpy, loaded without OpenBLAS's thread pool: `from damon_hp.numpy_lean import np`.

numpy's wheel links OpenBLAS, which starts a thread per core when it is loaded and keeps them
(gotoblas_init reads OPENBLAS_NUM_THREADS then). damon-hp does no linear algebra; on this
host the pool cost ~0.07 s of CPU at every start of the agent, a twentieth of a 4 GiB run's
monitoring (docs/cost.md). The variable is put back afterwards, so the workload `damon-hp
run` starts does not inherit it.
"""

from __future__ import annotations

import os

_VAR = "OPENBLAS_NUM_THREADS"
_saved = os.environ.get(_VAR)
os.environ[_VAR] = "1"
try:
    import numpy as np
finally:
    if _saved is None:
        del os.environ[_VAR]
    else:
        os.environ[_VAR] = _saved

__all__ = ["np"]
