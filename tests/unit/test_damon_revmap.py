"""The pure paddr reverse map: physical regions + a process's page frames -> virtual picture.

The real case: the last aggregation of tests/fixtures/damon-aggregated-paddr-host-6.18.txt
and the page frames of the hotcold process that ran meanwhile (a sample of its 2 MiB windows,
tests/fixtures/revmap-hotcold-paddr-host-6.18.json). Every result is also checked against a
slow page-by-page reference. The small synthetic cases pin down the rules (which pages count,
the share quantile, clipping, addr_unit) with numbers one can check by hand.
"""

from __future__ import annotations

import json
import random
from array import array
from collections.abc import Callable
from pathlib import Path

import pytest
from damon_hp.damon.assembler import SnapshotAssembler
from damon_hp.damon.event_lines import parse_event_line
from damon_hp.damon.model import PHYSICAL, Region, Snapshot
from damon_hp.damon.revmap import reverse_map
from damon_hp.frames import (
    PM_PRESENT,
    FrameRun,
    PageFrames,
)
from damon_hp.policy import PolicyParams, PolicyState, decide
from damon_hp.ranges import HUGE_PAGE_BYTES, PAGE_BYTES
from reference.revmap_ref import page_by_page

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REVMAP = FIXTURES / "revmap-hotcold-paddr-host-6.18.json"
MIB = 1 << 20
PAGES = HUGE_PAGE_BYTES // PAGE_BYTES  # 512


def load_real() -> tuple[dict, Snapshot, PageFrames]:
    fx = json.loads(REVMAP.read_text())
    lines = (FIXTURES / fx["trace"]).read_text().splitlines()[1:]
    snaps = SnapshotAssembler(sample_us=fx["sample_us"], aggr_us=fx["aggr_us"]).feed_all(
        parse_event_line(line) for line in lines)
    windows = sorted(w for k in ("hot", "cold") for w in fx["windows"][k])
    frames = PageFrames(
        fx["pid"],
        tuple((start, start + HUGE_PAGE_BYTES) for start, _ in windows),
        tuple(FrameRun(start, array("Q", (PM_PRESENT | p if p else 0 for p in pfns)))
              for start, pfns in windows),
    )
    return fx, snaps[-1], frames


def take_frames(rng: random.Random, used: set[int], pages: int, absent: float,
                pick: Callable[[int], int]) -> list[int | None]:
    """A frame per page, `pick(page)` moved up past any frame `used` already; a share
    `absent` of the pages not present (None)."""
    pfns: list[int | None] = []
    for i in range(pages):
        p = pick(i)
        while p in used:
            p += 1
        used.add(p)
        pfns.append(None if rng.random() < absent else p)
    return pfns


def frame_run(start: int, pfns: list[int | None]) -> FrameRun:
    return FrameRun(start, array("Q", (0 if p is None else PM_PRESENT | p for p in pfns)))


def summary(result) -> dict[int, tuple]:
    return {r.start: (r.resident_pages, r.monitored_pages, r.accessed_pages, r.nr_accesses)
            for r in result.ranges}


# -- the real capture ----------------------------------------------------------------------


def test_real_capture_matches_the_page_by_page_reference():
    _, phys, frames = load_real()
    for share in (50.0, 90.0):
        assert summary(reverse_map(phys, frames, hot_page_share_pct=share)) == page_by_page(
            phys, frames, share)


def test_real_hot_windows_read_hotter_than_cold_ones():
    fx, phys, frames = load_real()
    result = reverse_map(phys, frames)
    by_start = {r.start: r for r in result.ranges}
    hot = [by_start[s] for s, _ in fx["windows"]["hot"]]
    cold = [by_start[s] for s, _ in fx["windows"]["cold"]]
    assert all(r.resident_pages == PAGES for r in hot + cold)  # hotcold writes every page
    assert all(r.monitored_pages == PAGES for r in hot + cold)  # and this kdamond sees them
    mean_share = lambda rs: sum(r.accessed_share for r in rs) / len(rs)  # noqa: E731
    assert mean_share(hot) > mean_share(cold) + 0.15
    assert sum(r.nr_accesses > 0 for r in hot) > sum(r.nr_accesses > 0 for r in cold)


def test_virtual_snapshot_feeds_the_policy_unchanged():
    fx, phys, frames = load_real()
    snap = reverse_map(phys, frames).snapshot
    assert (snap.pid, snap.sample_us, snap.aggr_us, snap.taken_at_s) == (
        fx["pid"], phys.sample_us, phys.aggr_us, phys.taken_at_s)
    assert all(r.end - r.start == HUGE_PAGE_BYTES for r in snap.regions)
    decision, _ = decide(snap, PolicyState(), PolicyParams())
    flagged = {r.start for r in snap.regions if snap.access_pct(r) >= 5.0}
    assert set(decision.hot_ranges) == flagged


# -- synthetic cases -----------------------------------------------------------------------
# Physical layout used below (addresses in bytes, frames of 4 KiB):
#   region A: frames [1000, 1300)  nr_accesses 10, age 3
#   region B: frames [1300, 2000)  nr_accesses 0,  age 7
#   region C: frames [3000, 3100)  nr_accesses 4,  age 1   (frames 2000..2999: not monitored)

A, B, C = (1000, 1300, 10, 3), (1300, 2000, 0, 7), (3000, 3100, 4, 1)


def phys(*regions, addr_unit: int = 1) -> Snapshot:
    return Snapshot(
        taken_at_s=5.0, pid=0, sample_us=500_000, aggr_us=5_000_000,
        regions=tuple(Region(s * PAGE_BYTES // addr_unit, e * PAGE_BYTES // addr_unit, a, g)
                      for s, e, a, g in regions),
        space=PHYSICAL,
    )


V = 0x7F00_0000_0000  # a 2 MiB-aligned virtual address


def test_a_run_spanning_two_regions_splits_its_pages_between_them():
    # 512 pages on frames 1100..1611: 200 in A (hot), 312 in B (idle).
    frames = PageFrames.from_pfns(1, V, list(range(1100, 1100 + PAGES)))
    (r,) = reverse_map(phys(A, B, C), frames).ranges
    assert (r.resident_pages, r.monitored_pages, r.accessed_pages) == (512, 512, 200)
    assert r.max_nr_accesses == 10 and r.mean_nr_accesses == pytest.approx(200 * 10 / 512)
    assert r.nr_accesses == 0  # only 39 % of the pages are hot: less than half
    # age: the smallest among the regions at or above that count (0: both) holding its pages
    assert r.age == 3


def test_the_share_quantile_decides_the_range_access_count():
    # 300 pages in A (10 accesses), 150 in C (4), 62 in B (0).
    pfns = list(range(1000, 1300)) + list(range(3000, 3100)) + list(range(3000, 3050)) \
        + list(range(1500, 1562))
    frames = PageFrames.from_pfns(1, V, pfns)
    levels = {share: reverse_map(phys(A, B, C), frames, hot_page_share_pct=share).ranges[0]
              for share in (50, 80, 90)}
    assert levels[50].nr_accesses == 10 and levels[50].age == 3  # 300 >= 256 pages at 10
    assert levels[80].nr_accesses == 4 and levels[80].age == 1  # 450 >= 409.6 pages at >= 4
    assert levels[90].nr_accesses == 0  # 461 pages needed, only 450 accessed


def test_unmonitored_frames_are_resident_but_count_as_idle():
    frames = PageFrames.from_pfns(1, V, list(range(2000, 2000 + PAGES)))
    (r,) = reverse_map(phys(A, B, C), frames).ranges
    assert (r.resident_pages, r.monitored_pages, r.accessed_pages, r.nr_accesses) == (
        512, 0, 0, 0)


def test_a_sparse_hot_window_is_not_called_hot():
    # 100 resident pages, all in hot region A: collapsing would make 512 resident.
    frames = PageFrames.from_pfns(1, V, list(range(1000, 1100)) + [None] * (PAGES - 100))
    (r,) = reverse_map(phys(A, B, C), frames).ranges
    assert (r.resident_pages, r.accessed_pages, r.max_nr_accesses, r.nr_accesses) == (
        100, 100, 10, 0)


def test_windows_without_resident_pages_are_left_out_and_edges_are_clipped():
    # A 5 MiB mapping starting 1 MiB into a 2 MiB window: windows [1, 2), [2, 4), [4, 6) MiB.
    # Resident, all on hot frames: the first 1 MiB (256 pages) and the last 200 pages.
    pages = 5 * MIB // PAGE_BYTES
    pfns: list[int | None] = [None] * pages
    pfns[:256] = range(1000, 1256)
    pfns[-200:] = range(1000, 1200)
    frames = PageFrames.from_pfns(1, V + MIB, pfns)
    result = reverse_map(phys(A, B, C), frames)
    assert [(r.start - V, r.end - V, r.resident_pages, r.nr_accesses) for r in result.ranges] == [
        (MIB, 2 * MIB, 256, 10),  # the whole (clipped) window is resident and hot
        (4 * MIB, 6 * MIB, 200, 0),  # 39 % of a full window: less than half
    ]


def test_swapped_and_absent_entries_are_not_resident():
    swapped = (1 << 62) | 12345  # swap type/offset, no PFN
    entries = array("Q", [PM_PRESENT | 1000, swapped, 0, PM_PRESENT | (1 << 56) | 1001])
    frames = PageFrames(1, ((V, V + 4 * PAGE_BYTES),), (FrameRun(V, entries),))
    (r,) = reverse_map(phys(A, B, C), frames).ranges
    assert (r.resident_pages, r.accessed_pages) == (2, 2)


def test_addr_unit_scales_physical_addresses():
    frames = PageFrames.from_pfns(1, V, list(range(1000, 1000 + PAGES)))
    plain = reverse_map(phys(A, B, C), frames).ranges
    scaled = reverse_map(phys(A, B, C, addr_unit=4), frames, addr_unit=4).ranges
    assert plain == scaled


def test_scattered_frames_match_the_reference():
    # Worst case for the run detection: random frames, runs of random length, holes.
    rng = random.Random(7)
    regions = []
    start = 0
    while start < 40_000:
        end = start + rng.randrange(1, 900)
        regions.append((start, end, rng.choice([0, 0, 0, 1, 3, 10]), rng.randrange(20)))
        start = end + rng.choice([0, 0, 0, 50])
    pfns: list[int | None] = []
    while len(pfns) < 6 * PAGES:
        first, n = rng.randrange(41_000), rng.choice([1, 1, 3, 40, 700])
        pfns.extend(None if rng.random() < 0.05 else first + i for i in range(n))
    frames = PageFrames.from_pfns(1, V, pfns[: 6 * PAGES])
    snap = phys(*regions)
    assert summary(reverse_map(snap, frames)) == page_by_page(snap, frames, 50.0)


def test_share_must_be_a_percentage():
    frames = PageFrames.from_pfns(1, V, [1000])
    with pytest.raises(ValueError):
        reverse_map(phys(A), frames, hot_page_share_pct=0)


def test_changed_windows_are_where_two_stretch_lists_disagree():
    from damon_hp.stretches import changed_windows

    h = HUGE_PAGE_BYTES
    old = [(V, V + 4 * h, 8)]
    # The same pages split differently (a PAGEMAP_SCAN batch boundary): nothing changed.
    assert changed_windows(old, [(V, V + h, 8), (V + h, V + 4 * h, 8)]) == []
    # One page dropped in the second window, the fourth collapsed (PMD-mapped: category 8|64).
    new = [(V, V + h + PAGE_BYTES, 8), (V + h + 2 * PAGE_BYTES, V + 3 * h, 8),
           (V + 3 * h, V + 4 * h, 72)]
    assert changed_windows(old, new) == [V + h, V + 3 * h]
    # A stretch appearing past the old ones.
    assert changed_windows(old, old + [(V + 6 * h, V + 6 * h + PAGE_BYTES, 8)]) == [V + 6 * h]


def test_many_ranges_map_as_each_would_alone_and_match_the_reference():
    # One range with more extents than are looked up in a batch (random single frames), small
    # ones below and above it, and two ranges sharing one 2 MiB window (clipped halves): mapped
    # together they give what each gives alone, in address order.
    rng = random.Random(11)
    w = HUGE_PAGE_BYTES
    layout = [  # (start, pages, frames: "run" = consecutive, "scatter" = random single ones)
        (V, 2 * PAGES, "run"),
        (V + 4 * w, 12 * PAGES, "scatter"),
        (V + 20 * w, 2 * PAGES, "scatter"),
        (V + 30 * w, PAGES // 2, "run"),
        (V + 30 * w + w // 2, PAGES // 2, "scatter"),
    ]
    used = set()
    runs, ranges = [], []
    for start, pages, kind in layout:
        first = rng.randrange(40_000)
        pfns = take_frames(rng, used, pages, 0.03, lambda i, first=first, kind=kind: (
            first + i if kind == "run" else rng.randrange(200_000, 10_000_000)))
        runs.append(frame_run(start, pfns))
        ranges.append((start, start + pages * PAGE_BYTES))
    regions = []
    start = 0
    while start < 10_000_000:
        end = start + rng.randrange(100, 60_000)
        regions.append((start, end, rng.choice([0, 0, 1, 3, 10]), rng.randrange(20)))
        start = end
    snap = phys(*regions)
    together = PageFrames(3, tuple(ranges), tuple(runs))
    assert len(together.extents[ranges[1]].pfn) > 4096  # looked up alone, not in the batch
    got = reverse_map(snap, together).ranges
    alone = [r for rng_, run in zip(ranges, runs, strict=True)
             for r in reverse_map(snap, PageFrames(3, (rng_,), (run,))).ranges]
    assert list(got) == sorted(alone, key=lambda r: (r.start, r.end))
    assert [r.start for r in got] == sorted(r.start for r in got)
    whole = {k: v for k, v in summary(reverse_map(snap, together)).items()
             if k % HUGE_PAGE_BYTES == 0 and k != V + 30 * w}
    ref = page_by_page(snap, together, 50.0)
    assert whole == {k: v for k, v in ref.items() if k != V + 30 * w}


def test_windows_sharing_an_accessed_physical_region_with_a_growing_one_are_found():
    # Four windows: w0 and w1 on neighbouring frames in one accessed region (as a buffer being
    # filled gets them), w2 in an accessed region of its own, w3 in an idle region that also
    # holds a frame of w0.
    w = [V + k * HUGE_PAGE_BYTES for k in range(4)]
    pfns = (list(range(1000, 1000 + PAGES - 1)) + [9000]  # w0, its last page beside w3's
            + list(range(1000 + PAGES, 1000 + 2 * PAGES))  # w1
            + list(range(5000, 5000 + PAGES))  # w2
            + list(range(9001, 9001 + PAGES)))  # w3
    frames = PageFrames.from_pfns(1, V, pfns)
    result = reverse_map(phys((1000, 1000 + 2 * PAGES, 6, 1), (5000, 5000 + PAGES, 6, 1),
                              (9000, 9001 + PAGES, 0, 1)), frames)
    assert result.sharing_accessed_regions({w[0]}) == {w[0], w[1]}
    assert result.sharing_accessed_regions({w[1]}) == {w[0], w[1]}
    assert result.sharing_accessed_regions({w[2]}) == {w[2]}
    # an idle region heats nothing: w3 reads idle whatever shares its region
    assert result.sharing_accessed_regions({w[3]}) == set()
    assert result.sharing_accessed_regions(set()) == set()


def random_process(rng: random.Random, pid: int, used: set[int]) -> PageFrames:
    """A process of 0-5 ranges, each of runs or scattered frames (one may be larger than the
    batch), some pages absent; frames never shared with another process."""
    runs, ranges = [], []
    start = V + rng.randrange(8) * HUGE_PAGE_BYTES
    for _ in range(rng.randrange(6)):
        pages = rng.choice([1, PAGES // 2, PAGES, 3 * PAGES, 10 * PAGES])
        first = rng.randrange(10_000_000)
        pfns = take_frames(rng, used, pages, 0.05, lambda i, first=first: (
            first + i if rng.random() < 0.7 else rng.randrange(10_000_000)))
        runs.append(frame_run(start, pfns))
        ranges.append((start, start + pages * PAGE_BYTES))
        start += pages * PAGE_BYTES + rng.choice([0, PAGE_BYTES, HUGE_PAGE_BYTES, 7 * MIB])
    return PageFrames(pid, tuple(ranges), tuple(runs))


def test_many_processes_mapped_at_once_give_what_each_gives_alone():
    """damon-hpd maps one aggregation onto all its processes in one pass
    (reverse_map_many): each result is the one reverse_map gives that process alone, whatever
    the others hold (none, one tiny range, a range larger than the batch)."""
    from damon_hp.damon.revmap import reverse_map_many

    rng = random.Random(26)
    for _ in range(30):
        regions, start = [], 0
        while start < 10_100_000:
            end = start + rng.randrange(50, 80_000)
            regions.append((start, end, rng.choice([0, 0, 1, 3, 10]), rng.randrange(20)))
            start = end + rng.choice([0, 0, 0, 500])
        snap = phys(*regions)
        used: set[int] = set()
        procs = [random_process(rng, pid, used) for pid in range(1, rng.randrange(1, 9))]
        together = reverse_map_many(snap, procs)
        for frames, got in zip(procs, together, strict=True):
            alone = reverse_map(snap, frames)
            assert got == alone and got.snapshot.pid == frames.pid
            for a, b in zip(got.accessed_pieces, alone.accessed_pieces, strict=True):
                assert a.tolist() == b.tolist()
    assert reverse_map_many(snap, []) == []
