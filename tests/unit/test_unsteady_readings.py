"""Which readings carry no evidence (pipeline.FirstTouch, pipeline.NewCoverage): ranges being
faulted in, and memory the kdamond's regions have just come to cover. Pure bookkeeping over
resident-page counts, look times and region bounds; the policy withholds what they return."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from damon_hp.damon.model import Recording, Region, Snapshot
from damon_hp.pipeline import FirstTouch, NewCoverage, aggregation_start_s
from damon_hp.policy import PolicyParams, PolicyState, decide, record_outcomes
from damon_hp.ranges import HUGE_PAGE_BYTES as H
from damon_hp.ranges import AddrRange, subtract

BASE = 0x7F0000000000
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def snap(t: float, *regions: tuple[int, int], aggr_us: int = 400_000) -> Snapshot:
    """Regions as (first range, last range + 1), ranges counted from BASE."""
    return Snapshot(t, 1, 20_000, aggr_us,
                    tuple(Region(BASE + a * H, BASE + b * H, 0, 0) for a, b in regions))


def ranges(*idx: int) -> frozenset[int]:
    return frozenset(BASE + i * H for i in idx)


def test_first_touch_marks_ranges_that_gained_resident_pages() -> None:
    ft = FirstTouch({BASE: 512, BASE + H: 10})
    assert ft.update({BASE: 512, BASE + H: 200, BASE + 2 * H: 1}) == {BASE + H, BASE + 2 * H}
    assert ft.update({BASE: 300, BASE + H: 200, BASE + 2 * H: 1}) == frozenset()


def test_growth_seen_after_an_aggregation_closed_is_withheld_from_the_next_one_too() -> None:
    """Looks come 0.3 s after their aggregation closed (aggregations of 0.4 s, samples of
    20 ms): pages that faulted in between the close and the look were counted at that look,
    and may have been sampled in the next aggregation, which shows no growth of its own."""
    ft = FirstTouch({BASE: 0})
    assert ft.update({BASE: 400}, snap(0.4, (0, 1)), looked_at_s=0.7) == {BASE}
    assert ft.update({BASE: 512}, snap(0.8, (0, 1)), looked_at_s=1.1) == {BASE}
    assert ft.update({BASE: 512}, snap(1.2, (0, 1)), looked_at_s=1.5) == {BASE}
    assert ft.update({BASE: 512}, snap(1.6, (0, 1)), looked_at_s=1.9) == frozenset()


def test_no_carry_after_a_look_too_quick_for_a_sample_or_older_than_the_aggregation() -> None:
    # 10 ms after the close, with 20 ms samples: no fault in between could have been sampled
    ft = FirstTouch({BASE: 0})
    assert ft.update({BASE: 512}, snap(0.4, (0, 1)), looked_at_s=0.41) == {BASE}
    assert ft.update({BASE: 512}, snap(0.8, (0, 1)), looked_at_s=0.81) == frozenset()
    # the agent skipped aggregations: the look predates the one read now
    ft = FirstTouch({BASE: 0})
    assert ft.update({BASE: 512}, snap(0.4, (0, 1)), looked_at_s=0.7) == {BASE}
    assert ft.update({BASE: 512}, snap(2.4, (0, 1)), looked_at_s=2.7) == frozenset()


def test_aggregation_start_errs_early_by_half_an_aggregation() -> None:
    s = snap(10.0, (0, 1))
    assert aggregation_start_s(s) == pytest.approx(10.0 - 1.5 * s.aggr_us / 1e6)


def test_memory_the_regions_newly_cover_is_withheld_once() -> None:
    """hotcold in the 7.3 VM: its buffers were mapped below the kdamond's regions, which
    covered them at the next regions update; that aggregation read the idle buffer hot."""
    heap = AddrRange(BASE, BASE + 2 * H)
    buffers = AddrRange(BASE + 10 * H, BASE + 20 * H)
    nc = NewCoverage()
    assert nc.update(snap(0.4, (0, 1), (1, 2)), [heap]) == frozenset()  # the first: nothing new
    assert nc.update(snap(0.8, (0, 2)), [heap, buffers]) == frozenset()  # not covered yet
    assert nc.update(snap(1.2, (0, 2), (10, 15), (15, 20)), [heap, buffers]) == ranges(
        *range(10, 20))
    assert nc.update(snap(1.6, (0, 2), (10, 13), (13, 20)), [heap, buffers]) == frozenset()


def test_new_coverage_counts_windows_a_region_edge_reaches_into_and_mapped_ones_only() -> None:
    nc = NewCoverage()
    nc.update(snap(0.4, (0, 4)), [])
    half = Snapshot(0.8, 1, 20_000, 400_000, (Region(BASE, BASE + 4 * H, 0, 0),
                                               Region(BASE + 4 * H, BASE + 6 * H + H // 2, 0, 0)))
    mapped = [AddrRange(BASE, BASE + 5 * H), AddrRange(BASE + 6 * H, BASE + 8 * H)]
    assert nc.update(half, mapped) == ranges(4, 6)  # range 5 is not mapped


def test_subtract_leaves_the_parts_outside() -> None:
    a = [AddrRange(0, 100), AddrRange(200, 300)]
    assert subtract(a, [AddrRange(50, 60), AddrRange(90, 250)]) == [
        AddrRange(0, 50), AddrRange(60, 90), AddrRange(250, 300)]
    assert subtract(a, []) == a
    assert subtract(a, [AddrRange(0, 400)]) == []


def test_recorded_run_reads_the_idle_buffer_hot_where_the_regions_first_cover_it() -> None:
    """A recorded 7.3 run: with nothing withheld, the aggregation that first covered hotcold's
    buffers gets idle ranges promoted; withholding what the regions newly cover (and nothing
    else) keeps every idle range out and costs no hot one."""
    rec = Recording.load(FIXTURES / "agent-run-hotcold-32m-96m-7.3-newcover.json")
    hot, cold = rec.ground_truth["hot"], rec.ground_truth["cold"]

    def promoted(withhold_new_coverage: bool) -> tuple[int, int]:
        nc, state, ever = NewCoverage(), PolicyState(), set()
        for s in rec.snapshots:
            unsteady = nc.update(s, [cold, hot])
            s = dataclasses.replace(s, unsteady=unsteady if withhold_new_coverage
                                    else frozenset())
            d, state = decide(s, state, PolicyParams(), mappings=[cold, hot])
            state = record_outcomes(state, {x: None for x in d.promote}, PolicyParams(),
                                    s.taken_at_s)
            ever.update(d.promote)
        return (sum(1 for x in ever if hot.contains(AddrRange(x, x + H))),
                sum(1 for x in ever if cold.contains(AddrRange(x, x + H))))

    hot_without, cold_without = promoted(False)
    hot_with, cold_with = promoted(True)
    assert cold_without * H > 0.02 * cold.size  # the recording shows the blind spot
    assert cold_with == 0
    assert hot_with == hot_without
