"""The one interface a kind of experiment cell implements: how it says what its arm changes,
and how it runs.

Two kinds today: a program of workloads/ run to completion (runner.PROGRAM) and a server with
its client (apps/cell.APP). runner.run_cell prepares the run directory and the result record
the same way for both, then hands the cell to its kind; neither kind imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from damon_hp.experiment.arms import RunState
    from damon_hp.experiment.context import Context
    from damon_hp.experiment.results import RunResult
    from damon_hp.experiment.spec import ArmOptions, Cell


@dataclass(frozen=True)
class CellKind:
    name: str
    mechanism: Callable[[Cell, bool, ArmOptions], str]
    """(cell, in a VM, the arm's options) -> what the arm does to the memory, for the record"""
    execute: Callable[[Context, Cell, RunState, RunResult], None]
    """runs the cell and fills the result; raises DamonHpError or OSError on a failed run"""
