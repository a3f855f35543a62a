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

from ..errors import DamonHpError

ADMIN = Path("/sys/kernel/mm/damon/admin")

# DAMON sysfs guards `state`, `pid` and the `nr_*` files with a mutex it only try-locks,
# answering EBUSY when it is held. A running kdamond takes that mutex briefly at every
# aggregation, and holds it for the whole of a tried-regions update, so EBUSY is usually
# transient: retry for a while before calling it a failure.
EBUSY_RETRY_S = 3.0


def retry_ebusy(op):
    delay, waited = 0.005, 0.0
    while True:
        try:
            return op()
        except OSError as e:
            if e.errno != errno.EBUSY or waited >= EBUSY_RETRY_S:
                raise
        time.sleep(delay)
        waited += delay
        delay = min(delay * 2, 0.1)


def read(path: Path) -> str:
    return retry_ebusy(lambda: path.read_text().strip())


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
        retry_ebusy(write)
    except OSError as e:
        hint = ""
        if e.errno in (errno.EACCES, errno.EPERM):
            hint = " (DAMON sysfs needs root)"
        elif e.errno == errno.EBUSY:
            hint = (f" (still busy after {EBUSY_RETRY_S:g} s: a kdamond is running, or another "
                    "DAMON sysfs command is in progress)")
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
