"""What one experiment run carries from cell to cell: its spec, output directory, earlier output
directories to resume from, memory limits fixed once, progress line, and what outlives a cell."""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from damon_hp.experiment.progress import Progress
from damon_hp.experiment.results import RunResult, load_runs, run_path
from damon_hp.experiment.spec import Cell, Experiment

ERROR = "error"  # the runner could not run the cell; retried on resume


def group_key(cell: Cell) -> str:
    return f"{cell.workload.name}_t{cell.threads}"


@dataclass
class Context:
    exp: Experiment
    out: Path
    previous: list[Path] = field(default_factory=list)
    vm: bool = False
    limits: dict[str, int] = field(default_factory=dict)
    progress: Progress | None = None
    tlb: bool = False  # a PMU is there: count TLB misses with perf
    # what outlives one run and is removed when the experiment ends or is interrupted (app
    # seed data directories)
    resources: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _app_data: Path | None = None

    def app_data(self) -> Path:
        """The directory for the apps' shared data (seed data directories), removed at the end."""
        if self._app_data is None:
            self._app_data = self.out / "apps-data"
            shutil.rmtree(self._app_data, ignore_errors=True)
            self._app_data.mkdir(parents=True)
            self.resources.callback(shutil.rmtree, self._app_data, True)
        return self._app_data

    def finished(self) -> dict[str, RunResult]:
        runs: dict[str, RunResult] = {}
        for d in [*self.previous, self.out]:
            if (d / "runs").is_dir():
                for r in load_runs(d):
                    runs[r.cell_id] = r
        return runs


def is_done(ctx: Context, cell: Cell) -> bool:
    for d in [ctx.out, *ctx.previous]:
        p = run_path(d, cell.id)
        if p.exists():
            try:
                status = json.loads(p.read_text()).get("status")
            except (OSError, json.JSONDecodeError):
                continue
            if status != ERROR:
                return True
    return False
