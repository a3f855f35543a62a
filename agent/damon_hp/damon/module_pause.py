"""Pausing a DAMON module (DAMON_STAT) for one damon-hp run, on explicit request only.

DAMON_STAT's exclusive context keeps any kdamond of damon-hp's from starting, so the best
source (vaddr: damon-hp's own kdamond on the target, DAMOS marks, the DAMOS collapse action)
is out of reach while it runs. `--pause-damon-stat` lets a user trade DAMON_STAT's machine-wide
statistics for that, for the length of one run: damon-hp writes N to
/sys/module/damon_stat/parameters/enabled and puts back what was there when it stops.

Every exit path restores it: the agent's normal stop, Ctrl-C and SIGTERM (the source's close),
a crash (the same `finally`), and SIGKILL, after which the next damon-hp start of any kind
(run, attach, daemon, doctor's probe excepted: it never writes) finds the record of a pause
whose agent is gone and turns the module back on. The record lives with the ownership records
($DAMON_HP_RUN_DIR, /run/damon-hp: a tmpfs, so a reboot, which restores the module's boot
default anyway, drops it too). `status` and `doctor` read the records and say who paused what.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import EnvironmentProblem
from . import ownership
from .modules import MODULES, SYS_MODULE, module_kdamonds

PAUSE_WAIT_S = 30.0


@dataclass(frozen=True)
class PauseRecord:
    module: str  # damon_stat
    previous: str  # what `enabled` read before the pause ("Y")
    agent_pid: int
    agent_start_ticks: int
    paused_at: float  # wall clock, for humans
    boot_id: str

    @property
    def label(self) -> str:
        return MODULES.get(self.module, self.module)

    def agent_alive(self) -> bool:
        return ownership.process_start_ticks(self.agent_pid) == self.agent_start_ticks

    def describe(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.paused_at))
        who = (f"damon-hp agent pid {self.agent_pid}" if self.agent_alive()
               else f"damon-hp agent pid {self.agent_pid}, which is gone (the next damon-hp "
               "start turns it back on)")
        return f"{self.label} paused since {when} by {who}"


def _path(module: str, run_dir: Path | None = None) -> Path:
    return (run_dir or ownership.run_dir()) / f"paused-{module}.json"


def _enabled_file(module: str, sys_module: Path = SYS_MODULE) -> Path:
    return sys_module / module / "parameters" / "enabled"


def read_records(run_dir: Path | None = None) -> list[PauseRecord]:
    out = []
    for module in MODULES:
        try:
            out.append(PauseRecord(**json.loads(_path(module, run_dir).read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return out


def _set(module: str, value: str, sys_module: Path) -> None:
    f = _enabled_file(module, sys_module)
    try:
        f.write_text(value)
    except OSError as e:
        raise EnvironmentProblem(
            f"damon-hp: cannot write {value} to {f}: {e.strerror}; run damon-hp as root") from e


def pause(module: str = "damon_stat", run_dir: Path | None = None,
          sys_module: Path = SYS_MODULE) -> PauseRecord | None:
    """Turn `module` off for this process's run and leave a record; None when it was not on.

    The record is written before the module is touched, so a SIGKILL at any point leaves
    either nothing changed or a record the next start acts on."""
    try:
        previous = _enabled_file(module, sys_module).read_text().strip()
    except OSError:
        return None
    if previous != "Y":
        return None
    me = os.getpid()
    rec = PauseRecord(module, previous, me, ownership.process_start_ticks(me) or 0,
                      time.time(), ownership.boot_id())
    path = _path(module, run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(rec)))
    tmp.replace(path)
    _set(module, "N", sys_module)
    deadline = time.monotonic() + PAUSE_WAIT_S
    while any(m.module == module for m in module_kdamonds(sys_module)):
        if time.monotonic() > deadline:
            restore(rec, run_dir, sys_module)
            raise EnvironmentProblem(f"damon-hp: {rec.label}'s kdamond did not stop within "
                                     f"{PAUSE_WAIT_S:g} s of enabled=N; turned it back on")
        time.sleep(0.05)
    return rec


def restore(rec: PauseRecord, run_dir: Path | None = None,
            sys_module: Path = SYS_MODULE) -> None:
    """Put the module's `enabled` back as it was, then drop the record."""
    _set(rec.module, rec.previous, sys_module)
    try:
        _path(rec.module, run_dir).unlink()
    except FileNotFoundError:
        pass


def restore_stale(run_dir: Path | None = None, sys_module: Path = SYS_MODULE) -> list[str]:
    """Turn back on modules that a damon-hp agent paused and did not restore (SIGKILL).
    Records of another boot are dropped (the boot restored the default). What was done."""
    done = []
    for rec in read_records(run_dir):
        if rec.boot_id != ownership.boot_id():
            _path(rec.module, run_dir).unlink(missing_ok=True)
            continue
        if rec.agent_alive():
            continue
        restore(rec, run_dir, sys_module)
        done.append(f"{rec.label} turned back on (paused by damon-hp agent pid "
                    f"{rec.agent_pid}, which is gone)")
    return done
