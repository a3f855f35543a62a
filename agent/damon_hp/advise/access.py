"""What the access source saw of the process, per 2 MiB range, summed over the watch. Pure.

Per snapshot, each 2 MiB-aligned virtual range gets a `Reading`:
    monitored_pages  pages the source can see (a passive source: resident pages whose frames
                     lie in the foreign kdamond's regions; vaddr: the range's pages)
    accessed_pages   of them, pages in regions DAMON saw accessed (nr_accesses > 0)
    samples          expected sampled accesses: pages x nr_accesses / max_nr_accesses, summed
                     over the regions covering the range (the weight of "share of accesses")
A range reads *accessed* in a snapshot when at least half its monitored pages sit in accessed
regions, and counts as accessed over the watch when it read so in at least half the snapshots
that saw it. Why not "accessed once": a physical region mixes frames of many ranges and
processes (damon/revmap.py), so a cold range beside busy frames reads accessed now and then
(10-45 % of a cold range's pages sat in accessed regions in one snapshot here); hot ranges read
accessed snapshot after snapshot.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from damon_hp.damon.model import Snapshot
from damon_hp.damon.revmap import VirtualAccess
from damon_hp.ranges import HUGE_PAGE_BYTES, PAGE_BYTES, AddrRange, align_down


@dataclass
class Reading:
    monitored_pages: int = 0
    accessed_pages: int = 0
    samples: float = 0.0

    @property
    def accessed(self) -> bool:
        return self.monitored_pages > 0 and 2 * self.accessed_pages >= self.monitored_pages


def readings_from_snapshot(snap: Snapshot,
                           mapped: Sequence[AddrRange] | None = None) -> dict[int, Reading]:
    """Per 2 MiB range, from a virtual-address snapshot (a vaddr kdamond's regions), counting
    only the parts inside `mapped` (sorted, disjoint; None: all). A vaddr kdamond's regions
    span the gaps between a process's mappings too."""
    out: dict[int, Reading] = {}
    top = snap.max_nr_accesses
    for r in snap.regions:
        for lo, hi in _clip(r.start, r.end, mapped):
            start = align_down(lo)
            while start < hi:
                a, b = max(start, lo), min(start + HUGE_PAGE_BYTES, hi)
                pages = (b - a) // PAGE_BYTES
                rd = out.setdefault(start, Reading())
                rd.monitored_pages += pages
                if r.nr_accesses > 0:
                    rd.accessed_pages += pages
                    rd.samples += pages * min(r.nr_accesses, top) / top
                start += HUGE_PAGE_BYTES
    return out


def _clip(lo: int, hi: int, mapped: Sequence[AddrRange] | None) -> list[tuple[int, int]]:
    if mapped is None:
        return [(lo, hi)]
    out = []
    for m in mapped[max(0, bisect_left(mapped, lo, key=lambda m: m.end)):]:
        if m.start >= hi:
            break
        a, b = max(lo, m.start), min(hi, m.end)
        if b > a:
            out.append((a, b))
    return out


def readings_from_revmap(va: VirtualAccess) -> dict[int, Reading]:
    """Per 2 MiB range, from a physical snapshot reverse-mapped onto the process."""
    top = va.snapshot.max_nr_accesses
    out: dict[int, Reading] = {}
    for r in va.ranges:
        rd = out.setdefault(align_down(r.start), Reading())
        rd.monitored_pages += r.monitored_pages
        rd.accessed_pages += r.accessed_pages
        rd.samples += r.mean_nr_accesses * r.monitored_pages / top
    return out


@dataclass
class RangeTally:
    seen: int = 0
    """snapshots in which the source saw part of the range"""
    accessed: int = 0
    """... in which it read accessed"""
    samples: float = 0.0
    monitored_pages: int = 0
    """the most pages of it the source saw in one snapshot"""
    monitored_sum: int = 0
    accessed_sum: int = 0
    """pages seen, and seen in accessed regions, summed over the snapshots"""

    @property
    def accessed_over_watch(self) -> bool:
        return self.seen > 0 and 2 * self.accessed >= self.seen


@dataclass
class AccessTally:
    """Readings summed over the watch; `add` once per usable snapshot."""

    snapshots: int = 0
    ranges: dict[int, RangeTally] = field(default_factory=dict)
    monitored_shares: list[float] = field(default_factory=list)

    def add(self, readings: dict[int, Reading], monitored_share: float | None = None) -> None:
        self.snapshots += 1
        if monitored_share is not None:
            self.monitored_shares.append(monitored_share)
        for start, rd in readings.items():
            if rd.monitored_pages <= 0:
                continue
            t = self.ranges.setdefault(start, RangeTally())
            t.seen += 1
            t.accessed += rd.accessed
            t.samples += rd.samples
            t.monitored_pages = max(t.monitored_pages, rd.monitored_pages)
            t.monitored_sum += rd.monitored_pages
            t.accessed_sum += rd.accessed_pages

    @property
    def total_samples(self) -> float:
        return sum(t.samples for t in self.ranges.values())

    def samples_on(self, starts: Iterable[int]) -> float:
        """Share (0..1) of all sampled accesses that fell on the ranges `starts`; 0 if none."""
        total = self.total_samples
        if total <= 0:
            return 0.0
        return sum(self.ranges[s].samples for s in set(starts) if s in self.ranges) / total

    def per_mapping(self, limits: Sequence[AddrRange]) -> dict[int, MappingAccess]:
        """mapping start -> what was seen of the ranges starting in it."""
        keys = sorted(self.ranges)
        total = self.total_samples
        out: dict[int, MappingAccess] = {}
        for lim in limits:
            mon = acc = mon_sum = acc_sum = 0
            samples = 0.0
            for start in keys[bisect_left(keys, align_down(lim.start)):bisect_left(keys, lim.end)]:
                t = self.ranges[start]
                mon += t.monitored_pages * PAGE_BYTES
                samples += t.samples
                mon_sum += t.monitored_sum
                acc_sum += t.accessed_sum
                if t.accessed_over_watch:
                    acc += t.monitored_pages * PAGE_BYTES
            out[lim.start] = MappingAccess(mon, acc, samples / total if total > 0 else None,
                                           acc_sum / mon_sum if mon_sum else None)
        return out


@dataclass(frozen=True)
class MappingAccess:
    monitored_bytes: int
    accessed_bytes: int
    samples_share: float | None
    """share of all the process's sampled accesses that fell in this mapping"""
    accessed_page_share: float | None = None
    """share of its seen pages that sat in accessed regions, over all snapshots (page by page,
    no 2 MiB rule: what the kdamond itself shows of it)"""

def top_share(weights: Sequence[float], fraction: float) -> float | None:
    """Share of the total weight held by the heaviest `fraction` of the items (at least one);
    None when there is no weight at all."""
    total = sum(weights)
    if not weights or total <= 0:
        return None
    n = max(1, math.ceil(fraction * len(weights)))
    return sum(sorted(weights, reverse=True)[:n]) / total


@dataclass(frozen=True)
class AccessSummary:
    snapshots: int
    monitored_bytes: int
    accessed_bytes: int
    """in ranges that read accessed in at least half the aggregations (the steady working set)"""
    accessed_any_bytes: int
    """in ranges that read accessed in any aggregation (an upper bound: physical sources add
    cold ranges beside busy frames)"""
    ranges: int
    top10_share: float | None
    top50_share: float | None
    monitored_share: float | None
    """passive/paddr: least share of the resident memory in the kdamond's regions per snapshot"""

    @property
    def accessed_share(self) -> float | None:
        return self.accessed_bytes / self.monitored_bytes if self.monitored_bytes else None

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "accessed_share": self.accessed_share}


def summarize(tally: AccessTally) -> AccessSummary:
    ranges = list(tally.ranges.values())
    weights = [t.samples for t in ranges]
    mon = sum(t.monitored_pages for t in ranges) * PAGE_BYTES
    acc = sum(t.monitored_pages for t in ranges if t.accessed_over_watch) * PAGE_BYTES
    once = sum(t.monitored_pages for t in ranges if t.accessed) * PAGE_BYTES
    return AccessSummary(
        snapshots=tally.snapshots, monitored_bytes=mon, accessed_bytes=acc,
        accessed_any_bytes=once, ranges=len(ranges),
        top10_share=top_share(weights, 0.10), top50_share=top_share(weights, 0.50),
        monitored_share=min(tally.monitored_shares) if tally.monitored_shares else None)
