"""DAMON access data from any kdamond's `damon:damon_aggregated` tracepoint, read-only.

A kdamond emits one `damon_aggregated` event per region at the end of every aggregation
interval, from its own thread (so `common_pid` is the kdamond's pid). Reading those events needs
no write under /sys/kernel/mm/damon: damon-hp can follow a kdamond it did not start (a
foreign paddr kdamond, DAMON_STAT) without disturbing it.

The events are read from a private tracefs instance (`instances/damon-hp-<ourpid>-<n>`) with a
`common_pid == <kdamond pid>` filter, never from the global buffer that other tools use. The
instance is removed on close; `remove_stale_instances` removes those left by a damon-hp process
that died before it could.

Four layers, the lower three pure and in their own modules:
    event_pages.decode_pages(pages) -> events          trace_pipe_raw pages (binary)
    event_lines.parse_event_line(line) -> AggregatedEvent | None  one line of trace_pipe
    assembler.SnapshotAssembler.feed_array/feed(...) -> Snapshots  whole aggregations
    AggregatedEventStream(kdamond_pid, ...)            the tracefs instance, its reader

The stream reads binary pages (raw_reader.py: one trace_pipe_raw file per CPU) unless asked
for the lines (`on_line`, to record fixtures) or where tracefs describes a page or event layout
the decoder does not know; then trace_pipe text. Cost, measured on the development host (6.18,
2 cores, quiet; ~1,330 events per 5 s aggregation from its paddr kdamond; 2026-11-27): 7-10 ms
of CPU per snapshot as text (the kernel printing each event, Python parsing it back at ~2.2 us
a line with the assembling), 3-4.5 ms as binary pages (record headers walked in Python, fields
gathered with numpy, ~0.3 us a Region).

Found on this host: the kdamond emits a whole aggregation in one burst of ~3 ms (first event
sometimes a few ms ahead of the rest); for paddr, target_id is 0 and a target's regions are
contiguous from its first start to its last end; nr_regions varies from one aggregation to the
next (1,345 to 2,031 seen, max 8192); the physical range monitored can change while the
kdamond runs (its owner rewrote it from 4-7.4 GiB to 4-13.75 GiB here).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import math
import os
import re
import select
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from .. import procfs
from ..errors import DamonHpError, EnvironmentProblem
from .assembler import SnapshotAssembler, TargetPids
from .model import Snapshot
from .raw_reader import RawPipes, raw_layouts
from .text_reader import TextPipe

TRACEFS = "/sys/kernel/tracing"
INSTANCE_PREFIX = "damon-hp-"
EVENT_DIR = "events/damon/damon_aggregated"
# 6.17+: emitted by a kdamond whose intervals auto-tune, with its new sampling interval.
TUNE_EVENT_DIR = "events/damon/damon_monitor_intervals_tune"

# Ring-buffer bytes per damon_aggregated event: 48 bytes of fields plus the 4-byte event header,
# rounded up with room for the occasional time-extend record.
EVENT_BYTES = 64
# Whole aggregations the per-CPU buffer must hold: the one being emitted faster than we read
# it, and one more in case the reader is not scheduled for an aggregation interval.
BURSTS_BUFFERED = 2
MIN_BUFFER_KB = 128
# How often a reader that sees no data checks that its instance is still set up as it left it.
HEALTH_CHECK_S = 1.0
_RMDIR_TRIES = 20
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC

_instance_seq = itertools.count()


class EventStreamLost(DamonHpError):
    """Our tracefs instance was changed under us: events can no longer be trusted to arrive."""


def mount_tracefs(tracefs: str | Path = TRACEFS) -> bool:
    """Mount tracefs where it is missing; True if this call mounted it.

    Systemd mounts it on most machines, but minimal ones (containers, this project's CI host)
    boot without it. It stays mounted afterwards: another tool may have started using it,
    and a mounted tracefs changes nothing until someone enables an event. hpstat does the
    same (bpf/tracefs_names.c).
    """
    path = Path(tracefs)
    if (path / "instances").is_dir():
        return False
    if path != Path(TRACEFS):
        raise ValueError(f"mount_tracefs mounts at {TRACEFS} only, not {path}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"nodev", os.fsencode(path), b"tracefs", ctypes.c_ulong(0), None) != 0:
        err = ctypes.get_errno()
        if err == errno.EBUSY and (path / "instances").is_dir():
            return False  # someone else mounted it meanwhile
        raise OSError(err, os.strerror(err), str(path))
    return True


def instance_name(pid: int, seq: int) -> str:
    return f"{INSTANCE_PREFIX}{pid}-{seq}"


_INSTANCE_NAME = re.compile(rf"^{re.escape(INSTANCE_PREFIX)}(\d+)-(\d+)$")


def remove_stale_instances(tracefs: str = TRACEFS) -> list[str]:
    """Remove tracefs instances left by damon-hp processes that no longer exist.

    Only names `damon-hp-<pid>-<n>` whose pid is gone are touched; an instance of a live pid
    (ours, another agent's, or a reused pid: we cannot tell, so we keep it) and every instance
    with another name are left alone. An instance someone still reads (EBUSY) is kept.
    Returns the names removed.
    """
    root = Path(tracefs) / "instances"
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        m = _INSTANCE_NAME.match(name)
        if m is None or procfs.pid_exists(int(m[1])):
            continue
        try:
            os.rmdir(root / name)
        except FileNotFoundError:
            continue
        except OSError as e:
            # EBUSY: someone still reads it. ENODEV: another damon-hp starting at the same
            # moment is removing it (tracefs answers the second rmdir so while the first runs;
            # seen 2026-11-25 with two `advise` starting together).
            if e.errno in (errno.EBUSY, errno.ENODEV):
                continue
            raise
        removed.append(name)
    return removed


def buffer_size_kb(max_nr_regions: int) -> int:
    """Per-CPU ring buffer for `BURSTS_BUFFERED` aggregations of `max_nr_regions` events.

    The kdamond may run on any CPU and tracefs sizes every CPU's buffer alike, so this is
    multiplied by the CPU count in memory: keep it to what the bursts need (1 MiB per CPU for
    8192 regions).
    """
    return max(MIN_BUFFER_KB, math.ceil(max_nr_regions * BURSTS_BUFFERED * EVENT_BYTES / 1024))


class AggregatedEventStream:
    """Whole snapshots of one kdamond's aggregations, from a private tracefs instance.

    with AggregatedEventStream(kdamond_pid, sample_us=..., aggr_us=...) as stream:
        snap = stream.next_snapshot(timeout_s=10)   # None: nothing complete within 10 s
        snap = stream.latest_snapshot(timeout_s=10) # the same, but the newest one: older
                                                    # ones that queued meanwhile are dropped

    sample_us, aggr_us: the kdamond's intervals (its sysfs monitoring_attrs, read by the
    caller); they go into every Snapshot. target_pids: see SnapshotAssembler. max_nr_regions:
    the kdamond's nr_regions/max, to size the buffer. on_line: called with every trace_pipe
    line read (to record fixtures). follow_tuning: for a kdamond whose intervals auto-tune (a
    DAMON module's, or ours started with an intervals goal), also read its
    `damon_monitor_intervals_tune` events and carry the new intervals into later snapshots
    (`follows_tuning` says whether this kernel has that event). The instance is created on
    enter (or `open()`) and always removed by `close()`, which the context manager calls on
    any exit; `remove_stale_instances` cleans up after processes that could not (call it at
    start-up).
    """

    def __init__(
        self,
        kdamond_pid: int,
        *,
        sample_us: int,
        aggr_us: int,
        target_pids: TargetPids = 0,
        max_nr_regions: int = 1000,
        tracefs: str = TRACEFS,
        on_line: Callable[[str], None] | None = None,
        follow_tuning: bool = False,
    ) -> None:
        self.kdamond_pid = kdamond_pid
        self.follow_tuning = follow_tuning
        self.follows_tuning = False
        # Snapshots carry their aggregation's time: the instance's trace clock is "mono",
        # CLOCK_MONOTONIC, the clock of time.monotonic().
        self.assembler = SnapshotAssembler(
            sample_us=sample_us, aggr_us=aggr_us, target_pids=target_pids, clock=None
        )
        self.max_nr_regions = max_nr_regions
        self.tracefs = Path(tracefs)
        self.instance: Path | None = None
        self.lost_events = 0
        self.skipped_snapshots = 0
        self._reader: RawPipes | TextPipe | None = None
        # Directory fds of tracefs/instances and of our instance: everything after open() goes
        # through them, so that a tracefs unmounted (lazily) while we read neither blinds the
        # agent nor strands the instance, which lives on in the one tracefs superblock and
        # would show again wherever tracefs is mounted.
        self._instances_fd: int | None = None
        self._instance_fd: int | None = None
        self._ready: deque[Snapshot] = deque()
        self._filter = f"common_pid == {kdamond_pid}"
        self._last_check = 0.0
        self._on_line = on_line

    # -- setup and teardown ---------------------------------------------------------------

    def open(self) -> AggregatedEventStream:
        if self.instance is not None:
            return self
        self._check_environment()
        instances = self.tracefs / "instances"
        self._instances_fd = os.open(instances, _DIR_FLAGS)
        while True:
            name = instance_name(os.getpid(), next(_instance_seq))
            try:
                os.mkdir(name, dir_fd=self._instances_fd)
                break
            except FileExistsError:
                continue  # left by a dead process that had our pid
            except PermissionError as e:
                self._close_dir_fds()
                raise EnvironmentProblem(
                    f"cannot create tracefs instance {instances / name}: permission denied; "
                    "reading DAMON events needs root"
                ) from e
        self.instance = instances / name
        try:
            self._instance_fd = os.open(name, _DIR_FLAGS, dir_fd=self._instances_fd)
            self._configure()
        except BaseException:
            self.close()
            raise
        return self

    def _check_environment(self) -> None:
        if not (self.tracefs / "instances").is_dir():
            # Only ever at the standard place: any other path is a caller's choice to honour.
            if self.tracefs != Path(TRACEFS):
                raise EnvironmentProblem(f"tracefs is not mounted at {self.tracefs}; "
                                         f"mount -t tracefs nodev {self.tracefs}")
            try:
                mount_tracefs(self.tracefs)
            except OSError as e:
                raise EnvironmentProblem(
                    f"tracefs is not mounted at {self.tracefs} and mounting it failed "
                    f"({os.strerror(e.errno or 0)}); mount -t tracefs nodev {self.tracefs}"
                ) from None
        if not (self.tracefs / EVENT_DIR).is_dir():
            raise EnvironmentProblem(
                f"this kernel has no damon:damon_aggregated tracepoint ({self.tracefs}/"
                f"{EVENT_DIR} is missing): it needs CONFIG_DAMON (Linux 5.15+) with tracing"
            )
        if not procfs.pid_exists(self.kdamond_pid):
            raise EnvironmentProblem(
                f"kdamond pid {self.kdamond_pid} does not exist: the kdamond has stopped"
            )

    def _configure(self) -> None:
        # A monotonic trace clock makes event times comparable across CPUs (the kdamond
        # migrates) and with time.monotonic().
        fd = self._instance_fd
        _write_at(fd, "trace_clock", "mono")
        _write_at(fd, "buffer_size_kb", str(buffer_size_kb(self.max_nr_regions)))
        _write_at(fd, f"{EVENT_DIR}/filter", self._filter)
        _write_at(fd, f"{EVENT_DIR}/enable", "1")
        if self.follow_tuning and (self.tracefs / TUNE_EVENT_DIR).is_dir():
            _write_at(fd, f"{TUNE_EVENT_DIR}/filter", self._filter)
            _write_at(fd, f"{TUNE_EVENT_DIR}/enable", "1")
            self.follows_tuning = True
        layouts = (raw_layouts(self.tracefs, EVENT_DIR,
                               TUNE_EVENT_DIR if self.follows_tuning else None)
                   if self._on_line is None and sys.byteorder == "little" else None)
        if layouts is not None:
            # Binary pages: no text for the kernel to print and Python to parse back. Poll
            # wakes a reader of trace_pipe_raw only once the buffer is `buffer_percent` full
            # (50 by default): 0 wakes it at the first event, as trace_pipe does. Before 5.1
            # there is no such file, and a reader woke at any data.
            try:
                _write_at(fd, "buffer_percent", "0")
            except FileNotFoundError:
                pass
            self._reader = RawPipes(fd, layouts)
        else:
            self._reader = TextPipe(fd, follow_tuning=self.follows_tuning,
                                    on_line=self._on_line)

    def _close_dir_fds(self) -> None:
        for fd in (self._instance_fd, self._instances_fd):
            if fd is not None:
                os.close(fd)
        self._instance_fd = self._instances_fd = None

    def close(self) -> None:
        """Remove the instance. Idempotent; safe from any exit path."""
        if self._reader is not None:
            # rmdir fails with EBUSY while a file of the instance is open.
            self._reader.close()
            self._reader = None
        if self._instance_fd is not None:
            os.close(self._instance_fd)
            self._instance_fd = None
        if self.instance is None:
            self._close_dir_fds()
            return
        path, self.instance = self.instance, None
        try:
            self._remove(path)
        finally:
            self._close_dir_fds()

    def _remove(self, path: Path) -> None:
        for attempt in range(_RMDIR_TRIES):
            try:
                os.rmdir(path.name, dir_fd=self._instances_fd)
                return
            except FileNotFoundError:
                return
            except OSError as e:
                # EBUSY: some other process has a file of our instance open (a `cat
                # trace_pipe`); give it a moment, then say what is left behind.
                if e.errno != errno.EBUSY:
                    raise
                if attempt == _RMDIR_TRIES - 1:
                    raise DamonHpError(
                        f"cannot remove tracefs instance {path}: another process holds one of "
                        f"its files open; close it, then: rmdir {path}"
                    ) from e
                time.sleep(0.05)

    def __enter__(self) -> AggregatedEventStream:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading --------------------------------------------------------------------------

    def next_snapshot(self, timeout_s: float) -> Snapshot | None:
        """The next whole snapshot, or None if none completed within `timeout_s`.

        A kdamond that has exited simply sends nothing: the caller decides how long to wait
        (`kdamond_alive()` tells whether it is still there). Raises EventStreamLost if someone
        disabled our event, changed its filter or stopped tracing in our instance.
        """
        if self._reader is None:
            raise RuntimeError("AggregatedEventStream is not open")
        fds = self._reader.fds
        deadline = time.monotonic() + timeout_s
        while not self._ready:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._check_instance()
                return None
            readable, _, _ = select.select(fds, [], [], min(remaining, HEALTH_CHECK_S))
            if not readable or not self._drain():
                self._check_instance_every(HEALTH_CHECK_S)
        return self._ready.popleft()

    def latest_snapshot(self, timeout_s: float) -> Snapshot | None:
        """The newest whole snapshot of a target: waits like `next_snapshot` for one, then
        takes what is already readable and returns that target's newest snapshot, dropping
        the older ones (counted in `skipped_snapshots`).

        For a reader slower than the kdamond at times (a step that collapses for seconds, a
        reverse map of a large target): every snapshot is a whole aggregation, so the newest
        says all the older ones would, and working through a backlog of stale ones would only
        leave the reader further behind.
        """
        snap = self.next_snapshot(timeout_s)
        if snap is None:
            return None
        self._drain()
        newer = [s for s in self._ready if s.pid == snap.pid]
        if not newer:
            return snap
        self.skipped_snapshots += len(newer)
        self._ready = deque(s for s in self._ready if s.pid != snap.pid)
        return newer[-1]

    def _drain(self) -> bool:
        """Read what the instance holds now; False if nothing was there."""
        reader = self._reader
        assert reader is not None
        try:
            got = reader.read(self.assembler)
        except OSError as e:
            raise EventStreamLost(
                f"reading {self.instance}/{reader.files} failed ({os.strerror(e.errno or 0)}): "
                "the DAMON event stream is gone"
            ) from e
        if got is None:
            return False
        snaps, lost = got
        self.lost_events += lost
        self._ready.extend(snaps)
        return True

    def _check_instance_every(self, period_s: float) -> None:
        now = time.monotonic()
        if now - self._last_check >= period_s:
            self._last_check = now
            self._check_instance()

    def _check_instance(self) -> None:
        """Raise EventStreamLost if our instance no longer delivers our events."""
        path = self.instance
        assert path is not None
        fd = self._instance_fd
        try:
            enabled = _read_at(fd, f"{EVENT_DIR}/enable")
            filt = _read_at(fd, f"{EVENT_DIR}/filter")
            tracing_on = _read_at(fd, "tracing_on")
        except FileNotFoundError as e:
            raise EventStreamLost(
                f"tracefs instance {path} was removed while damon-hp read it"
            ) from e
        problems = []
        if enabled != "1":
            problems.append("the damon_aggregated event was disabled")
        if filt != self._filter:
            problems.append(f"its filter changed to {filt!r}")
        if tracing_on != "1":
            problems.append("tracing_on was set to 0")
        if problems:
            raise EventStreamLost(
                f"tracefs instance {path} was changed by someone else ({'; '.join(problems)}): "
                "damon-hp's DAMON event stream is lost; do not modify damon-hp-* instances"
            )

    @property
    def reads_binary(self) -> bool:
        """Whether the events come as per-CPU trace_pipe_raw pages (else trace_pipe text:
        with `on_line`, or where tracefs describes layouts this reader does not know)."""
        return isinstance(self._reader, RawPipes)

    def kdamond_alive(self) -> bool:
        """Whether the followed kdamond thread still exists."""
        return procfs.pid_exists(self.kdamond_pid)

    @property
    def dropped_groups(self) -> int:
        """Partial aggregations dropped (joined midway, lost events)."""
        return self.assembler.dropped_groups


def _write_at(dir_fd: int | None, name: str, text: str) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read_at(dir_fd: int | None, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, 4096).decode().strip()
    finally:
        os.close(fd)
