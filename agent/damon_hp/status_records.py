"""Status records of running agents, one JSON file each, read by `damon-hp status`.

A record names its agent by pid and start time, so a record left by a SIGKILLed agent is known
as dead (and dropped by the next agent) rather than shown as running. It also names the target
by pid and start time: `claim_target` refuses a target that a live agent already manages (two
agents on one process would fight over its memory, and on a vaddr source over DAMON).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from damon_hp.damon import ownership
from damon_hp.errors import EnvironmentProblem

# Fields of our record set by claim_target; every later write_status keeps them.
_claimed: dict[str, Any] = {}


def status_path(agent_pid: int | None = None, target_pid: int | None = None) -> Path:
    """An agent's record; the daemon keeps one per managed process (`target_pid`)."""
    suffix = f"-{target_pid}" if target_pid is not None else ""
    return ownership.run_dir() / f"agent-{agent_pid or os.getpid()}{suffix}.json"


def write_status(rec: dict[str, Any], path: Path | None = None) -> None:
    path = path or status_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps({**_claimed, **rec}) + "\n")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def remove_status() -> None:
    _claimed.clear()
    try:
        status_path().unlink()
    except FileNotFoundError:
        pass


def remove_stale_statuses() -> None:
    """Drop the status records of agents that died without cleaning up (e.g. SIGKILL), and
    records that are not valid status records at all."""
    for rec in read_statuses(include_invalid=True):
        if not rec["alive"]:
            try:
                Path(rec["path"]).unlink()
            except OSError:
                pass


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_statuses(include_invalid: bool = False) -> list[dict[str, Any]]:
    """Every agent status record, each with `alive` telling whether its agent still runs.

    A file that is not a status record (unreadable, not JSON, no integer agent_pid) is left out,
    or with include_invalid returned as {"path", "alive": False, "invalid": reason}.
    Raises EnvironmentProblem when the run directory exists but may not be read.
    """
    root = ownership.run_dir()
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    except PermissionError:
        raise EnvironmentProblem(
            f"damon-hp: may not read the status records in {root} (permission denied): "
            "they are private to root; run damon-hp status as root (sudo)"
        ) from None
    except NotADirectoryError:
        raise EnvironmentProblem(
            f"damon-hp: the run directory {root} is not a directory; point DAMON_HP_RUN_DIR "
            "at a directory (default /run/damon-hp)"
        ) from None
    out = []
    for name in names:
        if not (name.startswith("agent-") and name.endswith(".json")):
            continue
        p = root / name
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            if include_invalid:
                out.append({"path": str(p), "alive": False, "invalid": str(e)})
            continue
        agent_pid = _int_or_none(rec.get("agent_pid")) if isinstance(rec, dict) else None
        if agent_pid is None or agent_pid <= 0:
            if include_invalid:
                out.append({"path": str(p), "alive": False,
                            "invalid": "not a status record (no integer agent_pid)"})
            continue
        rec["alive"] = (
            ownership.process_start_ticks(agent_pid) == rec.get("agent_start_ticks")
        )
        rec["path"] = str(p)
        out.append(rec)
    return out


@contextmanager
def _run_dir_locked() -> Iterator[Path]:
    """The run directory, held under an exclusive flock: one agent claims at a time."""
    root = ownership.run_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise EnvironmentProblem(
            f"damon-hp: cannot use the run directory {root}: {e.strerror}; point "
            "DAMON_HP_RUN_DIR at a writable directory (default /run/damon-hp)"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield root
    finally:
        os.close(fd)


def managing_agent(target_pid: int, target_start: int | None) -> dict[str, Any] | None:
    """The live agent's record that manages this process (pid and start time), if any."""
    for rec in read_statuses():
        if not rec["alive"] or rec.get("agent_pid") == os.getpid():
            continue
        if rec.get("target_pid") != target_pid:
            continue
        started = rec.get("target_start_ticks")
        if started is None or target_start is None or started == target_start:
            return rec
    return None


def describe_agent(rec: dict[str, Any]) -> str:
    since = time.strftime("%H:%M:%S", time.localtime(rec.get("since") or 0))
    if rec.get("rule") is not None:
        return f"damon-hpd pid {rec.get('agent_pid')} (rule {rec['rule']}, since {since})"
    return f"damon-hp agent pid {rec.get('agent_pid')} ({rec.get('mode')}, since {since})"


def how_to_free(rec: dict[str, Any]) -> str:
    """What lets go of the process: the daemon runs on for its other processes."""
    pid = rec.get("agent_pid")
    if rec.get("rule") is not None:
        return (f"Exclude the process in damon-hpd's config and reload it (kill -HUP {pid}) "
                "first")
    return f"Stop that agent first (kill {pid})"


def claim_managed(rec: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """The daemon's claim of one process: write `rec` (which names target_pid and
    target_start_ticks) at `path`, unless a live agent manages that process; then return that
    agent's record and write nothing. Under the same lock as `claim_target`, so a process is
    taken by the daemon or by run/attach, never both."""
    with _run_dir_locked():
        other = managing_agent(rec["target_pid"], rec["target_start_ticks"])
        if other is None:
            write_status(rec, path=path)
        return other


def claim_target(target_pid: int, mode: str, command: list[str]) -> None:
    """Write our status record naming the target, or refuse (exit 2) if a live agent manages it.

    Check and write happen under the run directory's lock, so of two agents started at once on
    one process exactly one goes on. Stale records (dead agents) are dropped first.
    """
    target_start = ownership.process_start_ticks(target_pid)
    with _run_dir_locked():
        remove_stale_statuses()
        other = managing_agent(target_pid, target_start)
        if other is not None:
            raise EnvironmentProblem(
                f"damon-hp {mode}: process {target_pid} is already managed by "
                f"{describe_agent(other)}; two agents on one process would fight over its "
                f"memory. {how_to_free(other)}, or see damon-hp status"
            )
        _claimed.clear()
        _claimed.update(target_pid=target_pid, target_start_ticks=target_start)
        try:
            write_status({
                "agent_pid": os.getpid(),
                "agent_start_ticks": ownership.process_start_ticks(os.getpid()),
                "mode": mode,
                "command": command,
                "since": time.time(),
                "starting": True,
            })
        except OSError as e:
            _claimed.clear()
            raise EnvironmentProblem(
                f"damon-hp {mode}: cannot write a status record in {ownership.run_dir()}: "
                f"{e.strerror}; it is what keeps a second agent off process {target_pid}. "
                "Free space there or point DAMON_HP_RUN_DIR at a writable directory"
            ) from None
