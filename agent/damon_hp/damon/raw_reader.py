"""The per-CPU `trace_pipe_raw` files of our tracefs instance: binary pages in, events out.

events.AggregatedEventStream owns the instance (creating it, its filter, its removal); this
module only opens its `per_cpu/cpuN/trace_pipe_raw` files and turns what they hold into
events (event_pages.py decodes). A read of trace_pipe_raw consumes one sub-buffer of that
CPU's ring buffer, or what has been committed of the page being written
(tracing_buffers_read() reads partial pages), so every event is read once.

The kdamond may run on any CPU and move between them: each read takes every CPU's pages and
sorts their events by time (the instance's trace clock is "mono", one clock for every CPU).
An event committed on one CPU while another is being read arrives at the next read, after
events that are newer: the assembler drops the aggregation that tears (it never returns a
torn one), as it does for lost events.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from damon_hp.numpy_lean import np

from .assembler import SnapshotAssembler
from .event_pages import (
    AGGREGATED_FIELDS,
    TUNE_FIELDS,
    Decoded,
    PageLayout,
    RecordLayout,
    decode_pages,
    page_layout,
    record_layout,
)
from .model import Snapshot

_MAX_PAGES_PER_READ = 4096  # a bound on one drain: 16 MiB of 4 KiB pages per CPU


@dataclass(frozen=True)
class RawLayouts:
    page: PageLayout
    aggregated: RecordLayout
    tune: RecordLayout | None


def raw_layouts(tracefs: Path, event_dir: str, tune_dir: str | None) -> RawLayouts | None:
    """The page and record layouts this kernel's tracefs describes, or None where it
    describes something this reader does not know (then read trace_pipe text)."""
    try:
        page = page_layout((tracefs / "events/header_page").read_text())
        agg = record_layout((tracefs / event_dir / "format").read_text(), AGGREGATED_FIELDS)
        tune = (record_layout((tracefs / tune_dir / "format").read_text(), TUNE_FIELDS)
                if tune_dir is not None else None)
    except OSError:
        return None
    if page is None or agg is None:
        return None
    return RawLayouts(page, agg, tune)


class RawPipes:
    """The open `trace_pipe_raw` files of one instance, one per CPU. `read(assembler)`: the
    snapshots that what the buffers hold now completes, and the events the kernel said it
    lost; None if they held nothing (text_reader.TextPipe answers alike)."""

    files = "per_cpu/cpu*/trace_pipe_raw"

    def __init__(self, instance_fd: int, layouts: RawLayouts) -> None:
        self.layouts = layouts
        self.page_bytes = _subbuf_bytes(instance_fd)
        self.fds: list[int] = []
        try:
            cpus = os.open("per_cpu", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
                           dir_fd=instance_fd)
            try:
                names = sorted((n for n in os.listdir(cpus) if n.startswith("cpu")),
                               key=lambda n: int(n[3:]))
                for name in names:
                    self.fds.append(os.open(f"{name}/trace_pipe_raw",
                                            os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC,
                                            dir_fd=cpus))
            finally:
                os.close(cpus)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def read(self, assembler: SnapshotAssembler) -> tuple[list[Snapshot], int] | None:
        got = self.read_events()
        if got is None:
            return None
        lost = 0
        if got.missed:
            # Like trace_pipe's "[LOST n EVENTS]"; the kernel does not always say how many
            lost = max(1, got.missed_count)
            assembler.reset()
        snaps, events = [], got.events
        for at_s, sample_us in got.tunes:
            # Events before a retune carry the old intervals, those after it the new ones.
            cut = int(np.searchsorted(events["timestamp_s"], at_s, side="right"))
            snaps += assembler.feed_array(events[:cut])
            assembler.retune(sample_us)
            events = events[cut:]
        return snaps + assembler.feed_array(events), lost

    def read_events(self) -> Decoded | None:
        """Everything the CPUs' buffers hold now, merged by time, or None if they held
        nothing. OSError passes up (the instance is gone)."""
        return decode_cpus((self._pages(fd) for fd in self.fds), self.layouts)

    def _pages(self, fd: int) -> list[bytes]:
        pages = []
        for _ in range(_MAX_PAGES_PER_READ):
            try:
                page = os.read(fd, self.page_bytes)
            except BlockingIOError:
                break
            if not page:
                break
            pages.append(page)
        return pages


def decode_cpus(pages_by_cpu: Iterable[list[bytes]], layouts: RawLayouts) -> Decoded | None:
    """The events of each CPU's pages (in that CPU's order), merged by time; None if no CPU
    had a page. Pure: `RawPipes.read_events` feeds it what it read, benchmarks recordings."""
    events, tunes, missed, missed_count = [], [], False, 0
    for pages in pages_by_cpu:
        if not pages:
            continue
        got = decode_pages(pages, layouts.page, layouts.aggregated, layouts.tune)
        events.append(got.events)
        tunes += got.tunes
        missed |= got.missed
        missed_count += got.missed_count
    if not events:
        return None
    merged = events[0] if len(events) == 1 else np.concatenate(events)
    if len(events) > 1:
        merged = merged[np.argsort(merged["timestamp_s"], kind="stable")]
    return Decoded(merged, sorted(tunes), missed, missed_count)


def _subbuf_bytes(instance_fd: int) -> int:
    """The ring buffer's sub-buffer size: one read returns one (6.8+ can change it through
    buffer_subbuf_size_kb; before, a page)."""
    try:
        fd = os.open("buffer_subbuf_size_kb", os.O_RDONLY | os.O_CLOEXEC, dir_fd=instance_fd)
    except FileNotFoundError:
        return os.sysconf("SC_PAGE_SIZE")
    try:
        return int(os.read(fd, 64).decode().strip()) * 1024
    finally:
        os.close(fd)
