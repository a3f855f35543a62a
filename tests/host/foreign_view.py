"""How much of a process's memory a foreign paddr kdamond can see at all.

A paddr kdamond monitors the physical ranges its owner gave it, not all of RAM: on the CI host
the foreign kdamond's region starts at 4 GiB and its end is moved by its owner while the machine
runs (11.25, 13.9, 15.4, then 19.75 GiB of 24 within one hour of 2026-11-25). Where the kernel
puts a process's frames decides how much of it lies inside: a 1 GiB hot buffer read 6 %, 37 %
and 100 % inside in three runs of that hour. A frame outside gives the passive source no access
information, so what it can promote is bounded by this share, which a test must measure rather
than assume.

Measured independently of damon-hp's reverse map: one aggregation of the kdamond's regions
(from its `damon_aggregated` events) and the process's own pagemap, page by page."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from damon_hp.damon.events import AggregatedEventStream
from leftovers import damon_read

PAGE = 4096
PFN_MASK = np.uint64((1 << 55) - 1)


def present_frames(pid: int, start: int, end: int) -> np.ndarray:
    """Physical addresses of the present pages of [start, end) (root reads real PFNs)."""
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        f.seek(start // PAGE * 8)
        entries = np.frombuffer(f.read((end - start) // PAGE * 8), dtype=np.uint64)
    present = (entries >> np.uint64(63)) == 1
    return (entries[present] & PFN_MASK).astype(np.int64) * PAGE


def watched_share(pid: int, start: int, end: int, kdamond_pid: int, *, sample_us: int,
                  aggr_us: int, max_nr_regions: int) -> float:
    """Share of the present pages of [start, end) whose frames lie in a region of the
    kdamond's next aggregation (0.0 when none is present)."""
    with AggregatedEventStream(kdamond_pid, sample_us=sample_us, aggr_us=aggr_us,
                               max_nr_regions=max_nr_regions) as stream:
        snap = stream.next_snapshot(timeout_s=3 * aggr_us / 1e6 + 5)
    assert snap is not None and snap.regions, f"no aggregation of kdamond pid {kdamond_pid}"
    regions = sorted(snap.regions, key=lambda r: r.start)
    starts = np.array([r.start for r in regions], dtype=np.int64)
    ends = np.array([r.end for r in regions], dtype=np.int64)
    phys = present_frames(pid, start, end)
    if phys.size == 0:
        return 0.0
    i = np.searchsorted(starts, phys, side="right") - 1
    inside = (i >= 0) & (phys < ends[np.clip(i, 0, None)])
    return float(inside.mean())


def foreign_intervals(kdamond_dir: Path) -> dict[str, int]:
    """watched_share's keyword arguments for the kdamond of sysfs dir `kdamond_dir` (read)."""
    attrs = kdamond_dir / "contexts/0/monitoring_attrs"
    return {"sample_us": int(damon_read(attrs / "intervals/sample_us")),
            "aggr_us": int(damon_read(attrs / "intervals/aggr_us")),
            "max_nr_regions": int(damon_read(attrs / "nr_regions/max"))}


def accessed_shares(pid: int, ranges: list[tuple[int, int]], kdamond_pid: int, *,
                    aggregations: int, sample_us: int, aggr_us: int,
                    max_nr_regions: int) -> list[tuple[float, float]]:
    """Per range, (watched, accessed) averaged over the kdamond's next `aggregations`: the
    shares of its present pages whose frames lie in a region of the kdamond, and in a region
    it saw accessed (nr_accesses > 0), of the watched ones (0.0 when none is watched)."""
    sums = [[0.0, 0.0] for _ in ranges]
    with AggregatedEventStream(kdamond_pid, sample_us=sample_us, aggr_us=aggr_us,
                               max_nr_regions=max_nr_regions) as stream:
        for _ in range(aggregations):
            snap = stream.next_snapshot(timeout_s=3 * aggr_us / 1e6 + 5)
            assert snap is not None and snap.regions, f"no aggregation of kdamond pid {kdamond_pid}"
            regions = sorted(snap.regions, key=lambda r: r.start)
            starts = np.array([r.start for r in regions], dtype=np.int64)
            ends = np.array([r.end for r in regions], dtype=np.int64)
            hits = np.array([r.nr_accesses > 0 for r in regions])
            for k, (start, end) in enumerate(ranges):
                phys = present_frames(pid, start, end)
                i = np.clip(np.searchsorted(starts, phys, side="right") - 1, 0, None)
                inside = (phys >= starts[i]) & (phys < ends[i])
                if phys.size:
                    sums[k][0] += float(inside.mean())
                if inside.any():
                    sums[k][1] += float(hits[i][inside].mean())
    return [(w / aggregations, a / aggregations) for w, a in sums]


# A hot buffer the kdamond reads as accessed in at least this share of its frames (pages in
# regions with nr_accesses > 0) is one a physical source can act on. On a fragmented host a
# randomly read 512 MiB buffer read 12 % (its frames scattered over 6,917 physical 2 MiB
# blocks, ~1 MiB in each ~20 MiB region); on a fresh boot the same buffer read well above half.
SEES_HOT_SHARE = 0.5


def kdamond_sees(pid: int, start: int, end: int, kdamond_dir: Path, kdamond_pid: int,
                 aggregations: int = 2) -> float:
    """The share of [start, end)'s present pages the kdamond read as accessed, over its next
    `aggregations` (independently of damon-hp's reverse map)."""
    ((_, accessed),) = accessed_shares(pid, [(start, end)], kdamond_pid,
                                       aggregations=aggregations,
                                       **foreign_intervals(kdamond_dir))
    return accessed
