"""Where the agent's access data comes from: three sources behind one interface.

- `vaddr`: a kdamond damon-hp starts on the target's virtual address space. The only source
  that can also carry DAMOS `hugepage`/`nohugepage` marks (they act on the target's mm).
- `paddr`: a kdamond damon-hp starts over physical memory, for kernels without vaddr whose
  DAMON is free. Its regions are physical; `revmap` maps them back onto the target.
- `passive`: a kdamond that is not ours (another tool's sysfs kdamond, DAMON_STAT,
  DAMON_RECLAIM, DAMON_LRU_SORT), read through its `damon_aggregated` events only. Nothing is
  ever written under /sys/kernel/mm/damon; its intervals and schemes stay its owner's.

A vaddr source's snapshots are of the target's virtual address space; a physical source's
(`physical`) are reverse-mapped onto the target by the per-process pipeline (pipeline.py), so
the policy always sees virtual snapshots and does not know which source it has.
`open_source(request, pid, monitor)` picks one (`auto`: vaddr, then paddr, then passive) and
says why in `AccessSource.info()`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import DamonHpError, EnvironmentProblem
from . import events, kdamond, module_pause, modules, placement
from .kdamond import KdamondStopped, OwnedKdamond
from .model import Intervals, IntervalsGoal, Snapshot
from .modules import ModuleKdamond
from .status import (
    OWNER_FOREIGN,
    DamonStatus,
    KdamondInfo,
    probe,
    read_intervals,
    read_max_regions,
    running_kdamond_pids,
    scheme_actions,
)

KINDS = ("auto", "vaddr", "paddr", "passive")


@dataclass(frozen=True)
class SourceRequest:
    """`--source`: which source the user asked for, and for passive optionally which kdamond."""

    kind: str = "auto"
    kdamond_pid: int | None = None

    def __str__(self) -> str:
        return self.kind + (f"={self.kdamond_pid}" if self.kdamond_pid else "")


def parse_source(text: str) -> SourceRequest:
    """'auto' | 'vaddr' | 'paddr' | 'passive' | 'passive=PID' -> SourceRequest."""
    kind, _, pid_text = text.strip().partition("=")
    if kind not in KINDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a source: use auto, vaddr, paddr, passive or passive=PID")
    if not pid_text:
        return SourceRequest(kind)
    if kind != "passive":
        raise argparse.ArgumentTypeError(
            f"{text!r}: only passive takes a kdamond pid (passive=PID)")
    if not pid_text.isdigit() or int(pid_text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: {pid_text!r} is not a kdamond pid")
    return SourceRequest(kind, int(pid_text))


@dataclass(frozen=True)
class MonitorSettings:
    """How our own kdamond (vaddr, paddr) watches; a passive source ignores these."""

    intervals: Intervals
    min_nr_regions: int
    max_nr_regions: int
    intervals_goal: IntervalsGoal | None
    # --pause-damon-stat: stop DAMON_STAT for the run when it holds DAMON (module_pause.py)
    pause_damon_stat: bool = False


class AccessSource(Protocol):
    name: str
    """vaddr | paddr | passive"""
    physical: bool
    """its snapshots are of physical memory (paddr, passive): the pipeline reverse-maps them"""
    kdamond_pid: int | None
    owned: OwnedKdamond | None
    """our kdamond, when the source can carry DAMOS schemes for the target (vaddr)"""

    def snapshot(self) -> Snapshot | None:
        """The next whole aggregation (the target's virtual addresses, or physical ones where
        `physical`); None when none came within about one aggregation interval. Raises
        KdamondStopped once the kdamond is gone."""
        ...

    def info(self) -> dict[str, Any]:
        """Name, why chosen, kdamond, intervals, reader, limits: for progress, status, JSON."""
        ...

    def close(self) -> None: ...


@dataclass
class _Base:
    name: str
    reason: str
    kdamond_label: str
    kdamond_pid: int | None
    sample_us: int
    aggr_us: int
    reader: str
    limits: list[str] = field(default_factory=list)
    owned: OwnedKdamond | None = None

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason, "kdamond": self.kdamond_label,
                "kdamond_pid": self.kdamond_pid, "sample_us": self.sample_us,
                "aggr_us": self.aggr_us, "reader": self.reader, "limits": list(self.limits)}


class VaddrSource(_Base):
    """Our kdamond on the target: snapshots from its event stream, or tried_regions."""

    physical = False

    def __init__(self, kd: OwnedKdamond, reason: str, stream: events.AggregatedEventStream | None,
                 stream_error: str | None) -> None:
        # An auto-tuned kdamond's events are read right only while its tuning is followed
        # (damon_monitor_intervals_tune, 6.17+); without that event, tried_regions it is.
        self.use_stream = stream is not None and (not kd.autotuned or stream.follows_tuning)
        reader = "event stream" if self.use_stream else "tried_regions"
        limits = []
        if stream is None:
            limits.append(f"event stream unavailable ({stream_error}); reading tried_regions, "
                          "which costs a sysfs read per region")
        elif not self.use_stream:
            limits.append("intervals auto-tune and this kernel has no "
                          "damon_monitor_intervals_tune event: reading tried_regions, which "
                          "costs a sysfs read per region")
        super().__init__("vaddr", reason, f"kdamond {kd.index} (ours)", kd.kdamond_pid,
                         kd.intervals.sample_us, kd.intervals.aggr_us, reader, limits, kd)
        self.kd = kd
        self.stream = stream

    def snapshot(self) -> Snapshot | None:
        # Events rather than tried_regions whenever they can be read right. 6.12's DAMON sysfs
        # drops its lock (damon_sysfs_lock, which every sysfs file only try-locks) while a
        # tried-regions update waits for the kdamond (damon_sysfs_handle_cmd); 7.3 holds it
        # for the wait, so snapshots read back to back answered EBUSY to 98 % of another
        # reader's reads of the kdamond's state (`damon-hp status`, damo; measured in the 7.3
        # test VM, tests/vm/test_damon_stat.py).
        if self.stream is None or not self.use_stream:
            return self.kd.snapshot()
        tuned = self.stream.assembler
        self.sample_us, self.aggr_us = tuned.sample_us, tuned.aggr_us
        snap = self.stream.latest_snapshot(timeout_s=2 * self.aggr_us / 1e6 + 1.0)
        if snap is None and not self.kd.is_running():
            raise KdamondStopped(f"damon-hp: kdamond {self.kd.index} stopped")
        return snap

    def close(self) -> None:
        try:
            if self.stream is not None:
                self.stream.close()
        finally:
            self.kd.stop()


class ReverseMappedSource(_Base):
    """A paddr kdamond's events (ours or not): physical snapshots, which the per-process
    pipeline maps back onto its target through the target's pagemap (pipeline.py)."""

    physical = True

    def __init__(self, name: str, reason: str, label: str, kdamond_pid: int,
                 sample_us: int, aggr_us: int, stream: events.AggregatedEventStream,
                 limits: list[str], alive: Callable[[], bool],
                 owned_kd: OwnedKdamond | None = None) -> None:
        super().__init__(name, reason, label, kdamond_pid, sample_us, aggr_us,
                         "event stream + pagemap reverse map", limits)
        self.stream = stream
        self._alive = alive
        self._owned_kd = owned_kd

    def snapshot(self) -> Snapshot | None:
        # The newest aggregation only: a reverse map of a 4 GiB target cost 0.1-0.5 s of CPU
        # on the host before frame_reader.FrameReader, and one per queued stale snapshot left the
        # agent ever further behind (VM, paddr, 400 ms aggregations: after a 20 s collapse
        # step, 30 queued snapshots took the next 29 s).
        # A DAMON module's kdamond may retune its intervals while we read (events.py follows).
        tuned = self.stream.assembler
        self.sample_us, self.aggr_us = tuned.sample_us, tuned.aggr_us
        phys = self.stream.latest_snapshot(timeout_s=2 * self.aggr_us / 1e6 + 1.0)
        if phys is None and not self._alive():
            raise KdamondStopped(f"damon-hp: {self.kdamond_label} stopped")
        return phys

    def close(self) -> None:
        try:
            self.stream.close()
        finally:
            if self._owned_kd is not None:
                self._owned_kd.stop()


# --------------------------------------------------------------------------------------------
# choosing and opening


# Tried on 6.18 (the CI host): process_madvise on another process accepts MADV_WILLNEED,
# MADV_COLD, MADV_PAGEOUT and MADV_COLLAPSE, and refuses MADV_HUGEPAGE, MADV_NOHUGEPAGE and
# MADV_DONTNEED with EINVAL. None of the accepted ones splits a huge page or keeps khugepaged off
# a range, so without DAMOS a collapsed range stays huge until the process unmaps it or the
# kernel splits it (reclaim, migration).
NO_DEMOTION = ("no demotion: process_madvise cannot mark MADV_NOHUGEPAGE or split a huge page "
               "of another process, so a collapsed range stays huge")


def passive_limits(schemes: str) -> list[str]:
    return [
        "the foreign kdamond's intervals set how soon a hot set shows (several aggregations)",
        f"its own schemes ({schemes}) keep running; damon-hp never changes them",
        "no DAMOS hugepage/nohugepage marks (they need a vaddr kdamond of ours): promotion is "
        f"by collapse alone; {NO_DEMOTION}",
        FIRST_TOUCH_LIMIT,
    ]


FIRST_TOUCH_LIMIT = ("a 2 MiB range's reading is not used in an aggregation in which it gained "
                     "resident pages: pages being faulted in read as accessed")

PADDR_LIMITS = [
    "no DAMOS hugepage/nohugepage marks (they need a vaddr kdamond of ours): promotion is by "
    f"collapse alone; {NO_DEMOTION}",
    "one kdamond watches all of physical memory; its regions are split among every process",
    FIRST_TOUCH_LIMIT,
]


def _open_vaddr(pid: int, mon: MonitorSettings, reason: str) -> VaddrSource:
    kd = kdamond.start_vaddr(pid, mon.intervals, mon.min_nr_regions, mon.max_nr_regions, (),
                             mon.intervals_goal)
    stream, err = None, None
    try:
        stream = events.AggregatedEventStream(
            kd.kdamond_pid or 0, sample_us=mon.intervals.sample_us,
            aggr_us=mon.intervals.aggr_us, target_pids=pid,
            max_nr_regions=mon.max_nr_regions, follow_tuning=kd.autotuned).open()
    except DamonHpError as e:
        err = str(e).removeprefix("damon-hp: ")
    except BaseException:
        kd.stop()
        raise
    return VaddrSource(kd, reason, stream, err)


def open_paddr(mon: MonitorSettings, reason: str) -> ReverseMappedSource:
    # No auto-tuning: the stream needs fixed intervals to read nr_accesses right.
    kd = kdamond.start_paddr(mon.intervals, mon.min_nr_regions, mon.max_nr_regions, None)
    try:
        stream = events.AggregatedEventStream(
            kd.kdamond_pid or 0, sample_us=mon.intervals.sample_us,
            aggr_us=mon.intervals.aggr_us, max_nr_regions=mon.max_nr_regions).open()
    except BaseException:
        kd.stop()
        raise
    return ReverseMappedSource("paddr", reason, f"kdamond {kd.index} (ours, paddr)",
                               kd.kdamond_pid or 0, mon.intervals.sample_us,
                               mon.intervals.aggr_us, stream, list(PADDR_LIMITS),
                               kd.is_running, kd)


def _pick_passive(found: DamonStatus, want_pid: int | None) -> KdamondInfo:
    """The foreign paddr kdamond to read: the one with `want_pid`, or the first running."""
    if want_pid is not None:
        k = next((k for k in found.running if k.pid == want_pid), None)
        if k is None:
            raise EnvironmentProblem(
                f"damon-hp: no running kdamond has pid {want_pid}; running: "
                + (", ".join(x.describe() for x in found.running) or "none"))
        if k.owner != OWNER_FOREIGN:
            raise EnvironmentProblem(
                f"damon-hp: {k.describe()} is damon-hp's own; --source passive reads a "
                "kdamond someone else started")
    else:
        foreign = [k for k in found.running if k.owner == OWNER_FOREIGN and k.pid]
        if not foreign:
            raise EnvironmentProblem(
                "damon-hp: no running kdamond that damon-hp did not start, so there is nothing "
                "to read passively")
        k = next((x for x in foreign if x.ops[:1] == ("paddr",)), foreign[0])
    if k.ops[:1] != ("paddr",):
        # A foreign vaddr kdamond sees only its own targets' virtual memory, with target ids
        # only its owner can map to processes: not read (yet).
        raise EnvironmentProblem(
            f"damon-hp: {k.describe()} monitors with ops {','.join(k.ops) or 'none'}; the "
            "passive source reads a paddr kdamond only")
    return k


def _pick_module(found: DamonStatus, want_pid: int | None) -> ModuleKdamond | None:
    """The DAMON module kdamond to read passively, or None to look in sysfs instead.

    A module's context is exclusive, so when one runs no sysfs kdamond does: it is the only
    thing to read."""
    if want_pid is not None:
        m = next((m for m in found.unlisted if m.pid == want_pid), None)
        if m is not None and not m.module:
            raise EnvironmentProblem(
                f"damon-hp: kdamond pid {want_pid} is not in DAMON sysfs and belongs to no DAMON "
                "module damon-hp knows (DAMON_STAT, DAMON_RECLAIM, DAMON_LRU_SORT): its "
                "intervals cannot be read, so its events cannot be interpreted")
        return m
    if any(k.owner == OWNER_FOREIGN and k.pid for k in found.running):
        return None
    return found.exclusive[0] if found.exclusive else None


def _open_module_passive(m: ModuleKdamond, reason: str) -> ReverseMappedSource:
    """A DAMON module's kdamond, read through its events only; nothing is written anywhere
    under /sys/kernel/mm/damon or /sys/module."""
    if not (m.sample_us and m.aggr_us):
        raise EnvironmentProblem(f"damon-hp: cannot read the intervals of {m.describe()}")
    limits = passive_limits("none" if m.module == "damon_stat" else f"{m.label}'s")
    if m.autotuned:
        limits.insert(1, f"{m.label} auto-tunes its intervals while it runs: damon-hp follows "
                      "them through damon_monitor_intervals_tune events")
    stream = events.AggregatedEventStream(m.pid, sample_us=m.sample_us, aggr_us=m.aggr_us,
                                          max_nr_regions=1000,
                                          follow_tuning=m.autotuned).open()
    if m.autotuned and not stream.follows_tuning:
        limits.append("this kernel has no damon_monitor_intervals_tune event: intervals are "
                      "those read at start")
    return ReverseMappedSource("passive", reason, m.describe(), m.pid, m.sample_us,
                               m.aggr_us, stream, limits, lambda: modules.pid_alive(m.pid))


def open_passive(request: SourceRequest, found: DamonStatus, reason: str) -> ReverseMappedSource:
    m = _pick_module(found, request.kdamond_pid)
    if m is not None:
        return _open_module_passive(m, reason)
    k = _pick_passive(found, request.kdamond_pid)
    iv = read_intervals(k.index)
    if iv is None:
        raise EnvironmentProblem(f"damon-hp: cannot read the intervals of {k.describe()}")
    sample_us, aggr_us, _ = iv
    schemes = ", ".join(scheme_actions(k.index)) or "none"
    limits = passive_limits(schemes)
    kpid = k.pid or 0
    stream = events.AggregatedEventStream(kpid, sample_us=sample_us, aggr_us=aggr_us,
                                          max_nr_regions=read_max_regions(k.index)).open()

    def alive() -> bool:
        return kpid in running_kdamond_pids().values()

    return ReverseMappedSource("passive", reason, f"kdamond {k.index} (pid {kpid}, paddr, "
                               "not ours)", kpid, sample_us, aggr_us, stream, limits, alive)


def probe_for(request: SourceRequest, who: str = "damon-hp") -> DamonStatus:
    """DAMON as it is now, after clearing what dead agents of ours left; raises where this
    kernel has no DAMON or it is unreadable. `who` starts the messages."""
    # A kdamond a SIGKILLed agent of ours left running would block every start: stop it first
    # (only ever one an ownership record proves ours), then judge what DAMON offers.
    if request.kind != "passive":
        kdamond.reclaim_stale()
    # A module a SIGKILLed agent of ours paused: back on before anything is judged.
    module_pause.restore_stale()
    events.remove_stale_instances()
    found = probe()
    if not found.sysfs_present:
        raise EnvironmentProblem(
            f"{who}: DAMON sysfs (/sys/kernel/mm/damon/admin) is missing: this kernel has no "
            "DAMON (CONFIG_DAMON_SYSFS). See `damon-hp doctor`.")
    if not found.readable:
        raise EnvironmentProblem(f"{who}: {found.error}; run damon-hp as root.")
    return found


def choose_kind(request: SourceRequest, found: DamonStatus,
                asked: str) -> tuple[str, str, list[str]]:
    """The source kind to open, why, and what refused the better ones: the one asked for, or
    (auto) vaddr, else paddr where DAMON is free, else passive."""
    if request.kind != "auto":
        return request.kind, asked, []
    refusals: list[str] = []
    for kind in ("vaddr", "paddr"):
        try:
            placement.plan_start(found, kind)
        except EnvironmentProblem as e:
            refusals.append(f"{kind}: {str(e).removeprefix('damon-hp: ')}")
            continue
        return kind, "auto: " + ("the best source, DAMON is free" if kind == "vaddr" else
                                 "no vaddr here (" + refusals[0] + ")"), refusals
    return "passive", "auto: " + "; ".join(refusals), refusals


class ModulePausedSource:
    """A source opened after damon-hp paused a DAMON module for this run: closing it (every
    exit path of the agent closes its source) turns the module back on."""

    def __init__(self, inner: AccessSource, rec: module_pause.PauseRecord) -> None:
        self._inner = inner
        self.paused = rec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def snapshot(self) -> Snapshot | None:
        return self._inner.snapshot()

    def info(self) -> dict[str, Any]:
        d = self._inner.info()
        d["limits"] = [f"{self.paused.label} is paused for this run (--pause-damon-stat) and "
                       "turned back on when damon-hp stops", *d["limits"]]
        d["paused_module"] = self.paused.module
        return d

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            module_pause.restore(self.paused)


def open_source(request: SourceRequest, pid: int, mon: MonitorSettings) -> AccessSource:
    """Open the requested source (auto: the first that works) or say why none can."""
    found = probe_for(request)
    if (mon.pause_damon_stat and request.kind != "passive"
            and any(m.module == "damon_stat" for m in found.exclusive)):
        rec = module_pause.pause("damon_stat")
        if rec is not None:
            try:
                inner = open_source(request, pid, dataclasses.replace(mon, pause_damon_stat=False))
            except BaseException:
                module_pause.restore(rec)
                raise
            return ModulePausedSource(inner, rec)
    kind, why, refusals = choose_kind(request, found, f"asked for with --source {request.kind}")
    if kind == "vaddr":
        return _open_vaddr(pid, mon, why)
    if kind == "paddr":
        return open_paddr(mon, why)
    try:
        return open_passive(request, found, why)
    except EnvironmentProblem as e:
        if request.kind != "auto":
            raise
        refusals.append(f"passive: {str(e).removeprefix('damon-hp: ')}")
        raise EnvironmentProblem("damon-hp: no DAMON access source works here:\n  "
                                 + "\n  ".join(refusals)) from None
