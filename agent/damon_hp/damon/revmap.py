"""The paddr reverse map: a physical DAMON snapshot seen through one process's page frames.

A paddr kdamond (the only kind some machines offer, or one that something else already runs)
reports regions of PHYSICAL memory. /proc/PID/pagemap gives the frame (PFN) behind each of the
target's virtual pages, so each of its pages inherits the access count of the physical region
holding its frame; summed per 2 MiB-aligned virtual range, that is the access picture the
policy needs, returned as an ordinary virtual-address `Snapshot`.

    read_page_frames(pid, ranges) -> PageFrames          I/O: pagemap (root), PAGEMAP_SCAN
    reverse_map(phys_snapshot, frames) -> VirtualAccess   pure

Cost, measured on the CI host (2 cores, loaded), per 4 GiB target (1 Mi pages, frames in 17 Ki
runs): reading pagemap 20-30 ms of CPU; the reverse map 30-35 ms with numpy (per-page arrays,
one bisection per run of consecutive frames), down from 100-115 ms with the pure-Python tally
it replaced.

How well the result shows a hot set depends on physical fragmentation, not on this code: with
hotcold's hot frames in long runs, 96-99 % of hot 2 MiB ranges read hot from 8 s on; with them
spread over 7x more physical 2 MiB blocks than needed, only 15-50 % did per aggregation (cold
ranges 0-10 % either way). DAMON regions (here ~5 MiB each) then mix hot and cold frames.
"""

from __future__ import annotations

import errno
import os
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import EnvironmentProblem
from ..procfs import PAGE_IS_PRESENT, PagemapScanUnsupported, ProcessGone, pagemap_scan
from .model import Region, Snapshot

PAGE_BYTES = 4096
HUGE_PAGE_BYTES = 2 << 20

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

    @property
    def resident_pages(self) -> int:
        return sum(
            sum(1 for e in run.entries if e & PM_PRESENT) for run in self.runs
        )

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


def _present_stretches(fd: int, path: str, lo: int, hi: int) -> list[tuple[int, int]] | None:
    """Present stretches of [lo, hi) by PAGEMAP_SCAN (so a mostly unpopulated mapping is not
    read page by page); None if the kernel lacks it."""
    found: list[tuple[int, int]] = []
    try:
        for r in pagemap_scan(fd, path, lo, hi, PAGE_IS_PRESENT):
            # Stretches a few holes apart are read as one: one pread of some zero entries
            # costs less than a syscall per stretch of a sparsely touched mapping.
            if found and r.start - found[-1][1] <= _MERGE_GAP_BYTES:
                found[-1] = (found[-1][0], r.end)
            else:
                found.append((r.start, r.end))
    except PagemapScanUnsupported:
        return None
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
    path = f"/proc/{pid}/pagemap"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError) as e:
        raise _gone(path, e) from e
    except PermissionError as e:
        raise EnvironmentProblem(f"cannot read {path}: reading page frames needs root") from e
    try:
        runs = []
        for lo, hi in wanted:
            stretches = _present_stretches(fd, path, lo, hi) if use_scan else None
            for s_lo, s_hi in stretches if stretches is not None else [(lo, hi)]:
                runs.append(FrameRun(s_lo, _read_entries(fd, s_lo, s_hi)))
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.ENOENT):
            raise _gone(path, e) from e
        raise
    finally:
        os.close(fd)
    _check_privileged(path, runs)
    return PageFrames(pid, wanted, tuple(runs))


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
class RangeAccess:
    """What the physical snapshot says about one 2 MiB-aligned virtual range of the target.

    Page counts are of base pages. `monitored_pages` are the resident pages whose frame lies in
    a region the kdamond monitors (a paddr kdamond may watch only part of RAM); `accessed_pages`
    those in a region with nr_accesses > 0. `nr_accesses` and `age` are what the range's Region
    in the virtual snapshot carries (see `reverse_map`).
    """

    start: int
    end: int
    resident_pages: int
    monitored_pages: int
    accessed_pages: int
    mean_nr_accesses: float  # page-weighted over the monitored pages
    max_nr_accesses: int
    nr_accesses: int
    age: int

    @property
    def pages(self) -> int:
        return (self.end - self.start) // PAGE_BYTES

    @property
    def accessed_share(self) -> float:
        """Share of the resident pages that sit in accessed regions, 0..1."""
        return self.accessed_pages / self.resident_pages if self.resident_pages else 0.0


@dataclass(frozen=True)
class VirtualAccess:
    """The reverse map's result: per-range detail and the snapshot the policy consumes."""

    ranges: tuple[RangeAccess, ...]
    snapshot: Snapshot

    @property
    def resident_pages(self) -> int:
        return sum(r.resident_pages for r in self.ranges)

    @property
    def monitored_pages(self) -> int:
        return sum(r.monitored_pages for r in self.ranges)


class _PhysicalIndex:
    """The physical regions as sorted segments of page frames, for vectorized lookups.

    `points` are the segment boundaries in PFNs; a frame `pfn` lies in segment
    k = searchsorted(points, pfn, "right"), which spans [points[k-1], points[k]); `accesses[k]`
    is the nr_accesses of the region holding it (UNMONITORED for a gap, or outside every
    region: frames the kdamond does not monitor) and `ages[k]` its age.
    """

    def __init__(self, regions: Iterable[Region], addr_unit: int) -> None:
        points: list[int] = []
        accesses = [UNMONITORED]  # k = 0: below the first region
        ages = [0]
        for r in sorted(regions, key=lambda r: r.start):
            start, end = r.start * addr_unit // PAGE_BYTES, r.end * addr_unit // PAGE_BYTES
            if end <= start:
                continue
            if not points:
                points.append(start)
            elif start < points[-1]:
                raise ValueError(f"overlapping physical regions at {r.start:#x}")
            elif start > points[-1]:
                accesses.append(UNMONITORED)  # a gap between regions
                ages.append(0)
                points.append(start)
            accesses.append(r.nr_accesses)
            ages.append(r.age)
            points.append(end)
        accesses.append(UNMONITORED)  # k = len(points): above the last region
        ages.append(0)
        self.points = np.array(points, dtype=np.int64)
        self.accesses = np.array(accesses, dtype=np.int32)
        self.ages = np.array(ages, dtype=np.int32)

    def lookup(self, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per pagemap entry: (nr_accesses or NOT_RESIDENT / UNMONITORED, age)."""
        present = (entries & np.uint64(PM_PRESENT)) != 0
        pfns = (entries & np.uint64(PM_PFN_MASK)).astype(np.int64)
        return np.where(present, self.accesses[k := self._segments(pfns)], NOT_RESIDENT), \
            self.ages[k]

    def _segments(self, pfns: np.ndarray) -> np.ndarray:
        # A process's frames come mostly in runs of consecutive PFNs (the buddy allocator hands
        # out neighbours), and bisecting per page in random order cost 70 ms per 1 Mi pages
        # here: bisect the ends of each run instead, and page by page only the runs that cross
        # a segment boundary.
        if not len(pfns):
            return np.zeros(0, dtype=np.int64)
        cut = np.flatnonzero(np.diff(pfns) != 1) + 1
        first = np.concatenate(([0], cut))
        last = np.concatenate((cut, [len(pfns)])) - 1
        k_first = np.searchsorted(self.points, pfns[first], side="right")
        k_last = np.searchsorted(self.points, pfns[last], side="right")
        lengths = last - first + 1
        k = np.repeat(k_first, lengths)
        crossing = k_first != k_last
        if crossing.any():
            pages = np.repeat(crossing, lengths)
            k[pages] = np.searchsorted(self.points, pfns[pages], side="right")
        return k


# Page states below any nr_accesses (which is >= 0).
UNMONITORED = -1
NOT_RESIDENT = -2
_WINDOW_PAGES = HUGE_PAGE_BYTES // PAGE_BYTES


def _windows_of(lo: int, hi: int, runs: Sequence[FrameRun], index: _PhysicalIndex
                ) -> tuple[int, np.ndarray, np.ndarray]:
    """The pages of virtual [lo, hi) as a (windows, 512) grid of access counts and ages, first
    window at the returned 2 MiB-aligned address; pages outside `runs` (or the range) read
    NOT_RESIDENT."""
    first = lo - lo % HUGE_PAGE_BYTES
    n_windows = -(-(hi - first) // HUGE_PAGE_BYTES)
    acc = np.full(n_windows * _WINDOW_PAGES, NOT_RESIDENT, dtype=np.int32)
    age = np.zeros(n_windows * _WINDOW_PAGES, dtype=np.int32)
    for run in runs:
        at = (run.start - first) // PAGE_BYTES
        run_acc, run_age = index.lookup(np.frombuffer(run.entries, dtype=np.uint64))
        acc[at:at + len(run_acc)] = run_acc
        age[at:at + len(run_age)] = run_age
    return first, acc.reshape(n_windows, _WINDOW_PAGES), age.reshape(n_windows, _WINDOW_PAGES)


def reverse_map(
    phys: Snapshot,
    frames: PageFrames,
    *,
    hot_page_share_pct: float = 50.0,
    addr_unit: int = 1,
) -> VirtualAccess:
    """Turn a paddr snapshot into the target's per-2 MiB virtual access picture.

    Each 2 MiB-aligned range of `frames.ranges` (clipped to the range) that has a resident page
    becomes one Region of the virtual snapshot, with
        nr_accesses = the highest access count that at least `hot_page_share_pct` % of the
                      range's pages reach (non-resident and unmonitored pages count as 0);
        age = the smallest age among the physical regions at or above that count holding its
              pages (how long the range has certainly held that level).
    Why this and not the max or the mean: a physical region mixes frames of many virtual pages
    (and processes), and its nr_accesses estimates the share of its frames that are busy (DAMON
    samples one random frame per region), so a cold range often has many frames in somewhat
    accessed regions. The policy calls a region hot from `hot_access_pct` (5 %) of
    max_nr_accesses and collapses whole 2 MiB ranges: the max lets any stray frame heat a whole
    range, and a page-weighted mean crosses 5 % as soon as one page in ten sits in a busy
    region. Measured here (hotcold 256M/512M, loaded host): cold ranges had 10-45 % of their
    pages in accessed regions, so both misfire. The quantile says "this share of the range is
    at least this hot", which is what a collapse pays off for; it also refuses ranges that are
    mostly not resident (a collapse would bloat them).
    The default share, 50 % (the median page), favours finding the hot set: in one run it
    flagged all 128 hot ranges from 16 s on and 11-41 of the 256 cold ones (5-25 of them in two
    snapshots running, which is what the policy acts on); 90 % flagged 121-125 hot and 3-17
    cold ones. In a second run, under heavier load (tests/fixtures/revmap-hotcold-*.json), hot
    ranges had only 26-88 % of their pages in accessed regions: 50 % still flagged 4-8 of 8
    sampled hot ranges and 0-1 of 8 cold ones, 90 % flagged none. A cold range collapsed by
    mistake was resident anyway (no bloat) and the policy demotes it once it reads cold.
    The mean and the max stay in `RangeAccess` for reports.

    addr_unit: the kdamond's DAMON `addr_unit` (Linux 6.18+; physical address = start *
    addr_unit). The result's snapshot keeps `phys`'s time and intervals and carries
    `frames.pid`.
    """
    if not 0 < hot_page_share_pct <= 100:
        raise ValueError(f"hot_page_share_pct must be within (0, 100], not {hot_page_share_pct}")
    index = _PhysicalIndex(phys.regions, addr_unit)
    by_range: dict[tuple[int, int], list[FrameRun]] = {r: [] for r in frames.ranges}
    starts = [lo for lo, _ in frames.ranges]
    for run in frames.runs:
        k = bisect_right(starts, run.start) - 1
        if k < 0 or run.end > frames.ranges[k][1]:
            raise ValueError(f"frame run at {run.start:#x} lies outside the ranges asked about")
        by_range[frames.ranges[k]].append(run)
    out: list[RangeAccess] = []
    for (lo, hi), runs in by_range.items():
        if runs:
            out.extend(_range_accesses(lo, hi, runs, index, hot_page_share_pct))
    snapshot = Snapshot(
        taken_at_s=phys.taken_at_s,
        pid=frames.pid,
        sample_us=phys.sample_us,
        aggr_us=phys.aggr_us,
        regions=tuple(Region(r.start, r.end, r.nr_accesses, r.age) for r in out),
    )
    return VirtualAccess(tuple(out), snapshot)


def _range_accesses(lo: int, hi: int, runs: Sequence[FrameRun], index: _PhysicalIndex,
                    share_pct: float) -> list[RangeAccess]:
    """RangeAccess of every 2 MiB window of virtual [lo, hi) that holds a resident page."""
    first, acc, age = _windows_of(lo, hi, runs, index)
    resident = (acc >= UNMONITORED).sum(axis=1)
    monitored = acc >= 0
    accessed = acc > 0
    n_monitored = monitored.sum(axis=1)
    n_accessed = accessed.sum(axis=1)
    weighted = np.where(accessed, acc, 0).sum(axis=1)
    peak = acc.max(axis=1).clip(min=0)
    # The share quantile: the k-th highest count, pages not resident or not monitored read 0;
    # k is the share of the window's (clipped) length, rounded up as "at least".
    starts = first + np.arange(acc.shape[0], dtype=np.int64) * HUGE_PAGE_BYTES
    w_lo = np.maximum(starts, lo)
    w_hi = np.minimum(starts + HUGE_PAGE_BYTES, hi)
    need = np.ceil(share_pct / 100 * ((w_hi - w_lo) // PAGE_BYTES) - 1e-9).astype(np.int64)
    ranked = -np.sort(-acc.clip(min=0), axis=1)
    level = ranked[np.arange(acc.shape[0]), need.clip(1, _WINDOW_PAGES) - 1]
    at_level = monitored & (acc >= level[:, None])
    youngest = np.where(at_level, age, np.iinfo(np.int32).max).min(axis=1)
    youngest = np.where(at_level.any(axis=1), youngest, 0)
    # Plain ints through tolist(): a numpy scalar per field per window cost more than the
    # arithmetic above.
    keep = np.flatnonzero(resident)
    out = []
    for a, b, res, mon, hit, wsum, top, lvl, old in zip(
            *(x[keep].tolist() for x in (w_lo, w_hi, resident, n_monitored, n_accessed,
                                         weighted, peak, level, youngest)), strict=True):
        out.append(RangeAccess(a, b, res, mon, hit, wsum / mon if mon else 0.0, top, lvl, old))
    return out
