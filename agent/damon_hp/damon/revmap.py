"""The paddr reverse map: a physical DAMON snapshot seen through one process's page frames.

A paddr kdamond (the only kind some machines offer, or one that something else already runs)
reports regions of PHYSICAL memory. /proc/PID/pagemap gives the frame (PFN) behind each of the
target's virtual pages, so each of its pages inherits the access count of the physical region
holding its frame; summed per 2 MiB-aligned virtual range, that is the access picture the
policy needs, returned as an ordinary virtual-address `Snapshot`.

    read_page_frames(pid, ranges) -> PageFrames          I/O: pagemap (root), PAGEMAP_SCAN
    reverse_map(phys_snapshot, frames) -> VirtualAccess   pure

Cost, measured on the development host (2 cores, loaded), per 4 GiB target (1 Mi pages):
reading pagemap 20-50 ms of CPU; the reverse map 110-125 ms when the frames lie in long
physical runs, about 300 ms (extrapolated from 768 MiB: 50-65 ms) when they are scattered,
480 ms for entirely random frames (the worst case).

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
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

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

# Pieces of at most this many pages are looked up page by page; larger ones are first tested
# for being one run of consecutive frames (97 % of neighbouring pages were, for hotcold here).
_PER_PAGE_BELOW = 16


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


@dataclass
class _Tally:
    resident: int = 0
    monitored: int = 0
    accessed: int = 0
    weighted: int = 0
    peak: int = 0
    pages_at: dict[int, int] = field(default_factory=dict)  # nr_accesses -> pages
    age_at: dict[int, int] = field(default_factory=dict)  # nr_accesses -> smallest age


class _PhysicalIndex:
    """The physical regions as sorted segments of page frames, for lookups by bisection.

    `points` are the segment boundaries in PFNs; a frame `pfn` lies in segment
    k = bisect_right(points, pfn), which spans [points[k-1], points[k]) and holds region
    `region_of[k]` (None: a gap, or outside every region: frames the kdamond does not monitor).
    """

    def __init__(self, regions: Iterable[Region], addr_unit: int) -> None:
        self.points: list[int] = []
        self.region_of: list[int | None] = [None]  # k = 0: below the first region
        self.accesses: list[int] = []
        self.ages: list[int] = []
        for r in sorted(regions, key=lambda r: r.start):
            start, end = r.start * addr_unit // PAGE_BYTES, r.end * addr_unit // PAGE_BYTES
            if end <= start:
                continue
            if not self.points:
                self.points.append(start)
            elif start < self.points[-1]:
                raise ValueError(f"overlapping physical regions at {r.start:#x}")
            elif start > self.points[-1]:
                self.region_of.append(None)  # a gap between regions
                self.points.append(start)
            self.region_of.append(len(self.accesses))
            self.points.append(end)
            self.accesses.append(r.nr_accesses)
            self.ages.append(r.age)
        self.region_of.append(None)  # k = len(points): above the last region
        self.locate = partial(bisect_right, self.points)

    def _add(self, region: int | None, pages: int, tally: _Tally) -> None:
        if region is None:
            return
        acc = self.accesses[region]
        tally.monitored += pages
        tally.pages_at[acc] = tally.pages_at.get(acc, 0) + pages
        age = self.ages[region]
        if age < tally.age_at.get(acc, age + 1):
            tally.age_at[acc] = age
        if acc:
            tally.accessed += pages
            tally.weighted += acc * pages
            tally.peak = max(tally.peak, acc)

    def add_run(self, pfn: int, count: int, tally: _Tally) -> None:
        """Tally `count` consecutive frames from `pfn` by the regions holding them."""
        tally.resident += count
        end = pfn + count
        k = self.locate(pfn)
        lo = pfn
        while lo < end:
            hi = min(end, self.points[k]) if k < len(self.points) else end
            self._add(self.region_of[k], hi - lo, tally)
            lo = hi
            k += 1

    def add_frames(self, pfns: list[int], tally: _Tally) -> None:
        """Tally scattered frames: bisection and counting run in C (map, Counter)."""
        tally.resident += len(pfns)
        for k, pages in Counter(map(self.locate, pfns)).items():
            self._add(self.region_of[k], pages, tally)


def _tally_entries(
    entries: array, lo: int, hi: int, index: _PhysicalIndex, tally: _Tally, loose: list[int]
) -> None:
    """Tally pagemap entries [lo, hi): whole runs of consecutive frames at once.

    A process's frames are mostly consecutive (the buddy allocator hands out neighbours), so
    testing a piece for being one run costs a C-level array compare and saves a lookup per
    page; a piece that is not one run is halved, and the frames of small ones are collected in
    `loose` for one batched lookup.
    """
    n = hi - lo
    first = entries[lo]
    if first & PM_PRESENT and entries[hi - 1] == first + n - 1:
        if n == 1 or entries[lo:hi] == array("Q", range(first, first + n)):
            index.add_run(first & PM_PFN_MASK, n, tally)
            return
    elif first == 0 and entries[hi - 1] == 0 and entries[lo:hi].count(0) == n:
        return  # never touched (a read without PAGEMAP_SCAN pruning)
    if n <= _PER_PAGE_BELOW:
        loose.extend(e & PM_PFN_MASK for e in entries[lo:hi] if e & PM_PRESENT)
        return
    mid = lo + n // 2
    _tally_entries(entries, lo, mid, index, tally, loose)
    _tally_entries(entries, mid, hi, index, tally, loose)


def _level_for_share(tally: _Tally, window_pages: int, share_pct: float) -> tuple[int, int]:
    """The highest nr_accesses that at least `share_pct` % of the window's pages reach.

    Pages not resident, or in frames the kdamond does not monitor, count as 0. Returns it with
    the smallest age among the regions at or above that level holding the window's pages.
    """
    need = share_pct / 100 * window_pages
    reached = 0
    level = 0
    for acc in sorted(tally.pages_at, reverse=True):
        reached += tally.pages_at[acc]
        if reached >= need:
            level = acc
            break
    ages = [age for acc, age in tally.age_at.items() if acc >= level]
    return level, min(ages, default=0)


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
    tallies: dict[int, _Tally] = {}
    for run in frames.runs:
        _tally_run(run, index, tallies)
    out = []
    for lo, hi in frames.ranges:
        window = lo - lo % HUGE_PAGE_BYTES
        while window < hi:
            w_lo, w_hi = max(lo, window), min(hi, window + HUGE_PAGE_BYTES)
            tally = tallies.get(window)
            if tally is not None and tally.resident:
                out.append(_range_access(w_lo, w_hi, tally, hot_page_share_pct))
            window += HUGE_PAGE_BYTES
    snapshot = Snapshot(
        taken_at_s=phys.taken_at_s,
        pid=frames.pid,
        sample_us=phys.sample_us,
        aggr_us=phys.aggr_us,
        regions=tuple(Region(r.start, r.end, r.nr_accesses, r.age) for r in out),
    )
    return VirtualAccess(tuple(out), snapshot)


def _tally_run(run: FrameRun, index: _PhysicalIndex, tallies: dict[int, _Tally]) -> None:
    """Tally a run's pages into the 2 MiB windows they belong to."""
    pos = 0
    total = len(run.entries)
    while pos < total:
        addr = run.start + pos * PAGE_BYTES
        window = addr - addr % HUGE_PAGE_BYTES
        stop = min(total, pos + (window + HUGE_PAGE_BYTES - addr) // PAGE_BYTES)
        tally = tallies.setdefault(window, _Tally())
        loose: list[int] = []
        _tally_entries(run.entries, pos, stop, index, tally, loose)
        if loose:
            index.add_frames(loose, tally)
        pos = stop


def _range_access(lo: int, hi: int, tally: _Tally, share_pct: float) -> RangeAccess:
    level, age = _level_for_share(tally, (hi - lo) // PAGE_BYTES, share_pct)
    return RangeAccess(
        start=lo,
        end=hi,
        resident_pages=tally.resident,
        monitored_pages=tally.monitored,
        accessed_pages=tally.accessed,
        mean_nr_accesses=tally.weighted / tally.monitored if tally.monitored else 0.0,
        max_nr_accesses=tally.peak,
        nr_accesses=level,
        age=age,
    )
