"""What the fault, bad-input, daemon and vm tests look for after each case: processes still
in a case's session, damon-hp tracefs instances of a pid, the kdamonds running and the sysfs
settings as found, and a polling wait. Shared by the host and vm tiers (`tests/` is on the
import path).

DAMON sysfs is read as damon-hp reads it, EBUSY retried (`damon_hp.damon.io.read`): a kdamond
takes DAMON's sysfs lock for a moment at every aggregation and any other DAMON reader may hold
it, so a bare read of `state` or `pid` now and then fails with EBUSY; a check that skipped or
raised on that would report a change that did not happen."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

from damon_hp.damon import io as damon_io

INSTANCES = Path("/sys/kernel/tracing/instances")
ADMIN = Path("/sys/kernel/mm/damon/admin")


def instances_of(pid: int) -> list[str]:
    """The tracefs instances damon-hp process `pid` made (named damon-hp-PID-...)."""
    try:
        return sorted(n for n in os.listdir(INSTANCES) if n.startswith(f"damon-hp-{pid}-"))
    except FileNotFoundError:
        return []


def session_members(sid: int, with_leader: bool = True) -> list[str]:
    """"PID comm" of every process in session `sid` (each case runs in a session of its own,
    so whatever it started and left behind is here)."""
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            text = (d / "stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[3]) != sid:
            continue
        if with_leader or int(d.name) != sid:
            out.append(f"{d.name} {text[text.index('(') + 1:text.rindex(')')]}")
    return out


def processes_mentioning(marker: str) -> dict[int, str]:
    """pid -> command line of every process (but this one) whose command line holds `marker`
    (a case's unique folder or argument: what it started and left behind)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmd:
            found[int(pid)] = cmd
    return found


def alive(pid: int) -> bool:
    """Running, not a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] != "Z"


def wait_for(what: str, ok: Callable[[], object], timeout_s: float,
             every_s: float = 0.25) -> float:
    """Seconds it took until ok() was true; fails naming `what` after timeout_s."""
    t0 = time.monotonic()
    while not ok():
        assert time.monotonic() - t0 < timeout_s, f"timed out after {timeout_s} s: {what}"
        time.sleep(every_s)
    return time.monotonic() - t0


def damon_read(path: Path) -> str:
    """A DAMON sysfs file's text, EBUSY retried (see above)."""
    return damon_io.read(path)


def kdamond_states(admin: Path = ADMIN) -> dict[str, tuple[str, str]]:
    """(state, pid) of every kdamond directory."""
    return {kd.name: (damon_read(kd / "state"), damon_read(kd / "pid"))
            for kd in damon_io.numbered_dirs(admin / "kdamonds")}


def running_kdamonds(admin: Path = ADMIN) -> dict[Path, int]:
    """Directory -> pid of every running kdamond, by DAMON sysfs (EBUSY retried, see above).

    A directory that goes away while it is read is not running: listdir can name a kdamond
    an agent removes next, and a file opened just before the removal reads ENODEV, since kernfs
    refuses reads of a deactivated node (kernfs_fop_read_iter, kernfs_get_active); stop 42's
    CI met that. A pid of -1 after "on" is a kdamond that stopped between the two reads
    (damon_sysfs pid_show with no ctx->kdamond): not running either; stop 40's CI took that
    moment for the second agent's new kdamond."""
    out = {}
    for kd in damon_io.numbered_dirs(admin / "kdamonds"):
        try:
            if damon_read(kd / "state") != "on":
                continue
            pid = int(damon_read(kd / "pid"))
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENODEV):
                continue
            raise
        if pid != -1:
            out[kd] = pid
    return out


def kdamond_threads() -> list[int]:
    """pids of kernel threads named kdamond*, by /proc (independent of DAMON sysfs)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if (d / "comm").read_text().startswith("kdamond"):
                pids.append(int(d.name))
        except OSError:
            continue
    return sorted(pids)


def sysfs_tree(root: Path, skip: Callable[[str], bool] = lambda rel: False) -> dict[str, str]:
    """Every readable file under `root` (path relative to it -> text), but those `skip` names;
    write-only files are left out, EBUSY is retried."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if skip(rel):
                continue
            try:
                out[rel] = damon_io.read(path)
            except OSError:
                continue  # write-only
    return out
