"""Proof that a kdamond is ours: a record written when damon-hp starts one.

DAMON's sysfs has no owner field, so damon-hp leaves a record per kdamond it starts, in
`$DAMON_HP_RUN_DIR` (default /run/damon-hp, a tmpfs: records die with the boot), named
`kdamond-<index>.json`. A kdamond counts as ours only while its live pid matches the record's;
anything else, even a kdamond at "our" index, is foreign and is never stopped or changed.

The record also names the agent process (pid plus its start time, which rules out pid reuse) so
that a kdamond left behind by a killed agent can be told apart from one a live agent still uses.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import procfs

DEFAULT_RUN_DIR = Path("/run/damon-hp")


def run_dir() -> Path:
    return Path(os.environ.get("DAMON_HP_RUN_DIR", str(DEFAULT_RUN_DIR)))


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (/proc/PID/stat field 22), or None if gone."""
    try:
        return procfs.read_stat(pid).start_ticks
    except (procfs.ProcessGone, OSError, ValueError, IndexError):
        return None


def process_comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def boot_ticks_now() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class OwnerRecord:
    """What damon-hp wrote when it started kdamond `kdamond_index`.

    `kdamond_pid` is None only between writing the record and the kdamond starting; such a
    provisional record proves ownership only of a kdamond that started after `created_ticks`
    and monitors `target_pid` (see `proves`).
    """

    kdamond_index: int
    kdamond_pid: int | None
    agent_pid: int
    agent_start_ticks: int
    target_pid: int
    created_ticks: int  # clock ticks since boot when the record was written
    started_at: float  # wall clock, for humans
    boot_id: str

    def same_start(self, other: OwnerRecord) -> bool:
        """Whether both describe the same start (a provisional record and its final form do)."""
        return (self.agent_pid, self.agent_start_ticks, self.created_ticks) == (
            other.agent_pid, other.agent_start_ticks, other.created_ticks)

    def agent_alive(self) -> bool:
        return process_start_ticks(self.agent_pid) == self.agent_start_ticks

    def this_boot(self) -> bool:
        return self.boot_id == boot_id()

    def proves(self, index: int, running_pid: int | None, target_pids: tuple[int, ...]) -> bool:
        """Whether a kdamond at `index` running as `running_pid` is the one this record made."""
        if index != self.kdamond_index or running_pid is None or not self.this_boot():
            return False
        if not (process_comm(running_pid) or "").startswith("kdamond"):
            return False
        if self.kdamond_pid is not None:
            return running_pid == self.kdamond_pid
        started = process_start_ticks(running_pid)
        return (started is not None and started >= self.created_ticks
                and self.target_pid in target_pids)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> OwnerRecord:
        return cls(
            kdamond_index=int(d["kdamond_index"]),
            kdamond_pid=None if d.get("kdamond_pid") is None else int(d["kdamond_pid"]),
            agent_pid=int(d["agent_pid"]),
            agent_start_ticks=int(d["agent_start_ticks"]),
            target_pid=int(d["target_pid"]),
            created_ticks=int(d["created_ticks"]),
            started_at=float(d["started_at"]),
            boot_id=str(d.get("boot_id", "")),
        )

    @classmethod
    def for_this_agent(cls, index: int, target_pid: int) -> OwnerRecord:
        me = os.getpid()
        return cls(
            kdamond_index=index,
            kdamond_pid=None,
            agent_pid=me,
            agent_start_ticks=process_start_ticks(me) or 0,
            target_pid=target_pid,
            created_ticks=boot_ticks_now(),
            started_at=time.time(),
            boot_id=boot_id(),
        )


def record_path(index: int, directory: Path | None = None) -> Path:
    return (directory or run_dir()) / f"kdamond-{index}.json"


def write_record(rec: OwnerRecord, directory: Path | None = None) -> Path:
    path = record_path(rec.kdamond_index, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec.to_dict()) + "\n")
    os.replace(tmp, path)  # atomic: a reader never sees half a record
    return path


def read_records(directory: Path | None = None) -> dict[int, OwnerRecord]:
    """Records by kdamond index; unreadable or malformed files are ignored."""
    out: dict[int, OwnerRecord] = {}
    d = directory or run_dir()
    try:
        paths = sorted(d.glob("kdamond-*.json"))
    except OSError:
        return out
    for p in paths:
        try:
            rec = OwnerRecord.from_dict(json.loads(p.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out[rec.kdamond_index] = rec
    return out


def remove_record(index: int, directory: Path | None = None,
                  only: OwnerRecord | None = None) -> None:
    """Delete the record of kdamond `index`; with `only`, just if it is still that record
    (another agent may have reused the index and written its own since)."""
    path = record_path(index, directory)
    if only is not None:
        current = read_records(directory).get(index)
        if current is not None and not current.same_start(only):
            return
    try:
        path.unlink()
    except FileNotFoundError:
        pass
