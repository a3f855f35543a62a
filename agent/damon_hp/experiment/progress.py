"""Progress bar with ETA on stderr: one redrawn line on a terminal, one line per run otherwise
(inside the VM stderr is a file streamed to the host, where a redrawn line would be noise)."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Hashable, Iterable
from typing import TextIO

from damon_hp.experiment.spec import Cell, format_duration

BAR_WIDTH = 24


def eta_seconds(remaining: Iterable[Hashable], durations: dict[Hashable, list[float]]) -> float:
    """Expected time for the remaining runs, each estimated by the median of finished runs of
    the same kind (same workload and threads), else by the median of all finished runs."""
    everything = [d for ds in durations.values() for d in ds]
    if not everything:
        return float("nan")
    fallback = statistics.median(everything)
    total = 0.0
    for key in remaining:
        known = durations.get(key)
        total += statistics.median(known) if known else fallback
    return total


def _kind(cell: Cell) -> tuple[str, int, str]:
    # Arms differ in cost too (the agent's start-up, damo), so they are part of the kind.
    return (cell.workload.name, cell.threads, cell.arm)


class Progress:
    def __init__(self, cells: list[Cell], already_done: int,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total = len(cells) + already_done
        self.done = already_done
        self.todo = list(cells)
        self.durations: dict[Hashable, list[float]] = {}
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self.current: Cell | None = None
        self.t_cell = 0.0

    def _line(self, what: str) -> str:
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * BAR_WIDTH))
        eta = eta_seconds((_kind(c) for c in self.todo), self.durations)
        eta_text = format_duration(eta) if eta == eta else "?"  # NaN until a run finished
        return (f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {self.done}/{self.total} "
                f"{frac:4.0%} ETA {eta_text} | {what}")

    def _emit(self, text: str, final: bool = False) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def start(self, cell: Cell) -> None:
        self.current = cell
        self.t_cell = time.monotonic()
        self._emit(self._line(f"running {cell.id}"))

    def finish(self, cell: Cell, status: str) -> None:
        elapsed = time.monotonic() - self.t_cell
        self.durations.setdefault(_kind(cell), []).append(elapsed)
        if cell in self.todo:
            self.todo.remove(cell)
        self.done += 1
        if not self.tty or status != "ok":
            self._emit(self._line(f"{cell.id}: {status} in {format_duration(elapsed)}"))

    def message(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        total = format_duration(time.monotonic() - self.started)
        self._emit(self._line(f"finished in {total}"), final=True)
