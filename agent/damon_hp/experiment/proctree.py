"""The runner's hold on a cell's process tree: its children, their executables, reaping the
direct child with its resource usage, and ending the tree (SIGTERM first, so an agent can stop
its kdamond, then SIGKILL to the group)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


def children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            kids += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return kids


def exe_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def wait4(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, Any] | None:
    """Reap the direct child; (exit code, rusage) or None when it does not exit in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            return code, ru
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def terminate(proc: subprocess.Popen[bytes], graceful_s: float) -> None:
    """SIGTERM the direct child (an agent cleans up its kdamond), then SIGKILL its group."""
    if proc.returncode is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    if wait4(proc, graceful_s) is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        wait4(proc, 10.0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
