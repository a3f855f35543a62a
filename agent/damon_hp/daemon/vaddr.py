"""The daemon's vaddr source: ONE kdamond of ours, one vaddr target per managed process.

`set_targets(pids)` follows the managed set: the first pid starts the kdamond (and our tracefs
instance on its events), later changes are committed to the running kdamond (targets.py says
how Linux 6.12 applies them and how events are mapped back to pids), and an empty set stops
it: a vaddr kdamond with no live target stops on its own anyway.

If the kdamond stops under a commit (6.12 ends it when a pid in the list has exited by the
time the commit is applied), a new one is started with the processes still alive.
"""

from __future__ import annotations

import time
from typing import Any

from damon_hp.damon import events, kdamond, ownership
from damon_hp.damon.kdamond import KdamondStopped, OwnedKdamond
from damon_hp.damon.model import Snapshot
from damon_hp.damon.sources import NO_DEMOTION, MonitorSettings
from damon_hp.damon.targets import TargetMap, plan_slots
from damon_hp.errors import DamonHpError

BURST_WAIT_S = 0.05  # the rest of one aggregation's events, once its first target came
# A kdamond that a commit ends may still read as running when the commit returns: one found
# stopped this soon after our last commit is taken for that, not for monitoring lost.
COMMIT_AFTERMATH_S = 10.0

LIMITS = [
    "no DAMOS hugepage/nohugepage marks in the daemon yet: promotion is by collapse alone; "
    + NO_DEMOTION,
    "a target that moves to another slot (one before it left) is not read until DAMON's "
    "next ops updates re-read its mappings",
]


class MultiTargetSource:
    name = "vaddr"
    physical = False  # virtual snapshots, one per target

    def __init__(self, mon: MonitorSettings, reason: str, log: Any) -> None:
        self.mon = mon
        self.reason = reason
        self.sample_us = mon.intervals.sample_us
        self.aggr_us = mon.intervals.aggr_us
        self.kd: OwnedKdamond | None = None
        self.stream: events.AggregatedEventStream | None = None
        self._log = log
        # A slot's previous occupant's regions go at DAMON's next ops update; 6.12 counts that
        # interval in samples, which a slow machine (the TCG VM) stretches: two updates, and
        # one aggregation, with room.
        self.map = TargetMap(stale_s=(2 * mon.intervals.update_us + mon.intervals.aggr_us)
                             / 1e6 + 1.0)
        self.restarts = 0
        self._committed_at = 0.0

    # -- what the service reads ----------------------------------------------------------

    @property
    def kdamond_pid(self) -> int | None:
        return self.kd.kdamond_pid if self.kd is not None else None

    @property
    def kdamond_label(self) -> str:
        if self.kd is None:
            return "no kdamond (no process to watch)"
        return f"kdamond {self.kd.index} (ours, vaddr, {len(self.map.pids)} targets)"

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason, "kdamond": self.kdamond_label,
                "kdamond_pid": self.kdamond_pid, "sample_us": self.sample_us,
                "aggr_us": self.aggr_us, "reader": "event stream, one target per process",
                "targets": list(self.map.pids), "restarts": self.restarts,
                "limits": list(LIMITS)}

    def snapshots(self, timeout_s: float) -> dict[int, Snapshot]:
        """The newest whole snapshot of each target that came within `timeout_s` (by pid)."""
        if self.stream is None:
            time.sleep(timeout_s)
            return {}
        first = self.stream.next_snapshot(timeout_s)
        if first is None:
            return {}
        out = {first.pid: first}
        while (snap := self.stream.next_snapshot(BURST_WAIT_S)) is not None:
            out[snap.pid] = snap
        return out

    def stopped_unexpectedly(self) -> bool:
        """Our kdamond is gone although a process it watched still runs (after a commit of
        ours, a new kdamond is started instead: see `set_targets`)."""
        if self.kd is None or self.kd.is_running():
            return False
        alive = tuple(p for p in self.map.pids if ownership.process_start_ticks(p) is not None)
        if not alive:
            return False
        if time.monotonic() - self._committed_at > COMMIT_AFTERMATH_S:
            return True
        self._restart(alive, f"kdamond {self.kd.index} stopped after a target update")
        return False

    # -- following the managed set -------------------------------------------------------

    def set_targets(self, pids: set[int]) -> None:
        if self.kd is not None and not self.kd.is_running():
            if any(ownership.process_start_ticks(p) is not None for p in self.map.pids):
                self._log(f"kdamond {self.kd.index} stopped with targets alive; starting "
                          "a new one")
                self.restarts += 1
            self._stop()  # else its targets all exited: a vaddr kdamond then stops
        slots = plan_slots(self.map.pids, pids)
        if slots == self.map.pids and self.kd is not None:
            return
        if not slots:
            self._stop()
            return
        if self.kd is None:
            self._start(slots)
            return
        self._committed_at = time.monotonic()
        try:
            written, settled = self.kd.set_targets(slots)
        except KdamondStopped as e:
            alive = tuple(p for p in slots if ownership.process_start_ticks(p) is not None)
            self._restart(alive, str(e).removeprefix("damon-hp: "))
            return
        self.map.committed(slots, written, settled)

    def _restart(self, alive: tuple[int, ...], why: str) -> None:
        self._log(f"{why}; starting a new one")
        self.restarts += 1
        self._stop()
        if alive:
            self._start(alive)

    def _start(self, slots: tuple[int, ...]) -> None:
        written = time.monotonic()
        kd = kdamond.start_vaddr_multi(slots, self.mon.intervals, self.mon.min_nr_regions,
                                       self.mon.max_nr_regions)
        try:
            self.map.started(slots, written, time.monotonic())
            self.stream = events.AggregatedEventStream(
                kd.kdamond_pid or 0, sample_us=self.sample_us, aggr_us=self.aggr_us,
                target_pids=self.map.pid_of, max_nr_regions=self.mon.max_nr_regions).open()
        except BaseException:
            self.map.stopped()
            kd.stop()
            raise
        self.kd = kd
        self._log(f"started kdamond {kd.index} (pid {kd.kdamond_pid}) with {len(slots)} "
                  f"vaddr targets")

    def _stop(self) -> None:
        stream, self.stream = self.stream, None
        kd, self.kd = self.kd, None
        self.map.stopped()
        try:
            if stream is not None:
                stream.close()
        finally:
            if kd is not None:
                kd.stop()

    def close(self) -> None:
        try:
            self._stop()
        except DamonHpError as e:
            self._log(f"closing the vaddr source: {e}")
