"""Address ranges and the 2 MiB arithmetic of huge pages: the one place for both.

Every layer speaks `AddrRange`: DAMON regions and scheme filters, the policy's hot spans, the
ranges /proc readers measure, a benchmark's printed hot range. A huge page can only back a
2 MiB-aligned 2 MiB range, so "which whole huge pages fit in this range" is asked everywhere;
it is answered here only.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

PAGE_BYTES = 4096
HUGE_PAGE_BYTES = 2 << 20
PAGES_PER_HUGE = HUGE_PAGE_BYTES // PAGE_BYTES


@dataclass(frozen=True, order=True)
class AddrRange:
    """A byte range [start, end) of an address space (virtual, or physical for paddr)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"bad address range [{self.start:#x}, {self.end:#x})")

    @property
    def size(self) -> int:
        return self.end - self.start

    def overlap(self, other: AddrRange) -> int:
        """Bytes this range shares with `other`."""
        return max(0, min(self.end, other.end) - max(self.start, other.start))

    def contains(self, other: AddrRange) -> bool:
        return self.start <= other.start and other.end <= self.end

    def to_dict(self) -> dict[str, int]:
        return {"start": self.start, "end": self.end}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AddrRange:
        return cls(int(d["start"]), int(d["end"]))


def align_up(addr: int) -> int:
    return -(-addr // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES


def align_down(addr: int) -> int:
    return addr // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES


def huge_range(start: int) -> AddrRange:
    """The 2 MiB range starting at the aligned address `start`."""
    return AddrRange(start, start + HUGE_PAGE_BYTES)


def huge_starts(rng: AddrRange) -> list[int]:
    """Starts of the 2 MiB-aligned ranges that lie completely inside `rng`."""
    return list(range(align_up(rng.start), align_down(rng.end), HUGE_PAGE_BYTES))


def huge_capable_bytes(ranges: Iterable[AddrRange]) -> int:
    """Bytes of `ranges` covered by whole, aligned 2 MiB pages: the most that can be huge."""
    return sum(max(0, align_down(r.end) - align_up(r.start)) for r in ranges)


def coalesce(starts: Iterable[int]) -> tuple[AddrRange, ...]:
    """Turn 2 MiB range starts into the fewest contiguous ranges."""
    # Bounds first, objects last: one AddrRange per result, not one per start merged.
    spans: list[list[int]] = []
    for start in sorted(set(starts)):
        if spans and spans[-1][1] == start:
            spans[-1][1] = start + HUGE_PAGE_BYTES
        else:
            spans.append([start, start + HUGE_PAGE_BYTES])
    return tuple(AddrRange(lo, hi) for lo, hi in spans)


# AddrRange's own order as a sort key: the generated __lt__ builds two tuples per comparison
# (a third of `decide`'s sorting, 2026-11-27 profile).
BOUNDS = attrgetter("start", "end")


def merge_adjacent(ranges: Iterable[AddrRange]) -> list[AddrRange]:
    """Merge touching or overlapping ranges."""
    # Each merged range is made once, at the end: making one per range merged into it cost
    # ~500 objects per snapshot for a hot set of 500 windows side by side. A range merged with
    # nothing is returned as given.
    spans: list[list] = []  # [start, end, the range given when nothing merged into it]
    for r in sorted(ranges, key=BOUNDS):
        if spans and r.start <= spans[-1][1]:
            last = spans[-1]
            last[1], last[2] = max(last[1], r.end), None
        else:
            spans.append([r.start, r.end, r])
    return [r if r is not None else AddrRange(lo, hi) for lo, hi, r in spans]


def _sorted_disjoint(ranges: list[AddrRange]) -> bool:
    return all(a.end <= b.start for a, b in zip(ranges, ranges[1:], strict=False))


def intersect(ranges: Iterable[AddrRange], limits: Iterable[AddrRange]) -> list[AddrRange]:
    """The parts of `ranges` inside any of `limits` (one piece per overlapping pair), in the
    order of `ranges`, then of `limits`.

    Limits given sorted and disjoint (a process's mappings) are found by bisection: the plain
    double loop costs ranges x limits, and a MariaDB server maps hundreds of ranges."""
    limits = list(limits)
    out = []
    if not _sorted_disjoint(limits):
        for r in ranges:
            for lim in limits:
                start, end = max(r.start, lim.start), min(r.end, lim.end)
                if start < end:
                    out.append(AddrRange(start, end))
        return out
    ends = [lim.end for lim in limits]
    for r in ranges:
        for i in range(bisect_right(ends, r.start), len(limits)):  # no slice: no copy
            lim = limits[i]
            if lim.start >= r.end:
                break
            out.append(AddrRange(max(r.start, lim.start), min(r.end, lim.end)))
    return out


def subtract(ranges: Iterable[AddrRange], minus: Iterable[AddrRange]) -> list[AddrRange]:
    """The parts of `ranges` outside every one of `minus`, in address order."""
    cut = merge_adjacent(minus)
    out: list[AddrRange] = []
    for r in merge_adjacent(ranges):
        start = r.start
        for m in cut:
            if m.end <= start or m.start >= r.end:
                continue
            if m.start > start:
                out.append(AddrRange(start, m.start))
            start = max(start, m.end)
        if start < r.end:
            out.append(AddrRange(start, r.end))
    return out


def overlap_bytes(ranges: Iterable[AddrRange], others: Iterable[AddrRange]) -> int:
    """Bytes where `ranges` and `others` overlap, each list disjoint (in any order): one sweep,
    not every pair."""
    # Plain (start, end) pairs: sorting AddrRanges compares through their dataclass __lt__, and
    # the agent measures ~1,000 hot ranges against its huge ones at every aggregation.
    a = sorted((r.start, r.end) for r in ranges)
    b = sorted((r.start, r.end) for r in others)
    total = i = j = 0
    while i < len(a) and j < len(b):
        (a_lo, a_hi), (b_lo, b_hi) = a[i], b[j]
        total += max(0, min(a_hi, b_hi) - max(a_lo, b_lo))
        if a_hi <= b_hi:
            i += 1
        else:
            j += 1
    return total


def inside_any(start: int, ranges: Iterable[AddrRange]) -> bool:
    """Whether the 2 MiB range at `start` lies wholly inside one of `ranges`."""
    rng = huge_range(start)
    return any(r.contains(rng) for r in ranges)


def starts_inside(starts: Iterable[int], ranges: Iterable[AddrRange]) -> set[int]:
    """Those of `starts` whose 2 MiB range lies wholly inside one of `ranges`: `inside_any`
    for many starts at once, in one sweep (sorted starts against ranges sorted by start,
    keeping the furthest end reached: a range holding [s, s + 2 MiB) starts at or before s)."""
    rs = sorted(ranges, key=BOUNDS)
    out: set[int] = set()
    i, reach = 0, -1
    for s in sorted(starts):
        while i < len(rs) and rs[i].start <= s:
            reach = max(reach, rs[i].end)
            i += 1
        if reach >= s + HUGE_PAGE_BYTES:
            out.add(s)
    return out


def covered(ranges: Iterable[AddrRange], by: Iterable[AddrRange]) -> bool:
    """Whether every byte of `ranges` lies in the union of `by`."""
    union = merge_adjacent(by)
    return all(any(u.contains(r) for u in union) for r in ranges)
