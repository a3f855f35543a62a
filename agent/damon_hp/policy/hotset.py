"""Rules 1 and 2 on one snapshot: which regions are hot, which 2 MiB ranges they cover, and what
DAMON read of each range."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

from damon_hp.ranges import HUGE_PAGE_BYTES, AddrRange, huge_starts, intersect, merge_adjacent

from .params import PolicyParams

_START = attrgetter("start")
_END = attrgetter("end")


class RegionLike(Protocol):
    """What the policy reads of a DAMON region (damon.model.Region has these)."""

    start: int
    end: int
    nr_accesses: int
    age: int


class SnapshotLike(Protocol):
    """What the policy reads of a snapshot of the target's virtual memory (damon.model.Snapshot
    has these)."""

    taken_at_s: float
    aggr_us: int
    regions: Sequence[RegionLike]
    unsteady: frozenset[int]
    """2 MiB range starts whose resident pages grew during the aggregation (first touch)"""
    space: str
    """damon.model.VIRTUAL or WINDOWS; never PHYSICAL (decide refuses those)"""

    @property
    def max_nr_accesses(self) -> int: ...


def access_pct(nr_accesses: int | float, max_nr_accesses: int) -> float:
    """A region's access frequency as a percentage of the most a snapshot can show."""
    if max_nr_accesses <= 0:
        return 0.0
    return min(100.0, 100.0 * nr_accesses / max_nr_accesses)


@dataclass(frozen=True)
class RangeHeat:
    """What one snapshot read of one 2 MiB range."""

    mean_pct: float
    """byte-weighted access frequency of the regions over the range (0 where none)"""
    max_pct: float
    """the highest access frequency of a region overlapping it"""
    min_age: int
    """the youngest age (aggregations) of the regions overlapping it"""


def range_heat(snapshot: SnapshotLike, starts: Iterable[int]) -> dict[int, RangeHeat]:
    """RangeHeat of each 2 MiB range in `starts`, from the regions overlapping it.

    Regions are sorted; a two-pointer walk keeps this linear in regions + ranges. When their
    ends rise with their starts (DAMON's regions of one target never overlap), the walk jumps
    to each range's first region by bisection: the policy asks for the few hot ranges not yet
    huge, and stepping over every region of a 4 GiB target's ~2,000 windows to reach them was
    most of this function's cost.
    """
    regions = sorted(snapshot.regions, key=_START)
    ends = [r.end for r in regions]
    jump = ends == sorted(ends)
    max_acc = snapshot.max_nr_accesses
    heat: dict[int, RangeHeat] = {}
    i = 0
    for start in sorted(set(starts)):
        end = start + HUGE_PAGE_BYTES
        if jump:
            i = bisect_right(ends, start, lo=i)
        while i < len(regions) and regions[i].end <= start:
            i += 1
        weighted = 0.0
        peak = 0.0
        youngest: int | None = None
        j = i
        while j < len(regions) and regions[j].start < end:
            r = regions[j]
            overlap = min(r.end, end) - max(r.start, start)
            if overlap > 0:
                pct = access_pct(r.nr_accesses, max_acc)
                weighted += pct * overlap
                peak = max(peak, pct)
                youngest = r.age if youngest is None else min(youngest, r.age)
            j += 1
        heat[start] = RangeHeat(weighted / HUGE_PAGE_BYTES, peak, youngest or 0)
    return heat


def hot_region_readings(snapshot: SnapshotLike,
                        params: PolicyParams) -> list[tuple[AddrRange, float]]:
    """Regions that pass both the access-frequency and the age threshold, sorted, each with
    its access frequency (percent of the snapshot's samples)."""
    max_acc = snapshot.max_nr_accesses
    aggr_s = snapshot.aggr_us / 1e6
    hot_pct, min_age_s = params.hot_access_pct, params.min_hot_age_s
    # One plain loop, bounds as tuples, an AddrRange made only for each region kept: a 4 GiB
    # target's snapshot has ~2,000 windows, ~500 of them hot (2026-11-29 profile).
    kept: list[tuple[int, int, float]] = []
    for r in snapshot.regions:
        if hot_pct > 0 and r.nr_accesses <= 0:
            continue  # a region never accessed reads 0 %: most of a large target's
        pct = access_pct(r.nr_accesses, max_acc)
        if pct >= hot_pct and r.age * aggr_s >= min_age_s and r.end > r.start:
            kept.append((r.start, r.end, pct))
    kept.sort()
    return [(AddrRange(lo, hi), pct) for lo, hi, pct in kept]


def hot_regions(snapshot: SnapshotLike, params: PolicyParams) -> list[AddrRange]:
    """Regions that pass both the access-frequency and the age threshold."""
    return [r for r, _ in hot_region_readings(snapshot, params)]


# How many times the share of a region outside its dominant mapping its reading must exceed
# before the reading is pinned on the dominant part: DAMON's hits of a region are a binomial
# draw over its samples, and a slice of a hot buffer of 8 % of a region draws 3 of 20 (15 %)
# one time in five, 5 of 20 (25 %) one time in fifty.
REST_MARGIN = 3.0


def dominant_part(region: AddrRange, mappings: Sequence[AddrRange],
                  share_pct: float, accessed_pct: float) -> AddrRange | None:
    """The part of `region` inside the mapping holding at least `share_pct` of it, or None
    (`mappings` sorted and disjoint). None too when the region's reading (`accessed_pct` of
    DAMON's samples) is no more than REST_MARGIN times the share of it outside that part: the
    rest alone could have drawn the hits.

    DAMON samples one random page of a region, so a region spanning a hot and an idle mapping
    reads as a blend of the two: its accesses cannot be pinned on either part. Seen in the test
    VM: regions of 65 to 184 MiB, 40 to 60 % inside a hot buffer and the rest inside an idle
    one, read hot; attributing them to the idle part collapsed tens of MiB of idle memory. And
    on 7.3: a region over 90 % inside the idle buffer, with a slice of the hot one, read at a few
    percent, over the 5 % hot threshold, and its idle part (4.7 % of the idle buffer) was
    collapsed.
    """
    best = None
    first = bisect_right(mappings, region.start, key=_END)
    if (first < len(mappings) and mappings[first].start <= region.start
            and region.end <= mappings[first].end and share_pct <= 100):
        # Wholly inside one mapping (a reverse-mapped window always is): all of it, nothing
        # outside to explain its reading. The walk below returns the same.
        return region
    for m in mappings[first:]:
        if m.start >= region.end:
            break
        start, end = max(region.start, m.start), min(region.end, m.end)
        if end > start and (best is None or end - start > best.size):
            best = AddrRange(start, end)
    if best is None or 100 * best.size < share_pct * region.size:
        return None
    rest_pct = 100.0 * (region.size - best.size) / region.size
    if rest_pct > 0 and accessed_pct <= REST_MARGIN * rest_pct:
        return None
    return best


@dataclass(frozen=True)
class HotSet:
    """Rules 1 and 2 applied to one snapshot."""

    regions: list[AddrRange]
    """the hot regions"""
    ranges: list[int]
    """2 MiB ranges fully covered by hot spans (inside one mapping when mappings are known)"""
    span_of: dict[int, int]
    """range -> bytes of the hot span it belongs to"""


def hot_set(snapshot: SnapshotLike, params: PolicyParams,
            mappings: Sequence[AddrRange] | None) -> HotSet:
    readings = hot_region_readings(snapshot, params)
    regions = [r for r, _ in readings]
    if mappings is None:
        spans = merge_adjacent(regions)
    else:
        maps = sorted(mappings)
        # A region that straddles mappings counts only for one holding nearly all of it, and
        # only when the rest cannot explain its reading; mappings are not merged: a huge page
        # cannot cross a VMA boundary.
        owned = (dominant_part(r, maps, params.mapping_share_pct, pct) for r, pct in readings)
        spans = [s for s in intersect(merge_adjacent(p for p in owned if p is not None), maps)
                 if s.size > 0]
    ranges: list[int] = []
    span_of: dict[int, int] = {}
    for span in spans:
        for start in huge_starts(span):
            ranges.append(start)
            span_of[start] = span.size
    ranges.sort()
    return HotSet(regions, ranges, span_of)
