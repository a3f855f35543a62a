"""`damon-hp doctor`: what this machine offers damon-hp, read-only.

Two steps, each a module: facts.py gathers (I/O, read-only), checks.py judges (pure), so the
verdict logic is tested on facts recorded on real machines (tests/fixtures/doctor-*.json).
commands/doctor.py prints the result.
"""

from .checks import (
    CAPS,
    LIMITED,
    MISSING,
    OK,
    VM_HINT,
    Check,
    check_sources,
    evaluate,
    exit_code,
    verdict,
)
from .facts import THP, Facts, gather, read_tracefs

__all__ = ["CAPS", "LIMITED", "MISSING", "OK", "THP", "VM_HINT", "Check", "Facts",
           "check_sources", "evaluate", "exit_code", "gather", "read_tracefs", "verdict"]
