"""A process's page frames, from /proc/PID/pagemap: which physical frame backs each of its
virtual pages (frame numbers need CAP_SYS_ADMIN), read as cheaply as the kernel allows.

    read_page_frames(pid, ranges) -> PageFrames          pagemap (root), PAGEMAP_SCAN
    FrameReader(pid).read(ranges) -> PageFrames         the same, re-reading only what moved

The physical reverse map (damon/revmap.py) turns a paddr DAMON snapshot into the target's
virtual access picture through these frames. Cost, measured on the CI host (2 cores, loaded),
per 4 GiB target (1 Mi pages, frames in 17 Ki runs): reading pagemap 20-30 ms of CPU and finding
its extents of consecutive frames ~6 ms, both skipped by FrameReader where no frame moved
(PAGEMAP_SCAN for that: ~10 ms).
"""

from __future__ import annotations

import errno
import os
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from damon_hp.errors import EnvironmentProblem
from damon_hp.procfs import (
    PAGE_IS_HUGE,
    PAGE_IS_PRESENT,
    PagemapScanUnsupported,
    ProcessGone,
    open_pagemap,
    pagemap_scan_categories,
    read_stat,
)
from damon_hp.ranges import HUGE_PAGE_BYTES, PAGE_BYTES

_WINDOW_PAGES = HUGE_PAGE_BYTES // PAGE_BYTES

# /proc/PID/pagemap: one little-endian u64 per virtual page (Documentation/admin-guide/mm/
# pagemap.rst). Bits 55-62 are flags (soft-dirty, exclusive, uffd-wp, file, swapped).
PM_PRESENT = 1 << 63
PM_PFN_MASK = (1 << 55) - 1
_ENTRY_BYTES = 8
# 64 Ki entries (512 KiB) per pread: larger reads measured no faster here.
_READ_PAGES = 1 << 16

@dataclass(frozen=True)
class FrameRun:
    """Raw pagemap entries of consecutive virtual pages from `start` (page-aligned)."""

    start: int
    entries: array  # array('Q'): one /proc/PID/pagemap entry per page

    @property
    def end(self) -> int:
        return self.start + len(self.entries) * PAGE_BYTES


@dataclass(frozen=True)
class PageFrames:
    """The frames behind a target's pages over the virtual `ranges` the caller asked about.

    `runs` cover the parts of `ranges` that may hold resident pages (all of them, or only the
    present stretches when PAGEMAP_SCAN pruned them); a page outside every run is not resident.
    """

    pid: int
    ranges: tuple[tuple[int, int], ...]
    runs: tuple[FrameRun, ...]
    extents_known: dict[tuple[int, int], Extents] = field(
        default_factory=dict, compare=False, repr=False)
    """a cache of `extents`, filled by FrameReader for the ranges it did not re-read"""

    @property
    def resident_pages(self) -> int:
        # numpy: a Python loop over a 4 GiB target's 1 Mi entries cost ~50 ms per snapshot.
        return sum(int(np.count_nonzero(np.frombuffer(run.entries, dtype=np.uint64)
                                        & np.uint64(PM_PRESENT))) for run in self.runs)

    @property
    def extents(self) -> dict[tuple[int, int], Extents]:
        """Each range that has runs, its resident pages as extents of consecutive frames."""
        by_range: dict[tuple[int, int], list[FrameRun]] = {r: [] for r in self.ranges}
        starts = [lo for lo, _ in self.ranges]
        for run in self.runs:
            k = bisect_right(starts, run.start) - 1
            if k < 0 or run.end > self.ranges[k][1]:
                raise ValueError(f"frame run at {run.start:#x} lies outside the ranges asked about")
            by_range[self.ranges[k]].append(run)
        for r, runs in by_range.items():
            if runs and r not in self.extents_known:
                self.extents_known[r] = extents_of(runs)
        return {r: self.extents_known[r] for r, runs in by_range.items() if runs}

    @classmethod
    def from_pfns(
        cls, pid: int, start: int, pfns: Sequence[int | None]
    ) -> PageFrames:
        """Frames of one virtual range from a list of PFNs (None: not resident); for tests."""
        entries = array("Q", (0 if p is None else PM_PRESENT | p for p in pfns))
        end = start + len(pfns) * PAGE_BYTES
        return cls(pid, ((start, end),), (FrameRun(start, entries),))


# -- I/O ---------------------------------------------------------------------------------------

_MERGE_GAP_BYTES = HUGE_PAGE_BYTES  # 4 KiB of pagemap entries


def _gone(path: str, e: OSError) -> ProcessGone:
    return ProcessGone(f"{path}: the process has exited ({os.strerror(e.errno)})")


def _present_stretches(fd: int, path: str, lo: int, hi: int
                       ) -> list[tuple[int, int, int]] | None:
    """Present stretches of [lo, hi) by PAGEMAP_SCAN (so a mostly unpopulated mapping is not
    read page by page), split where PMD mapping starts or stops: (start, end, categories).
    None if the kernel lacks PAGEMAP_SCAN."""
    try:
        return list(pagemap_scan_categories(fd, path, lo, hi, PAGE_IS_PRESENT,
                                            PAGE_IS_PRESENT | PAGE_IS_HUGE))
    except PagemapScanUnsupported:
        return None


def _merge_close(stretches: Iterable[tuple[int, int, int]]) -> list[tuple[int, int]]:
    # Stretches a few holes apart are read as one: one pread of some zero entries costs less
    # than a syscall per stretch of a sparsely touched mapping.
    found: list[tuple[int, int]] = []
    for lo, hi, _ in stretches:
        if found and lo - found[-1][1] <= _MERGE_GAP_BYTES:
            found[-1] = (found[-1][0], hi)
        else:
            found.append((lo, hi))
    return found


def _read_entries(fd: int, lo: int, hi: int) -> array:
    entries = array("Q")
    for chunk_lo in range(lo, hi, _READ_PAGES * PAGE_BYTES):
        chunk_hi = min(hi, chunk_lo + _READ_PAGES * PAGE_BYTES)
        want = (chunk_hi - chunk_lo) // PAGE_BYTES * _ENTRY_BYTES
        data = os.pread(fd, want, chunk_lo // PAGE_BYTES * _ENTRY_BYTES)
        if len(data) != want:
            # The range was unmapped under us: what is left reads as not resident.
            data += bytes(want - len(data))
        entries.frombytes(data)
    return entries


def read_page_frames(
    pid: int, ranges: Iterable[tuple[int, int]], *, use_scan: bool = True
) -> PageFrames:
    """The PFNs behind `pid`'s pages over `ranges` (virtual [start, end), page-aligned).

    Pass the target's private anonymous mappings (from /proc/PID/maps): those are what
    MADV_COLLAPSE can turn into huge pages. Needs root (without CAP_SYS_ADMIN the kernel
    reports every PFN as 0). By default PAGEMAP_SCAN (6.7+) first finds the populated
    stretches, so an untouched reservation is not read page by page; where memory is dense
    that is a second page-table walk (+5-10 ms per 4 GiB here): use_scan=False skips it.
    """
    wanted = tuple(sorted((int(lo), int(hi)) for lo, hi in ranges if hi > lo))
    fd, path = open_pagemap(pid)
    try:
        present = _scan_present(fd, path, wanted) if use_scan else None
        frames = _read_frames(fd, path, pid, wanted, present)
    finally:
        os.close(fd)
    return frames


def _scan_present(fd: int, path: str, wanted: Sequence[tuple[int, int]]
                  ) -> tuple[tuple[tuple[int, int, int], ...], ...] | None:
    """The present stretches of each wanted range; None without PAGEMAP_SCAN."""
    out = []
    try:
        for lo, hi in wanted:
            found = _present_stretches(fd, path, lo, hi)
            if found is None:
                return None
            out.append(tuple(found))
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.ENOENT):
            raise _gone(path, e) from e
        raise
    return tuple(out)


def _read_frames(fd: int, path: str, pid: int, wanted: tuple[tuple[int, int], ...],
                 present: Sequence[Sequence[tuple[int, int, int]]] | None) -> PageFrames:
    """Read the pagemap entries of `wanted` (only its `present` stretches, when known)."""
    runs = []
    for i, (lo, hi) in enumerate(wanted):
        runs.extend(_read_range(fd, path, lo, hi, present[i] if present is not None else None))
    _check_privileged(path, runs)
    return PageFrames(pid, wanted, tuple(runs))


def _read_range(fd: int, path: str, lo: int, hi: int,
                present: Sequence[tuple[int, int, int]] | None) -> list[FrameRun]:
    try:
        return [FrameRun(s_lo, _read_entries(fd, s_lo, s_hi))
                for s_lo, s_hi in (_merge_close(present) if present is not None else [(lo, hi)])]
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.ENOENT):
            raise _gone(path, e) from e
        raise


# Re-read every frame at least this often even when nothing says one moved: a bound on how long
# a move no signal below covers (another process writing into the target's copy-on-write
# pages, userfaultfd moves) can mislead the reverse map.
FULL_READ_EVERY_S = 30.0


class FrameReader:
    """`read_page_frames` for one process, snapshot after snapshot, reading pagemap entries
    again only for ranges whose frames may have moved since the last read.

    Reading a 4 GiB target's entries and finding its runs of consecutive frames cost ~40 + 40
    ms of CPU per snapshot on the CI host, while an anonymous page keeps its frame until it is
    unmapped, faulted anew, migrated or collapsed. So each read first takes, in this order:
      - the kernel's frame-moving counters (/proc/vmstat: page migrations, which include
        compaction, NUMA balancing and demotion; THP splits, which may remap zero-filled pages
        to the zero page or follow a collapse within one interval), and whether KSM runs (it
        merges pages without any of these: while it runs, every read is full);
      - the target's page faults (/proc/PID/stat minflt + majflt: every new frame it maps
        through a fault of its own, copy-on-write included);
      - per range, its present stretches and which of them are PMD-mapped (PAGEMAP_SCAN:
        pages unmapped or reclaimed without a fault, such as MADV_DONTNEED, MADV_FREE,
        swap-out; collapses, ours or khugepaged's).
    When the counters equal the last read's, a range whose stretches are unchanged keeps its
    entries and extents (exactly what a new read would return), and in a range whose stretches
    changed only the 2 MiB windows where they differ are read again (extents never cross a
    window, so the others' stay exact).
    The counters are read before the page tables, so a move during a read shows as a change at
    the next one. Every FULL_READ_EVERY_S, and without PAGEMAP_SCAN always, all is read.
    """

    def __init__(self, pid: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.pid = pid
        self._clock = clock
        self._moves: tuple[int, ...] | None = None
        self._ranges: dict[tuple[int, int], tuple[tuple, list[FrameRun], Extents | None]] = {}
        self._full_at = 0.0
        self.ranges_read = 0
        self.ranges_reused = 0
        self.windows_read = 0  # 2 MiB windows re-read within otherwise unchanged ranges

    def read(self, ranges: Iterable[tuple[int, int]]) -> PageFrames:
        wanted = tuple(sorted((int(lo), int(hi)) for lo, hi in ranges if hi > lo))
        moves = _frame_moves(self.pid)
        now = self._clock()
        fd, path = open_pagemap(self.pid)
        try:
            present = _scan_present(fd, path, wanted)
            trusted = (present is not None and moves is not None and moves == self._moves
                       and now - self._full_at < FULL_READ_EVERY_S)
            known = self._ranges if trusted else {}
            fresh: dict[tuple[int, int], tuple[tuple, list[FrameRun], Extents | None]] = {}
            for i, rng in enumerate(wanted):
                stretches = present[i] if present is not None else None
                old = known.get(rng)
                if old is not None and old[0] == stretches:
                    fresh[rng] = old
                    self.ranges_reused += 1
                elif old is not None and old[2] is not None and stretches is not None:
                    windows = _changed_windows(old[0], stretches)
                    fresh[rng] = (stretches, *_patch(fd, path, rng, old[1], old[2], windows))
                    self.windows_read += len(windows)
                else:
                    fresh[rng] = (stretches, _read_range(fd, path, *rng, stretches), None)
                    self.ranges_read += 1
        finally:
            os.close(fd)
        runs = [run for rng in wanted for run in fresh[rng][1]]
        _check_privileged(path, runs)
        frames = PageFrames(self.pid, wanted, tuple(runs))
        for rng, (_, rng_runs, ext) in fresh.items():
            if ext is None:
                ext = extents_of(rng_runs)
                fresh[rng] = (fresh[rng][0], rng_runs, ext)
            if rng_runs:
                frames.extents_known[rng] = ext
        if not trusted:
            self._full_at = now
        self._moves, self._ranges = moves, fresh
        return frames


def _changed_windows(old: Sequence[tuple[int, int, int]], new: Sequence[tuple[int, int, int]]
                     ) -> list[int]:
    """Starts of the 2 MiB windows where two stretch lists (start, end, categories; sorted,
    disjoint) say different things about a page."""
    def at(stretches: Sequence[tuple[int, int, int]], starts: list[int], addr: int) -> int:
        k = bisect_right(starts, addr) - 1
        return stretches[k][2] if k >= 0 and addr < stretches[k][1] else -1

    old_starts, new_starts = [x[0] for x in old], [x[0] for x in new]
    points = sorted({p for lo, hi, _ in (*old, *new) for p in (lo, hi)})
    windows: set[int] = set()
    for lo, hi in zip(points, points[1:], strict=False):
        if at(old, old_starts, lo) != at(new, new_starts, lo):
            first = lo - lo % HUGE_PAGE_BYTES
            windows.update(range(first, hi, HUGE_PAGE_BYTES))
    return sorted(windows)


def _slice(run: FrameRun, lo: int, hi: int) -> FrameRun:
    return FrameRun(lo, run.entries[(lo - run.start) // PAGE_BYTES:(hi - run.start) // PAGE_BYTES])


def _patch(fd: int, path: str, rng: tuple[int, int], runs: Sequence[FrameRun], ext: Extents,
           windows: Sequence[int]) -> tuple[list[FrameRun], Extents]:
    """`runs` and `ext` of range `rng` with the `windows` (2 MiB starts) read anew."""
    lo, hi = rng
    spans: list[tuple[int, int]] = []
    for w in windows:
        a, b = max(w, lo), min(w + HUGE_PAGE_BYTES, hi)
        if spans and spans[-1][1] == a:
            spans[-1] = (spans[-1][0], b)
        elif a < b:
            spans.append((a, b))
    try:
        read = [FrameRun(a, _read_entries(fd, a, b)) for a, b in spans]
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.ENOENT):
            raise _gone(path, e) from e
        raise
    span_ends = [b for _, b in spans]
    kept: list[FrameRun] = []
    for run in runs:  # the old runs less the spans read anew
        at = run.start
        for a, b in spans[bisect_right(span_ends, at):]:
            if a >= run.end:
                break
            if a > at:
                kept.append(_slice(run, at, a))
            at = max(at, b)
        if at < run.end:
            kept.append(_slice(run, at, run.end))
    new_ext = extents_of(read)
    window_ids = np.array([w // HUGE_PAGE_BYTES for w in windows], dtype=np.int64)
    keep = ~np.isin(ext.vpage // _WINDOW_PAGES, window_ids)
    vpage = np.concatenate((ext.vpage[keep], new_ext.vpage))
    order = np.argsort(vpage, kind="stable")
    merged = Extents(vpage[order], np.concatenate((ext.pfn[keep], new_ext.pfn))[order],
                      np.concatenate((ext.n[keep], new_ext.n))[order])
    return sorted(kept + read, key=lambda r: r.start), merged


_VMSTAT_MOVES = (b"pgmigrate_success", b"thp_split_page", b"thp_split_pmd")


def _frame_moves(pid: int) -> tuple[int, ...] | None:
    """The counters FrameReader compares; None when frames may move untracked (KSM runs)."""
    try:
        with open("/sys/kernel/mm/ksm/run", "rb") as f:
            if f.read().strip() != b"0":
                return None
    except FileNotFoundError:
        pass  # no KSM in this kernel
    with open("/proc/vmstat", "rb") as f:
        counters = dict(line.split() for line in f.read().splitlines())
    stat = read_stat(pid)
    return (*(int(counters.get(name, -1)) for name in _VMSTAT_MOVES), stat.minflt + stat.majflt)


def _check_privileged(path: str, runs: Sequence[FrameRun]) -> None:
    # Without CAP_SYS_ADMIN, pagemap zeroes the PFN bits but keeps the present bit.
    for run in runs:
        for e in run.entries:
            if e & PM_PRESENT:
                if e & PM_PFN_MASK == 0:
                    raise EnvironmentProblem(
                        f"{path} reports page frame numbers as 0: reading them needs "
                        "CAP_SYS_ADMIN (run damon-hp as root)"
                    )
                return


# -- the pure reverse map -------------------------------------------------------------------


@dataclass(frozen=True)
class Extents:
    """Resident pages as extents: `n[i]` virtual pages from page number `vpage[i]`, backed by
    the consecutive frames from `pfn[i]`. No extent crosses a 2 MiB virtual boundary."""

    vpage: np.ndarray
    pfn: np.ndarray
    n: np.ndarray


def extents_of(runs: Sequence[FrameRun]) -> Extents:
    """The resident pages of `runs` (disjoint, in address order) as extents of consecutive
    frames."""
    parts = [_run_extents(run) for run in runs]
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return Extents(empty, empty, empty)
    return Extents(*(np.concatenate([p[i] for p in parts]) for i in range(3)))


def _run_extents(run: FrameRun) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Per run, in index space: an extent starts at every present page whose predecessor is
    # absent, not the previous frame, or in the previous 2 MiB window. Only the starts are
    # gathered, never a per-page address array.
    entries = np.frombuffer(run.entries, dtype=np.uint64)
    first_page = run.start // PAGE_BYTES
    present = entries >= np.uint64(PM_PRESENT)  # bit 63
    dense = bool(present.all())
    if not dense:
        entries = np.where(present, entries, np.uint64(0))
    # PFNs fit in 55 bits: once masked, the same bits read as int64.
    pfn = (entries & np.uint64(PM_PFN_MASK)).view(np.int64)
    starts = np.diff(pfn) != 1
    if not dense:
        starts |= ~present[:-1]
    windows = np.arange(-first_page % _WINDOW_PAGES, len(pfn), _WINDOW_PAGES)
    starts[windows[windows > 0] - 1] = True
    first = np.flatnonzero(starts)
    first += 1
    first = np.concatenate(([0], first))
    n = np.diff(np.append(first, len(pfn)))
    if not dense:
        # Every absent page (frame 0 here) starts an extent of its own, which ends the present
        # one before it: drop those.
        keep = present[first]
        first, n = first[keep], n[keep]
    return first + first_page, pfn[first], n
