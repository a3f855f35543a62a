"""PAGEMAP_SCAN's present stretches of a range, (start, end, categories) sorted and disjoint,
as FrameReader keeps them (frame_reader.py): which 2 MiB windows they hold, which are
PMD-mapped, where two differ, and what they become once windows are collapsed. Pure.

    present_windows(stretch_lists) -> {window}     windows holding a present page
    huge_windows(stretch_lists) -> {window}        windows wholly PMD-mapped
    with_huge(stretches, windows) -> stretches     the windows made present and PMD-mapped
    changed_windows(old, new) -> [window]          windows where two stretch lists differ
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence

from damon_hp.procfs import PAGE_IS_HUGE, PAGE_IS_PRESENT
from damon_hp.ranges import HUGE_PAGE_BYTES


def present_windows(stretch_lists: Iterable[Sequence[tuple[int, int, int]] | None]) -> set[int]:
    """The 2 MiB windows holding a present page, from ranges' present stretches."""
    out: set[int] = set()
    for stretches in stretch_lists:
        for lo, hi, _ in stretches or ():
            out.update(range(lo - lo % HUGE_PAGE_BYTES, hi, HUGE_PAGE_BYTES))
    return out


def huge_windows(present: Sequence[Sequence[tuple[int, int, int]]] | None) -> set[int]:
    """The 2 MiB windows wholly PMD-mapped, from PAGEMAP_SCAN's stretches (start, end,
    categories); a PMD mapping always covers a whole aligned window."""
    out: set[int] = set()
    for stretches in present or ():
        for lo, hi, categories in stretches:
            if categories & PAGE_IS_HUGE:
                first = lo + (-lo) % HUGE_PAGE_BYTES
                out.update(range(first, hi - HUGE_PAGE_BYTES + 1, HUGE_PAGE_BYTES))
    return out


def with_huge(stretches: Sequence[tuple[int, int, int]] | None, windows: Iterable[int]
               ) -> tuple[tuple[int, int, int], ...]:
    """PAGEMAP_SCAN's stretches (start, end, categories; sorted, disjoint) with the 2 MiB
    `windows` present and PMD-mapped, neighbours of equal categories joined as the kernel
    joins them (pagemap_scan_output, fs/proc/task_mmu.c)."""
    huge = PAGE_IS_PRESENT | PAGE_IS_HUGE
    cuts = sorted((w, w + HUGE_PAGE_BYTES) for w in windows)
    pieces: list[tuple[int, int, int]] = []
    k = 0
    for lo, hi, categories in stretches or ():
        at = lo
        while k < len(cuts) and cuts[k][1] <= at:
            k += 1
        j = k
        while j < len(cuts) and cuts[j][0] < hi:
            if cuts[j][0] > at:
                pieces.append((at, cuts[j][0], categories))
            at = max(at, cuts[j][1])
            j += 1
        if at < hi:
            pieces.append((at, hi, categories))
    pieces += [(a, b, huge) for a, b in cuts]
    pieces.sort()
    out: list[tuple[int, int, int]] = []
    for lo, hi, categories in pieces:
        if out and out[-1][1] == lo and out[-1][2] == categories:
            out[-1] = (out[-1][0], hi, categories)
        else:
            out.append((lo, hi, categories))
    return tuple(out)


def changed_windows(old: Sequence[tuple[int, int, int]], new: Sequence[tuple[int, int, int]]
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


def window_spans(rng: tuple[int, int], windows: Iterable[int]) -> list[tuple[int, int]]:
    """The 2 MiB `windows` (sorted starts) clipped to the range [lo, hi), neighbours joined:
    what one pread each reads of them."""
    lo, hi = rng
    spans: list[tuple[int, int]] = []
    for w in windows:
        a, b = max(w, lo), min(w + HUGE_PAGE_BYTES, hi)
        if spans and spans[-1][1] == a:
            spans[-1] = (spans[-1][0], b)
        elif a < b:
            spans.append((a, b))
    return spans
