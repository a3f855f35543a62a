"""A process's page frames, from /proc/PID/pagemap: which physical frame backs each of its
virtual pages (frame numbers need CAP_SYS_ADMIN), read as cheaply as the kernel allows.

    read_page_frames(pid, ranges) -> PageFrames          pagemap (root), PAGEMAP_SCAN
    extents_of(runs) -> Extents                         runs of consecutive frames (pure)
    same_entries(old_runs, new_runs) -> bool            two reads alike, however cut (pure)

frame_reader.FrameReader reads them snapshot after snapshot, re-reading only what moved.

The physical reverse map (damon/revmap.py) turns a paddr DAMON snapshot into the target's
virtual access picture through these frames. Cost, measured on the CI host (2 cores, loaded),
per 4 GiB target (1 Mi pages, frames in 17 Ki runs): reading pagemap 20-30 ms of CPU and finding
its extents of consecutive frames ~6 ms, both skipped by frame_reader.FrameReader where no frame
moved (PAGEMAP_SCAN for that: ~10 ms).
"""

from __future__ import annotations

import errno
import os
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from damon_hp.errors import EnvironmentProblem
from damon_hp.numpy_lean import np
from damon_hp.procfs import (
    PAGE_IS_HUGE,
    PAGE_IS_PRESENT,
    PagemapScanUnsupported,
    ProcessGone,
    open_pagemap,
    pagemap_scan_categories,
)
from damon_hp.ranges import HUGE_PAGE_BYTES, PAGE_BYTES

WINDOW_PAGES = HUGE_PAGE_BYTES // PAGE_BYTES

# /proc/PID/pagemap: one little-endian u64 per virtual page (Documentation/admin-guide/mm/
# pagemap.rst). Bits 55-62 are flags (soft-dirty, exclusive, uffd-wp, file, swapped).
PM_PRESENT = 1 << 63
PM_PFN_MASK = (1 << 55) - 1
ENTRY_BYTES = 8
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


def process_gone(path: str, e: OSError) -> ProcessGone:
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


def read_entries(fd: int, lo: int, hi: int) -> array:
    entries = array("Q")
    for chunk_lo in range(lo, hi, _READ_PAGES * PAGE_BYTES):
        chunk_hi = min(hi, chunk_lo + _READ_PAGES * PAGE_BYTES)
        want = (chunk_hi - chunk_lo) // PAGE_BYTES * ENTRY_BYTES
        data = os.pread(fd, want, chunk_lo // PAGE_BYTES * ENTRY_BYTES)
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
        present = scan_present(fd, path, wanted) if use_scan else None
        frames = _read_frames(fd, path, pid, wanted, present)
    finally:
        os.close(fd)
    return frames


def scan_present(fd: int, path: str, wanted: Sequence[tuple[int, int]]
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
            raise process_gone(path, e) from e
        raise
    return tuple(out)


def _read_frames(fd: int, path: str, pid: int, wanted: tuple[tuple[int, int], ...],
                 present: Sequence[Sequence[tuple[int, int, int]]] | None) -> PageFrames:
    """Read the pagemap entries of `wanted` (only its `present` stretches, when known)."""
    runs = []
    for i, (lo, hi) in enumerate(wanted):
        runs.extend(read_range(fd, path, lo, hi, present[i] if present is not None else None))
    check_privileged(path, runs)
    return PageFrames(pid, wanted, tuple(runs))


def read_range(fd: int, path: str, lo: int, hi: int,
                present: Sequence[tuple[int, int, int]] | None) -> list[FrameRun]:
    try:
        return [FrameRun(s_lo, read_entries(fd, s_lo, s_hi))
                for s_lo, s_hi in (_merge_close(present) if present is not None else [(lo, hi)])]
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.ENOENT):
            raise process_gone(path, e) from e
        raise


def check_privileged(path: str, runs: Sequence[FrameRun]) -> None:
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

    @cached_property
    def by_frame(self) -> np.ndarray:
        """The extents' order by frame: argsort of `pfn`. Kept with the extents, which a
        FrameReader reuses for as long as no frame moves: the reverse map looks every extent
        up among the physical regions at each aggregation, and numpy's searchsorted on keys in
        order ran ~20x faster than on the virtual order's scattered frames (165 Ki extents of a
        4 GiB target on a fragmented host: 1.2 against 24.5 ms), more than this sort costs
        once. Extents never share a frame, so their ends are in the same order."""
        return np.argsort(self.pfn, kind="stable")


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
    windows = np.arange(-first_page % WINDOW_PAGES, len(pfn), WINDOW_PAGES)
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


def same_entries(old: Sequence[FrameRun], new: Sequence[FrameRun]) -> bool:
    """Whether two reads of one range hold the same entries at the same pages, however their
    runs are cut: patches leave a range in window-sized pieces where a full read makes one run
    per present stretch. Comparing the runs themselves found every range patched since its last
    full read changed, so the full-read period never grew while we collapsed (2026-11-27).

    Each old run is compared with the slice of the new run that holds it (numpy views, no
    copies), and both sides must say something (a nonzero entry) of as many pages: 10 ms for
    a 4 GiB range kept in 2,048 window-sized runs, 2.4 ms in 256. A run that no new run holds
    whole goes to a comparison of every page (~50 ms)."""
    if len(old) == len(new) and all(a.start == b.start and a.entries == b.entries
                                    for a, b in zip(old, new, strict=True)):
        return True
    starts = [run.start for run in new]
    views = [np.frombuffer(run.entries, dtype=np.uint64) for run in new]  # no copies
    said = 0
    for run in old:
        k = bisect_right(starts, run.start) - 1
        if k < 0 or run.end > new[k].end:
            return _same_nonzero(old, new)
        mine = np.frombuffer(run.entries, dtype=np.uint64)
        at = (run.start - new[k].start) // PAGE_BYTES
        if not np.array_equal(views[k][at:at + len(mine)], mine):
            return False
        said += int(np.count_nonzero(mine))
    return said == sum(int(np.count_nonzero(v)) for v in views)


def _same_nonzero(old: Sequence[FrameRun], new: Sequence[FrameRun]) -> bool:
    (old_pages, old_entries), (new_pages, new_entries) = _nonzero(old), _nonzero(new)
    return (np.array_equal(old_pages, new_pages)
            and np.array_equal(old_entries, new_entries))


def _nonzero(runs: Sequence[FrameRun]) -> tuple[np.ndarray, np.ndarray]:
    """The pages (numbers) of `runs` whose entry says anything, and those entries."""
    if not runs:
        empty = np.zeros(0, dtype=np.uint64)
        return empty, empty
    entries = np.concatenate([np.frombuffer(r.entries, dtype=np.uint64) for r in runs])
    pages = np.concatenate([np.arange(len(r.entries), dtype=np.uint64) + r.start // PAGE_BYTES
                            for r in runs])
    said = entries != 0
    return pages[said], entries[said]
