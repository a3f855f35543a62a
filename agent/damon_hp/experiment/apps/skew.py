"""How skewed a server's traffic was at huge-page granularity, read from the damon-hp agent's
own snapshots (`damon-hp attach --record`): the share of the sampled accesses that fell on the
hottest 10 % of the server's 2 MiB ranges during one client test.

Each 2 MiB-aligned range a snapshot covers gets the access frequency DAMON gave the region(s)
over it (`nr_accesses`, the sampling intervals in which the region was seen accessed, weighted
by the bytes of each region inside the range); summed over the test's snapshots that is the
range's share of the sampled accesses. Uniform traffic puts 10 % on the hottest 10 % of ranges;
the closer to 100 %, the fewer ranges selective huge pages need to hold the traffic.
This is the skew as damon-hp sees it, which is what it decides on, not the key-level skew of
the client: DAMON sees a page accessed only if it was touched within one sampling interval, so
lukewarm ranges read 0; through a physical source a range's frequency is its median page's
(revmap.reverse_map), which reads 0 unless half its pages were seen, while frames that share a
physical region with busy ones are pulled toward that region's frequency. `accessed_ranges`
says how many ranges read above 0 at all. Pure but for reading the recording."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from damon_hp.damon.model import Recording, Snapshot
from damon_hp.ranges import HUGE_PAGE_BYTES

HOTTEST = 0.10


def range_weights(snapshots: Iterable[Snapshot]) -> dict[int, float]:
    """Per 2 MiB range (its start), the sum over the snapshots of its byte-weighted share of
    the maximum access count (0..1 per snapshot)."""
    out: dict[int, float] = {}
    for snap in snapshots:
        top = snap.max_nr_accesses
        for r in snap.regions:
            level = min(r.nr_accesses, top) / top
            start = r.start - r.start % HUGE_PAGE_BYTES
            while start < r.end:
                overlap = min(r.end, start + HUGE_PAGE_BYTES) - max(r.start, start)
                out[start] = out.get(start, 0.0) + level * overlap / HUGE_PAGE_BYTES
                start += HUGE_PAGE_BYTES
    return out


def hottest_share(weights: dict[int, float], share: float = HOTTEST) -> float | None:
    """Share of the summed weight on the hottest `share` of the ranges (at least one range);
    None when no access was seen."""
    total = sum(weights.values())
    if not weights or total <= 0:
        return None
    k = max(1, math.ceil(share * len(weights)))
    return sum(sorted(weights.values(), reverse=True)[:k]) / total


def of_snapshots(snapshots: list[Snapshot], lo: float, hi: float) -> dict[str, Any]:
    """The skew over the snapshots taken within [lo, hi] (CLOCK_MONOTONIC seconds)."""
    inside = [s for s in snapshots if lo <= s.taken_at_s <= hi]
    weights = range_weights(inside)
    return {"snapshots": len(inside), "ranges": len(weights),
            "accessed_ranges": sum(1 for w in weights.values() if w > 0),
            "hottest_10pct_share": hottest_share(weights)}


def of_run(record: Path, t0: float, marks: dict[str, float],
           tests: list[str]) -> dict[str, Any]:
    """Per client test, the skew over its snapshots (marks `<test>_start`/`_end` are seconds
    after `t0`); {"error": why} when the recording cannot be read."""
    try:
        snapshots = list(Recording.load(record).snapshots)
    except (OSError, ValueError, KeyError) as e:
        return {"error": f"no readable recording {record}: {e}"}
    out: dict[str, Any] = {}
    for test in tests:
        a, b = marks.get(f"{test}_start"), marks.get(f"{test}_end")
        if a is not None and b is not None:
            out[test] = of_snapshots(snapshots, t0 + a, t0 + b)
    return out
