"""Whether this process runs inside damon-hp's throwaway test VM, and the guard for actions
that are allowed only there (global THP modes, stopping kdamonds damon-hp did not start).

The VM launcher (testvm.py) sets DAMON_HP_IN_VM=1 for everything it runs; nothing else does.
"""

from __future__ import annotations

import os

from damon_hp.errors import EnvironmentProblem


def in_vm() -> bool:
    return os.environ.get("DAMON_HP_IN_VM") == "1"


def require_vm(what: str) -> None:
    """Refuse `what` outside the test VM, whatever the caller wants."""
    if not in_vm():
        raise EnvironmentProblem(
            f"refusing to {what} outside the test VM (DAMON_HP_IN_VM is not 1): on a real "
            "machine that belongs to its administrator"
        )
