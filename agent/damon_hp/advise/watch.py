"""The watch: open the access source `run` and `attach` use, gather its snapshots of the
process for a while, close it. Changes nothing: the source only reads (a passive source reads
a foreign kdamond's events through a tracefs instance of its own; a vaddr or paddr source
starts a kdamond of damon-hp's with no DAMOS scheme), and `close()` removes what it opened.

The first stop signal (SIGINT, SIGTERM, SIGHUP) ends the wait for the next aggregation at once;
signals are only let interrupt that wait, never the opening or closing of the source.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from damon_hp import procfs
from damon_hp.advise.access import AccessTally, readings_from_revmap, readings_from_snapshot
from damon_hp.advise.growth import Growth, KindRules, kind_of, measure
from damon_hp.damon import KdamondStopped, revmap
from damon_hp.damon.model import Intervals, Snapshot
from damon_hp.damon.sources import MonitorSettings, SourceRequest, open_source
from damon_hp.options import AGGR_US, SAMPLE_US, UPDATE_US
from damon_hp.pipeline import Observer
from damon_hp.signals import STOP_SIGNALS

# Enough aggregations for a usable picture: damon-hp's rule may need up to three readings of a
# range on a physical source (pipeline.params_for_source), a range being faulted in gives no
# evidence until it is steady, and "accessed in at least half the aggregations" wants several.
# At least 10 s, at most 2 min.
DEFAULT_AGGREGATIONS = 7
MIN_DEFAULT_S = 10.0
MAX_DEFAULT_S = 120.0
# The page-table estimate is re-read at most this often (smaps walks the page table).
MEASURE_EVERY_S = 5.0


def default_seconds(aggr_us: int) -> tuple[float, str]:
    aggr_s = aggr_us / 1e6
    want = DEFAULT_AGGREGATIONS * aggr_s
    secs = min(MAX_DEFAULT_S, max(MIN_DEFAULT_S, want))
    why = (f"{DEFAULT_AGGREGATIONS} aggregations of {aggr_s:g} s: enough for damon-hp's rule "
           "and a steady picture")
    if secs != want:
        why += f" ({'at least' if secs > want else 'at most'} {secs:g} s)"
    return secs, why


class Interrupted(Exception):
    """A stop signal arrived while waiting for an aggregation."""


class DeadlineReached(Exception):
    """The watch's time ran out while waiting for an aggregation (SIGALRM)."""


class StopOnSignal:
    """The first stop signal sets `signum`, and raises Interrupted while `armed`; SIGALRM
    (`wait_until`) raises DeadlineReached while armed."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.armed = False
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: object) -> None:
        if signum == signal.SIGALRM:
            if self.armed:
                self.armed = False
                raise DeadlineReached
            return
        if self.signum is None:
            self.signum = signum
            if self.armed:
                self.armed = False
                raise Interrupted

    def install(self) -> StopOnSignal:
        for sig in (*STOP_SIGNALS, signal.SIGALRM):
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def wait_until(self, deadline: float) -> None:
        """Interrupt the next wait (DeadlineReached) at `deadline` (time.monotonic())."""
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, max(0.001, deadline - time.monotonic()))

    def disarm(self) -> None:
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    @property
    def name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name


@dataclass
class Watched:
    source: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    snapshots: list[Snapshot] = field(default_factory=list)
    tally: AccessTally = field(default_factory=AccessTally)
    growth: Growth | None = None
    status: procfs.Status | None = None
    stopped_by: str = "time"
    notes: list[str] = field(default_factory=list)


def watch(pid: int, alive: Callable[[float], bool], request: SourceRequest,
          seconds: float | None, stop: StopOnSignal, rules: KindRules,
          say: Callable[[str], None], after_open: Callable[[], None] | None = None) -> Watched:
    """Watch `pid` for `seconds` (None: the default for its source). `alive(timeout)` is False
    once the process has exited; `after_open` runs once the source watches (advise -- CMD lets
    the command exec then)."""
    out = Watched()
    mon = MonitorSettings(Intervals(SAMPLE_US, AGGR_US, UPDATE_US), 10, 1000, None)
    source = open_source(request, pid, mon)
    files = procfs.ProcessFiles(pid)
    try:
        info = source.info()
        out.source = info
        if after_open is not None:
            after_open()
        if seconds is None:
            seconds, why = default_seconds(info["aggr_us"])
        else:
            why = "--seconds"
        say(f"damon-hp advise: watching pid {pid} for {seconds:g} s ({why}) through the "
            f"{info['name']} source, {info['kdamond']}; nothing is changed")
        # The pipeline's own observer: the reverse map of a physical source and the
        # first-touch marks, exactly as `run` would see the process; it only reads.
        observer = Observer(files, physical=source.physical)
        started = time.monotonic()
        deadline = started + seconds
        _measure(pid, out, rules)  # a process that exits before its first aggregation
        next_measure = started + MEASURE_EVERY_S
        while stop.signum is None and time.monotonic() < deadline:
            if not alive(0):
                out.stopped_by = "target exit"
                break
            # The source waits up to two aggregations for one; the watch ends on time: a slow
            # kdamond (a loaded host) held a 30-s watch for 57 s before this.
            try:
                stop.wait_until(deadline)
                snap = source.snapshot()
            except KdamondStopped:
                out.stopped_by = "kdamond stopped"
                break
            except (Interrupted, DeadlineReached):
                break
            finally:
                stop.disarm()
            if snap is None:
                continue
            try:
                obs = observer.observe(snap)
                maps = sorted(m.range for m in obs.maps if kind_of(m))
            except (procfs.ProcessGone, revmap.ProcessGone):
                out.stopped_by = "target exit"
                break
            if observer.last_mapped is not None:
                readings = readings_from_revmap(observer.last_mapped)
            else:
                readings = readings_from_snapshot(snap, maps)
            out.snapshots.append(obs.snapshot)
            out.tally.add(readings, obs.monitored_share)
            now = time.monotonic()
            say(f"damon-hp advise: aggregation {len(out.snapshots)} at "
                f"{now - started:.0f} s of {seconds:g}")
            if now >= next_measure:
                _measure(pid, out, rules)
                next_measure = now + MEASURE_EVERY_S
        out.seconds = time.monotonic() - started
        if stop.signum is not None:
            out.stopped_by = stop.name or "signal"
        if alive(0):
            _measure(pid, out, rules)
    finally:
        files.close()
        source.close()
    return out


def _measure(pid: int, out: Watched, rules: KindRules) -> None:
    """The page-table estimate of now; the last good one stays if the process is gone."""
    try:
        status = procfs.read_status(pid)
        growth = measure(pid, status.vm_rss, rules)
    except (procfs.ProcessGone, ProcessLookupError, FileNotFoundError):
        return
    out.status, out.growth = status, growth
