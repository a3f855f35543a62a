"""The one reader and writer of DAMON sysfs files (/sys/kernel/mm/damon/admin).

Every byte damon-hp writes under DAMON sysfs goes through `write` here, so one grep shows where
DAMON is written, and a read-only bind mount in a test proves a code path writes nothing.
`turn_off` is the one "write off, then wait until the thread is gone" loop.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import DamonHpError

ADMIN = Path("/sys/kernel/mm/damon/admin")
T = TypeVar("T")

# DAMON sysfs guards nearly every file (`state`, `pid`, the `nr_*` counts, ...) with one global
# mutex that its handlers only try-lock, answering EBUSY while anyone holds it. A running kdamond
# takes it briefly at every aggregation and, on 6.12, holds it for the whole of a tried-regions
# update (up to a few apply intervals); another tool writing a large count (`nr_regions`,
# `nr_schemes`, ...) holds it while the kernel creates or removes every directory. So EBUSY is
# usually transient: each read or write is retried with an exponential back-off, from
# EBUSY_FIRST_DELAY_S doubling up to EBUSY_MAX_DELAY_S between tries, for at most
# EBUSY_RETRY_S of wall time. Past that `DamonBusy` is raised (exit 1): waiting longer would
# stall the agent with no end in sight, and the message says who to wait for.
EBUSY_RETRY_S = 10.0
EBUSY_FIRST_DELAY_S = 0.005
EBUSY_MAX_DELAY_S = 0.25


class DamonBusy(DamonHpError):
    """DAMON sysfs answered EBUSY for longer than EBUSY_RETRY_S."""


# Waits of at least BUSY_NOTABLE_S that ended in success (seconds each): the agent reports them,
# so a run another DAMON user held up says so instead of only being slow. A kdamond holds the
# lock for a moment at every aggregation: waits that short are routine and not kept.
BUSY_NOTABLE_S = 1.0
busy_waits: list[float] = []


def _busy_message(what: str) -> str:
    return (f"damon-hp: DAMON sysfs stayed busy (EBUSY) for {EBUSY_RETRY_S:g} s {what}: another "
            "program holds DAMON's sysfs lock (a long DAMON sysfs operation: another tool "
            "creating or removing many kdamond, region or scheme directories, or a tried-regions "
            "update), or a kdamond runs where none may. damon-hp retries for "
            f"{EBUSY_RETRY_S:g} s per operation; try again when the other DAMON user is done "
            "(`damon-hp status` lists the kdamonds)")


def _exclusive_module_message(what: str) -> str | None:
    """When a DAMON module's exclusive context runs, EBUSY is no lock: say whose it is."""
    from .modules import module_kdamonds  # reads /sys/module only

    running = module_kdamonds()
    if not running:
        return None
    return f"damon-hp: DAMON refused {what} (EBUSY): {running[0].exclusive_message()}"


def retry_ebusy(op: Callable[[], T], what: str) -> T:
    """Run `op`, retrying on EBUSY with the back-off above; DamonBusy past the bound.

    EBUSY while a DAMON module (DAMON_STAT, ...) runs its exclusive context fails at once,
    naming the module: no wait makes it go away (modules.py)."""
    delay = EBUSY_FIRST_DELAY_S
    started = None
    while True:
        try:
            result = op()
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            if started is None and (msg := _exclusive_module_message(what)) is not None:
                raise DamonBusy(msg) from e
            now = time.monotonic()
            if started is None:
                started = now
            elif now - started >= EBUSY_RETRY_S:
                raise DamonBusy(_busy_message(what)) from e
            time.sleep(min(delay, max(0.0, started + EBUSY_RETRY_S - now)))
            delay = min(delay * 2, EBUSY_MAX_DELAY_S)
            continue
        if started is not None and time.monotonic() - started >= BUSY_NOTABLE_S:
            busy_waits.append(time.monotonic() - started)
        return result


def read(path: Path) -> str:
    """A sysfs file's text; OSError as the kernel answers, DamonBusy when it stays busy."""
    return retry_ebusy(lambda: path.read_text().strip(), f"reading {path}")


def read_int(path: Path, default: int | None = None) -> int | None:
    try:
        return int(read(path))
    except (OSError, ValueError):
        return default


def numbered_dirs(path: Path) -> list[Path]:
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return [path / n for n in sorted((n for n in names if n.isdigit()), key=int)]


def write(path: Path, value: object) -> None:
    """Write one sysfs file; a refusal becomes an error that says which file and value."""
    text = str(value)

    def write() -> None:
        with open(path, "w") as f:
            f.write(text)

    try:
        retry_ebusy(write, f"writing {text!r} to {path}")
    except OSError as e:
        hint = ""
        if e.errno in (errno.EACCES, errno.EPERM):
            hint = " (DAMON sysfs needs root)"
        elif e.errno == errno.EROFS:
            hint = " (sysfs is mounted read-only here)"
        raise DamonHpError(
            f"damon-hp: writing {text!r} to {path} failed: {os.strerror(e.errno or 0)}{hint}"
        ) from e


def turn_off(kdamond_dir: Path, still_running: Callable[[], bool], wait_s: float = 10.0) -> bool:
    """Write `off` to a kdamond's state and wait until `still_running()` is False.

    The kdamond thread exits asynchronously after `off`; returns whether it did within wait_s.
    """
    write(kdamond_dir / "state", "off")
    deadline = time.monotonic() + wait_s
    while still_running():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
