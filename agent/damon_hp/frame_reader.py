"""FrameReader: a process's page frames snapshot after snapshot, re-reading from pagemap only
what may have moved (frames.py reads them; this module decides what to read again).

    FrameReader(pid).read(ranges) -> PageFrames      what moved since the last read, read anew
    FrameReader.verify(windows) -> PageFrames | None windows whose frames may have moved, read
"""

from __future__ import annotations

import errno
import os
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence

from damon_hp.frame_moves import own_collapse_count, page_counters
from damon_hp.frames import (
    ENTRY_BYTES,
    WINDOW_PAGES,
    Extents,
    FrameRun,
    PageFrames,
    check_privileged,
    extents_of,
    process_gone,
    read_entries,
    read_range,
    same_entries,
    scan_present,
)
from damon_hp.numpy_lean import np
from damon_hp.procfs import PAGE_IS_HUGE, open_pagemap
from damon_hp.ranges import HUGE_PAGE_BYTES, PAGE_BYTES, AddrRange, merge_adjacent
from damon_hp.stretches import (
    changed_windows,
    huge_windows,
    present_windows,
    window_spans,
    with_huge,
)

# Re-read every frame of a range at least this often even when nothing says one moved: a bound
# on how long a move no signal below covers (another process writing into the target's
# copy-on-write pages, userfaultfd moves) can mislead the reverse map. Each range has its own
# period: a full read that finds its frames where the kept entries say doubles it, up to
# FULL_READ_MAX_S; one that finds any other while no counter had moved sets it back. A 4 GiB
# target's full read costs 40-70 ms here: every 30 s it was half of a steady run's monitoring
# CPU, and one period for all ranges held it there while any one of them (a growing heap)
# changed between full reads (2026-11-27).
FULL_READ_EVERY_S = 30.0
FULL_READ_MAX_S = 120.0


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
    A range whose stretches are unchanged keeps its entries and extents, and in a range whose
    stretches changed only the 2 MiB windows where they differ are read again (extents never
    cross a window, so the others' stay exact). When neither those counters nor the ones that
    say a page was unmapped or collapsed in place (frame_moves.py) moved, the page tables are
    not walked at all: a steady process costs three small procfs reads per snapshot.

    When the counters moved since the last read, any kept window may be stale. `eager` (a
    source that can demote: an idle reading of a stale window could split a hot huge page)
    then reads everything again. Otherwise the kept windows, less those PMD-mapped (nothing is
    done with a huge range by a source that cannot demote), are only noted as unverified, and
    the caller re-reads those whose reading can lead to an action with `verify` before it
    acts (pipeline.Observer: the windows that read hot). The machine-wide
    counters move whenever any process compacts or migrates, and our own collapses compact:
    reading a 4 GiB target whole at every such aggregation was the agent's largest cost. A
    window whose frames moved and that reads idle through its old frames is only late: it is
    read again at the next full read.
    After an aggregation whose only change to the target was our own collapses (the pipeline
    says which windows with `collapsed`, and the counters rose by exactly those: `_only_ours`),
    the kept stretches take the collapsed windows as PMD-mapped and only those windows'
    entries are read again: no PAGEMAP_SCAN after each aggregation that promoted.
    The counters are read before the page tables, so a move during a read shows as a change at
    the next one. Each range is read whole once its own full-read period (FULL_READ_EVERY_S,
    growing while its reads find nothing that no counter showed) has passed, and without
    PAGEMAP_SCAN every range always is; a range whose entries read as before keeps its
    extents. When only periods ran out, only the due ranges are walked.
    """

    def __init__(self, pid: int, *, eager: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pid = pid
        self.eager = eager
        self._clock = clock
        self._moves: tuple[int, ...] | None = None
        self._churn: tuple[int, ...] = ()
        self._scanned = False  # the last read had PAGEMAP_SCAN's stretches
        self._ranges: dict[tuple[int, int], tuple[tuple, list[FrameRun], Extents | None]] = {}
        self._wanted: tuple[tuple[int, int], ...] = ()
        self._full: dict[tuple[int, int], tuple[float, float]] = {}
        """range -> (its last full read, its full-read period)"""
        self.unverified: set[int] = set()
        """2 MiB window starts whose entries were kept although frames may have moved since"""
        self.ranges_read = 0
        self.ranges_reused = 0
        self.windows_read = 0  # 2 MiB windows re-read within otherwise unchanged ranges
        self.windows_verified = 0  # 2 MiB windows re-read by `verify`
        self.scans_skipped = 0  # reads that took the stretches as they were (nothing changed)
        self.scans_spared = 0  # reads that took them with our own collapses written in
        self.scans_narrowed = 0  # reads that walked only the ranges whose full read was due
        self._collapsed: set[int] = set()
        """2 MiB windows our MADV_COLLAPSE calls made huge since the last read (`collapsed`)"""
        self._own = own_collapse_count(pid)

    def collapsed(self, windows: Iterable[int]) -> None:
        """Our MADV_COLLAPSE calls made these 2 MiB windows (starts) PMD-mapped, and did
        nothing else to the target's page tables, since the last read."""
        self._collapsed.update(windows)

    def read(self, ranges: Iterable[tuple[int, int]]) -> PageFrames:
        wanted = tuple(sorted((int(lo), int(hi)) for lo, hi in ranges if hi > lo))
        moves, churn = page_counters(self.pid, attributed=not self.eager)
        own = own_collapse_count(self.pid)
        own_rise, self._own = own - self._own, own
        collapsed, self._collapsed = self._collapsed, set()
        now = self._clock()
        due = {rng for rng in wanted
               if rng not in self._full or now - self._full[rng][0] >= self._full[rng][1]}
        steady = not due and moves is not None and wanted == self._wanted and self._scanned
        if steady and moves == self._moves and churn == self._churn:
            # Nothing that maps, unmaps, moves or collapses a page of the target happened
            # since the last read: its present stretches are as PAGEMAP_SCAN last gave them
            # (~10 ms of kernel walk per 4 GiB saved). What no counter shows waits for the
            # full read, as a move does.
            self.ranges_reused += len(wanted)
            self.scans_skipped += 1
            return self._frames()
        if steady and collapsed and self._only_ours(moves, churn, own_rise, collapsed):
            return self._read_collapsed(wanted, moves, churn, collapsed)
        fd, path = open_pagemap(self.pid)
        try:
            quiet = moves is not None and moves == self._moves and churn == self._churn
            if due and quiet and wanted == self._wanted and self._scanned:
                # Only full-read periods ran out and nothing moved (as for the reuse above):
                # the other ranges keep their stretches and only the due ones are walked (a
                # heap arena's periodic read walked a whole 4 GiB target, 25-40 ms).
                present = self._present_of_due(fd, path, wanted, due)
            else:
                present = scan_present(fd, path, wanted)
            full = (present is None or moves is None or self._moves is None
                    or (self.eager and moves != self._moves))
            known = {} if full else {r: v for r, v in self._ranges.items() if r not in due}
            if full:
                self.unverified.clear()
            elif moves != self._moves:
                # Windows PMD-mapped now are left out: a source that cannot demote never acts
                # on a huge range (nothing to collapse), so a stale reading of one misleads no
                # action, and re-reading the promoted hot set after every compaction was most
                # of what `verify` read.
                self.unverified.update(present_windows(v[0] for v in known.values())
                                       - huge_windows(present))
            fresh: dict[tuple[int, int], tuple[tuple, list[FrameRun], Extents | None]] = {}
            # A full read that finds a range's entries as kept says nothing moved there,
            # announced or not: its period doubles. One that finds a change sets it back only
            # if no counter had announced one (then something moved that no counter shows);
            # with counters moved the change may be theirs, so the period stays. Resetting it
            # whenever the counters had moved kept it at 30 s for good while we collapse: the
            # machine-wide counters move at almost every aggregation then (2026-11-27).
            periods = {rng: self._full[rng] for rng in wanted if rng in self._full}
            for i, rng in enumerate(wanted):
                stretches = present[i] if present is not None else None
                old = known.get(rng)
                if old is not None and old[0] == stretches:
                    fresh[rng] = old
                    self.ranges_reused += 1
                elif old is not None and old[2] is not None and stretches is not None:
                    windows = changed_windows(old[0], stretches)
                    fresh[rng] = (stretches, *_patch(fd, path, rng, old[1], old[2], windows))
                    self.unverified.difference_update(windows)
                    self.windows_read += len(windows)
                else:
                    runs = read_range(fd, path, *rng, stretches)
                    prev = self._ranges.get(rng)
                    kept = (prev is not None and prev[2] is not None
                            and same_entries(prev[1], runs))
                    # A full read that finds every entry as it was keeps the extents (and
                    # their frame order): rebuilding them cost ~25 ms per 4 GiB. Extents end
                    # at every absent page and 2 MiB boundary, where patches cut runs.
                    fresh[rng] = (stretches, runs, prev[2] if kept else None)
                    every = periods.get(rng, (now, FULL_READ_EVERY_S))[1]
                    if kept:
                        every = min(2 * every, FULL_READ_MAX_S)
                    elif rng in due and quiet:
                        every = FULL_READ_EVERY_S
                    periods[rng] = (now, every)
                    self.unverified.difference_update(range(
                        rng[0] - rng[0] % HUGE_PAGE_BYTES, rng[1], HUGE_PAGE_BYTES))
                    self.ranges_read += 1
        finally:
            os.close(fd)
        self._full = periods
        self._moves, self._churn, self._ranges, self._wanted = moves, churn, fresh, wanted
        self._scanned = present is not None
        return self._frames()

    def _present_of_due(self, fd: int, path: str, wanted: tuple[tuple[int, int], ...],
                        due: set[tuple[int, int]]
                        ) -> tuple[tuple[tuple[int, int, int], ...], ...] | None:
        """`scan_present` of the `due` ranges only, the kept stretches for the others."""
        mine = [rng for rng in wanted if rng in due]
        scanned = scan_present(fd, path, mine)
        if scanned is None:
            return None
        of_due = dict(zip(mine, scanned, strict=True))
        self.scans_narrowed += 1
        return tuple(of_due[rng] if rng in due else self._ranges[rng][0] for rng in wanted)

    def _only_ours(self, moves: tuple[int, ...], churn: tuple[int, ...], own_rise: int,
                   collapsed: set[int]) -> bool:
        """Whether what the counters say happened since the last read is our collapses of
        `collapsed` and nothing else in the target: the collapse count rose by as many huge
        folios as our calls allocated, and by one per window they made huge (a call that
        allocated and then failed leaves a count unexplained); no swap-out, lazy free or
        change of resident pages (a collapse that filled absent pages); no THP split.

        Page migrations may have moved frames (our collapses compact): as after any move,
        kept windows are then only noted unverified (`read`); an eager reader needs the whole
        read then anyway. Faults of the target are allowed to a lazy reader, up to one per
        window collapsed: MADV_COLLAPSE unmaps the window's PMD while it copies, under the
        mmap lock (collapse_huge_page, mm/khugepaged.c), and a target touching the window
        meanwhile faults once it may, finding the huge page mapped: 336 faults for 339 hot
        windows collapsed at one aggregation here (2026-11-29). A fault that mapped a new page
        instead would show in the resident pages, unless it hides in their per-CPU batches
        (frame_moves.page_counters); its window then reads as without it until the next full
        read, as after an unmap no counter shows: late, never a collapse of the wrong frames,
        and a lazy reader's source demotes nothing."""
        old_moves, old_churn = self._moves, self._churn
        if old_moves is None or not old_churn:
            return False
        if self.eager and moves != old_moves:
            return False
        faults = moves[-1] - old_moves[-1]
        return (moves[1:-1] == old_moves[1:-1]  # THP splits
                and 0 <= faults <= len(collapsed)
                and churn[1:] == old_churn[1:]
                and churn[0] - old_churn[0] == own_rise == len(collapsed))

    def _read_collapsed(self, wanted: tuple[tuple[int, int], ...], moves: tuple[int, ...],
                        churn: tuple[int, ...], collapsed: set[int]) -> PageFrames:
        """`read` after nothing but our own collapses (`_only_ours`): the present stretches
        are the last ones with each collapsed window PMD-mapped, as MADV_COLLAPSE's success
        says it is (mm/khugepaged.c: madvise_collapse returns 0 only once every range is
        PMD-mapped); only those windows' entries are read again (their frames are the new
        huge folio's). This spares the PAGEMAP_SCAN of the whole target after each
        aggregation that collapsed anything: ~18 ms of kernel walk per 4 GiB, most of what a
        collapsing aggregation cost beyond a steady one (docs/cost.md, 2026-11-29)."""
        fd, path = open_pagemap(self.pid)
        try:
            if moves != self._moves:
                # A page moved somewhere (compaction): as in `read`, every kept window not
                # PMD-mapped is noted unverified, the collapsed ones read below.
                now_huge = huge_windows([v[0] for v in self._ranges.values()]) | collapsed
                self.unverified.update(present_windows(v[0] for v in self._ranges.values())
                                       - now_huge)
            fresh: dict[tuple[int, int], tuple[tuple, list[FrameRun], Extents | None]] = {}
            for rng in wanted:
                stretches, runs, ext = self._ranges[rng]
                mine = sorted(w for w in collapsed
                              if w >= rng[0] and w + HUGE_PAGE_BYTES <= rng[1])
                if not mine or ext is None:
                    fresh[rng] = self._ranges[rng]
                    self.ranges_reused += 1
                    continue
                fresh[rng] = (with_huge(stretches, mine), *_patch(fd, path, rng, runs, ext,
                                                                    mine))
                self.unverified.difference_update(mine)
                self.windows_read += len(mine)
        finally:
            os.close(fd)
        self._moves, self._churn, self._ranges = moves, churn, fresh
        self.scans_spared += 1
        return self._frames()

    @property
    def extent_count(self) -> int:
        """Extents (runs of consecutive frames) of the last read's ranges."""
        return sum(len(ext.pfn) for _, _, ext in self._ranges.values() if ext is not None)

    @property
    def full_read_periods(self) -> dict[tuple[int, int], float]:
        """Each range's full-read period now, in seconds."""
        return {rng: every for rng, (_, every) in self._full.items()}

    def verify(self, windows: Iterable[int]) -> PageFrames | None:
        """Re-read the entries of those `windows` (2 MiB starts) that are unverified; the
        frames as of now if any of them had moved, else None (the caller's map stands).

        Usually none has: the counters move for any process's migration. A range whose
        entries read the same keeps its extents (and their frame order, Extents.by_frame)."""
        todo = sorted(set(windows) & self.unverified)
        if not todo:
            return None
        changed = False
        fd, path = open_pagemap(self.pid)
        try:
            for rng in self._wanted:
                lo, hi = rng
                mine = [w for w in todo if w + HUGE_PAGE_BYTES > lo and w < hi]
                stretches, runs, ext = self._ranges[rng]
                if not mine or ext is None:
                    continue
                moved = _moved_windows(fd, path, rng, runs, mine)
                if moved:
                    self._ranges[rng] = (stretches, *_patch(fd, path, rng, runs, ext, moved))
                    changed = True
        finally:
            os.close(fd)
        self.unverified.difference_update(todo)
        self.windows_verified += len(todo)
        return self._frames() if changed else None

    def huge_parts(self, ranges: Iterable[AddrRange]) -> list[AddrRange] | None:
        """The parts of `ranges` PMD-mapped as of the last `read`, from the PAGEMAP_SCAN
        stretches it took or kept: the answer of a PAGEMAP_SCAN for PAGE_IS_HUGE then, at no
        page-table walk (~4 ms per 4 GiB target). None when the last read had no stretches or
        was of other ranges.

        Stale once anything collapsed, split or faulted in the target since that read: the
        caller asks only when it did nothing to the target since, and whatever else happened
        moves the counters `read` checks, so the next read walks again (a measurement one
        aggregation late, never an action)."""
        wanted = tuple(sorted((r.start, r.end) for r in ranges if r.end > r.start))
        if not self._scanned or wanted != self._wanted:
            return None
        return merge_adjacent(AddrRange(lo, hi) for rng in wanted
                              for lo, hi, categories in self._ranges[rng][0] or ()
                              if categories & PAGE_IS_HUGE)

    def _frames(self) -> PageFrames:
        wanted, fresh = self._wanted, self._ranges
        runs = [run for rng in wanted for run in fresh[rng][1]]
        check_privileged(f"/proc/{self.pid}/pagemap", runs)
        frames = PageFrames(self.pid, wanted, tuple(runs))
        for rng, (stretches, rng_runs, ext) in fresh.items():
            if ext is None:
                ext = extents_of(rng_runs)
                fresh[rng] = (stretches, rng_runs, ext)
            if rng_runs:
                frames.extents_known[rng] = ext
        return frames


def _moved_windows(fd: int, path: str, rng: tuple[int, int], runs: Sequence[FrameRun],
                   windows: Sequence[int]) -> list[int]:
    """Those of `windows` (sorted 2 MiB starts) where pagemap now says anything else than
    `runs` (pages outside every run: not present); neighbours are read in one pread."""
    spans = window_spans(rng, windows)
    moved = []
    # Runs are in address order and disjoint: each span looks only at those from the last
    # one starting at or below it (a range of a scattered process has hundreds of runs).
    starts = [run.start for run in runs]
    for a, b in spans:
        try:
            now = read_entries(fd, a, b)
        except OSError as e:
            if e.errno in (errno.ESRCH, errno.ENOENT):
                raise process_gone(path, e) from e
            raise
        kept = array("Q", bytes(len(now) * ENTRY_BYTES))
        for run in runs[max(0, bisect_right(starts, a) - 1):bisect_left(starts, b)]:
            lo, hi = max(run.start, a), min(run.end, b)
            if lo < hi:
                i, j = (lo - run.start) // PAGE_BYTES, (hi - run.start) // PAGE_BYTES
                kept[(lo - a) // PAGE_BYTES:(hi - a) // PAGE_BYTES] = run.entries[i:j]
        if kept == now:
            continue
        for w in range(a - a % HUGE_PAGE_BYTES, b, HUGE_PAGE_BYTES):
            x, y = (max(w, a) - a) // PAGE_BYTES, (min(w + HUGE_PAGE_BYTES, b) - a) // PAGE_BYTES
            if kept[x:y] != now[x:y]:
                moved.append(w)
    return moved


def _slice(run: FrameRun, lo: int, hi: int) -> FrameRun:
    return FrameRun(lo, run.entries[(lo - run.start) // PAGE_BYTES:(hi - run.start) // PAGE_BYTES])


def _patch(fd: int, path: str, rng: tuple[int, int], runs: Sequence[FrameRun], ext: Extents,
           windows: Sequence[int]) -> tuple[list[FrameRun], Extents]:
    """`runs` and `ext` of range `rng` with the `windows` (2 MiB starts) read anew."""
    spans = window_spans(rng, windows)
    try:
        read = [FrameRun(a, read_entries(fd, a, b)) for a, b in spans]
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.ENOENT):
            raise process_gone(path, e) from e
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
    keep = ~np.isin(ext.vpage // WINDOW_PAGES, window_ids)
    vpage = np.concatenate((ext.vpage[keep], new_ext.vpage))
    order = np.argsort(vpage, kind="stable")
    merged = Extents(vpage[order], np.concatenate((ext.pfn[keep], new_ext.pfn))[order],
                      np.concatenate((ext.n[keep], new_ext.n))[order])
    return sorted(kept + read, key=lambda r: r.start), merged
