"""How the experiment runner takes Ctrl-C, SIGTERM and SIGHUP: all three end a run the same clean
way (the cell's ExitStack kills its process tree and removes what the arm made)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from damon_hp.errors import DamonHpError


class Interrupted(DamonHpError):
    exit_code = 130


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (and SIGHUP) take the same clean-up path as Ctrl-C."""
    old = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block ends, then raise KeyboardInterrupt.

    For starting a child and registering its clean-up: interrupted between the fork and the
    registration (inside Popen, which waits for the exec), the runner lost the child and left
    it running (a fresh-clone run's Ctrl-C test, 2026-11-23). A child's exec resets the
    handlers, so it is not affected.
    """
    got: list[int] = []

    def note(signum: int, _frame: object) -> None:
        got.append(signum)

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, note) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if got:
        raise KeyboardInterrupt(f"signal {got[0]}")
