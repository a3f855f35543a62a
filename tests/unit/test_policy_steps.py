"""Each step of the decision rule called alone, on hand-made inputs: `hot_set` and `range_heat`
(rules 1-2), `advance_streaks` (3), `judge_idle` (6), `ready_ranges` (3-4, 8) and `admit`
(4-5, 8). test_policy*.py check the same rules through `decide`; here a failing step names
itself.
"""

from __future__ import annotations

import pytest
from damon_hp.damon.model import Region, Snapshot
from damon_hp.policy import (
    HotSet,
    Huge,
    PolicyParams,
    RangeHeat,
    RangeState,
    Streak,
    admit,
    advance_streaks,
    hot_set,
    judge_idle,
    range_heat,
    ready_ranges,
)
from damon_hp.ranges import HUGE_PAGE_BYTES as H
from damon_hp.ranges import AddrRange

BASE = 0x7F0000000000  # 2 MiB aligned
A, B, C, D = (BASE + i * H for i in range(4))


def snap(t: float, *regions: tuple[int, int, int], age: int = 10) -> Snapshot:
    """Regions as (start offset, end offset, nr_accesses) from BASE; 20 samples, 100 ms each."""
    return Snapshot(taken_at_s=t, pid=1, sample_us=5_000, aggr_us=100_000,
                    regions=tuple(Region(BASE + s, BASE + e, n, age) for s, e, n in regions))


# -- hot_set, range_heat (rules 1-2) -------------------------------------------------------------


def test_hot_set_yields_the_aligned_ranges_a_hot_region_covers_completely() -> None:
    s = snap(0.0, (0, H // 2, 0), (H // 2, 4 * H + 4096, 20), (4 * H + 4096, 8 * H, 0))
    hot = hot_set(s, PolicyParams(), None)
    assert hot.regions == [AddrRange(BASE + H // 2, BASE + 4 * H + 4096)]
    assert hot.ranges == [B, C, D]
    assert hot.span_of == {r: 4 * H + 4096 - H // 2 for r in (B, C, D)}


def test_hot_set_leaves_out_a_range_crossing_a_mapping_boundary() -> None:
    boundary = 2 * H + 64 * 1024
    maps = [AddrRange(BASE, BASE + boundary), AddrRange(BASE + boundary, BASE + 4 * H)]
    hot = hot_set(snap(0.0, (0, 2 * H, 20), (2 * H, 4 * H, 20)), PolicyParams(), maps)
    # The second region is 97 % inside the second mapping: it counts there, up to the boundary.
    assert hot.ranges == [A, B, D]
    assert hot.span_of[A] == 2 * H
    assert hot.span_of[D] == 4 * H - boundary


def test_hot_set_applies_both_the_access_and_the_age_threshold() -> None:
    params = PolicyParams(hot_access_pct=30.0, min_hot_age_s=0.5)
    # 6 of 20 samples is 30 %, 5 is 25 %; age 5 x 100 ms is 0.5 s, age 4 is 0.4 s.
    assert hot_set(snap(0.0, (0, H, 6), age=5), params, None).ranges == [A]
    assert hot_set(snap(0.0, (0, H, 5), age=5), params, None).ranges == []
    assert hot_set(snap(0.0, (0, H, 6), age=4), params, None).ranges == []


def test_range_heat_weighs_regions_by_bytes_and_keeps_the_peak_and_youngest_age() -> None:
    s = Snapshot(taken_at_s=0.0, pid=1, sample_us=5_000, aggr_us=100_000, regions=(
        Region(A, A + H // 2, 20, 4), Region(A + H // 2, B, 0, 7), Region(B, C, 10, 2)))
    heat = range_heat(s, [B, A, D])
    assert heat[A] == RangeHeat(mean_pct=50.0, max_pct=100.0, min_age=4)
    assert heat[B] == RangeHeat(mean_pct=50.0, max_pct=50.0, min_age=2)
    assert heat[D] == RangeHeat(mean_pct=0.0, max_pct=0.0, min_age=0)


# -- advance_streaks (rule 3) --------------------------------------------------------------------


def read(ranges: dict[int, RangeState], s: Snapshot, params: PolicyParams,
         withheld: frozenset[int] = frozenset()) -> None:
    """One snapshot through rules 1-3, as `decide` runs them."""
    hot = hot_set(s, params, None)
    advance_streaks(ranges, hot, range_heat(s, hot.ranges), s, params, withheld)


NO_SEED = PolicyParams(seed_streak_from_age=False)


def test_a_range_hot_in_n_consecutive_snapshots_has_a_streak_of_n() -> None:
    ranges: dict[int, RangeState] = {}
    for t in (0.0, 1.0, 2.0):
        read(ranges, snap(t, (0, H, 10)), NO_SEED)
    s = ranges[A].streak
    assert s is not None
    assert (s.hot_readings, s.since_s, s.missed) == (3, 0.0, 0)
    # 50 % of 20 samples each time: 10 sampled accesses per reading
    assert s.readings == ((10.0, 20),) * 3


@pytest.mark.parametrize(("age", "seeded"), [(2, 2), (10, 3)])
def test_a_new_streak_is_seeded_with_the_region_age_up_to_max_age_seed(age: int,
                                                                        seeded: int) -> None:
    ranges: dict[int, RangeState] = {}
    read(ranges, snap(5.0, (0, H, 10), age=age), PolicyParams(max_age_seed=3))
    s = ranges[A].streak
    assert s is not None
    assert s.hot_readings == seeded + 1
    assert s.since_s == pytest.approx(5.0 - seeded * 0.1)


def test_one_miss_is_within_the_grace_and_the_second_ends_the_streak() -> None:
    ranges: dict[int, RangeState] = {}
    read(ranges, snap(0.0, (0, H, 10)), NO_SEED)
    read(ranges, snap(1.0, (0, H, 0)), NO_SEED)
    s = ranges[A].streak
    assert s is not None
    assert (s.hot_readings, s.missed, s.readings) == (1, 1, ((10.0, 20), (0.0, 20)))
    read(ranges, snap(2.0, (0, H, 0)), NO_SEED)
    assert ranges[A].streak is None


def test_a_withheld_reading_neither_adds_to_nor_ends_a_streak() -> None:
    ranges: dict[int, RangeState] = {}
    read(ranges, snap(0.0, (0, H, 10)), NO_SEED)
    before = ranges[A]
    read(ranges, snap(1.0, (0, H, 20)), NO_SEED, withheld=frozenset({A}))
    assert ranges[A] == before


def test_a_promoted_range_keeps_no_streak() -> None:
    ranges = {A: RangeState(huge=Huge(0.0))}
    read(ranges, snap(1.0, (0, 2 * H, 10)), NO_SEED)
    assert ranges[A].streak is None
    assert ranges[B].streak is not None


# -- judge_idle (rule 6) -------------------------------------------------------------------------

IDLE = RangeHeat(0.0, 0.0, 10)
BUSY = RangeHeat(50.0, 50.0, 10)
DEMOTE = PolicyParams(demote_after_s=3.0, demote_blind_after_s=10.0)


def test_an_idle_promoted_range_is_demoted_once_huge_witnessed_idleness_reaches_demote_after_s(
) -> None:
    ranges = {A: RangeState(huge=Huge(0.0)), B: RangeState(huge=Huge(0.0))}
    heat = {A: IDLE, B: BUSY}
    assert judge_idle(ranges, heat, True, 0.0, 2.0, DEMOTE) == []
    assert ranges[A] == RangeState(huge=Huge(0.0, idle_witnessed_s=2.0, idle_huge_witnessed_s=2.0))
    assert ranges[B] == RangeState(huge=Huge(2.0))  # read hot: refreshed
    assert judge_idle(ranges, heat, True, 2.0, 3.0, DEMOTE) == [A]
    assert ranges[A] == RangeState(huge=None, demoted=True)
    assert ranges[B] == RangeState(huge=Huge(3.0))


def test_idleness_witnessed_only_by_base_pages_demotes_after_the_blind_window() -> None:
    ranges = {A: RangeState(huge=Huge(0.0))}
    # any_hot: memory of the process on 4 KiB pages read hot; no huge range did
    assert judge_idle(ranges, {A: IDLE}, True, 0.0, 5.0, DEMOTE) == []
    assert ranges[A] == RangeState(huge=Huge(0.0, idle_witnessed_s=5.0))
    assert judge_idle(ranges, {A: IDLE}, True, 5.0, 10.0, DEMOTE) == [A]
    assert ranges[A].demoted


def test_no_witness_or_no_way_to_demote_keeps_a_promoted_range_untouched() -> None:
    for any_hot, params in ((False, DEMOTE), (True, PolicyParams(can_demote=False))):
        ranges = {A: RangeState(huge=Huge(0.0))}
        assert judge_idle(ranges, {A: IDLE}, any_hot, 0.0, 1000.0, params) == []
        assert ranges == {A: RangeState(huge=Huge(0.0))}


# -- ready_ranges (rules 3-4, 8) -----------------------------------------------------------------

ENOUGH = Streak(0.0, 1, ((10.0, 20),))
TOO_FEW = Streak(0.0, 1, ((0.5, 20),))  # under promote_min_accesses = 1
ENOUGH_TWICE = Streak(0.0, 2, ((10.0, 20), (10.0, 20)))  # what a re-mark needs


def four_hot(t: float) -> tuple[Snapshot, HotSet]:
    s = snap(t, (0, 4 * H, 10))
    return s, hot_set(s, PolicyParams(), None)


def test_ready_ranges_are_those_with_evidence_and_no_pending_retry_in_address_order() -> None:
    s, hot = four_hot(1.0)
    ranges = {D: RangeState(streak=ENOUGH), A: RangeState(streak=ENOUGH),
              B: RangeState(streak=TOO_FEW), C: RangeState(streak=ENOUGH, retry_at=5.0)}
    assert ready_ranges(ranges, hot, s, PolicyParams(), None, False, frozenset()) == ([A, D], 0)
    assert ready_ranges(ranges, hot, s, PolicyParams(), None, False,
                        frozenset({A})) == ([D], 0)


def test_a_demoted_range_ready_again_is_remarked_and_collapsed_on_a_later_snapshot() -> None:
    s, hot = four_hot(1.0)
    ranges = {A: RangeState(streak=ENOUGH, demoted=True)}
    # One hot reading is evidence enough for a first promotion, not for a re-mark.
    assert ready_ranges(ranges, hot, s, PolicyParams(), None, False, frozenset()) == ([], 0)
    assert ranges[A] == RangeState(streak=ENOUGH, demoted=True)
    ranges = {A: RangeState(streak=ENOUGH_TWICE, demoted=True)}
    assert ready_ranges(ranges, hot, s, PolicyParams(), None, False, frozenset()) == ([], 0)
    assert ranges[A] == RangeState(streak=ENOUGH_TWICE, remarked_at=1.0)
    later, hot = four_hot(2.0)
    assert ready_ranges(ranges, hot, later, PolicyParams(), None, False, frozenset()) == ([A], 0)


def test_a_demoted_range_is_not_remarked_when_sparse_or_when_thp_is_off_for_the_process() -> None:
    s, hot = four_hot(1.0)
    ranges = {A: RangeState(streak=ENOUGH_TWICE, demoted=True)}
    sparse = {A: 100}  # 412 of 512 pages absent, over max_ptes_none = 256
    assert ready_ranges(ranges, hot, s, PolicyParams(), sparse, False, frozenset()) == ([], 1)
    assert ready_ranges(ranges, hot, s, PolicyParams(), None, True, frozenset()) == ([], 0)
    assert ranges[A].demoted and ranges[A].remarked_at is None


# -- admit (rules 4-5, 8) ------------------------------------------------------------------------

RANKED = [C, A, B]  # best first, not address order
PLENTY = 100.0 * H


def test_admission_follows_the_ranking_until_the_budget_is_spent() -> None:
    adm = admit(RANKED, 0, PLENTY, 2 * H, PolicyParams(), None, False)
    assert (adm.promote, adm.held_by_budget) == ([C, A], 1)
    # huge bytes already held count against the budget
    adm = admit(RANKED, H, PLENTY, 2 * H, PolicyParams(), None, False)
    assert (adm.promote, adm.held_by_budget) == ([C], 2)


def test_admission_spends_rate_credit_per_range_and_returns_the_rest() -> None:
    adm = admit(RANKED, 0, 1.5 * H, None, PolicyParams(), None, False)
    assert (adm.promote, adm.held_by_rate, adm.credit) == ([C], 2, 0.5 * H)


def test_a_sparse_range_is_held_and_spends_neither_budget_nor_credit() -> None:
    resident = {C: 100, A: 512, B: 256}  # B: exactly max_ptes_none absent, still allowed
    adm = admit(RANKED, 0, PLENTY, 2 * H, PolicyParams(), resident, False)
    assert (adm.promote, adm.held_by_residency, adm.held_by_budget) == ([A, B], 1, 0)
    assert adm.credit == PLENTY - 2 * H


def test_a_process_with_thp_off_is_admitted_nothing() -> None:
    adm = admit(RANKED, 0, PLENTY, None, PolicyParams(), None, True)
    assert (adm.promote, adm.held_by_thp_disabled, adm.credit) == ([], 3, PLENTY)
