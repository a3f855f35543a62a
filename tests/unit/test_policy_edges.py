"""Exact edge cases of the policy that a recording cannot pin down: alignment at region ends,
empty snapshots, failure back-off, re-marking a demoted range.

The snapshots here are hand-made; the behaviour on real DAMON data is in test_policy.py.
"""

from __future__ import annotations

from dataclasses import replace

from damon_hp import ranges
from damon_hp.damon.model import Region, Snapshot
from damon_hp.policy import (
    UNMAPPED,
    PolicyParams,
    PolicyState,
    RangeState,
    decide,
    record_outcomes,
)
from damon_hp.ranges import HUGE_PAGE_BYTES as H
from damon_hp.ranges import AddrRange

BASE = 0x7F0000000000  # 2 MiB aligned


def snap(t: float, *regions: tuple[int, int, int], age: int = 10) -> Snapshot:
    """Regions as (start offset, end offset, nr_accesses) relative to BASE; 20 samples max."""
    return Snapshot(
        taken_at_s=t, pid=1, sample_us=5_000, aggr_us=100_000,
        regions=tuple(Region(BASE + s, BASE + e, n, age) for s, e, n in regions),
    )


PARAMS = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0)


def test_partial_2mb_range_at_either_end_of_a_hot_region_is_never_chosen() -> None:
    s = snap(0.0, (0, H // 2, 0), (H // 2, 4 * H + 4096, 20), (4 * H + 4096, 8 * H, 0))
    d, _ = decide(s, PolicyState(), PARAMS)
    assert d.hot_ranges == (BASE + H, BASE + 2 * H, BASE + 3 * H)
    assert d.promote == d.hot_ranges


def test_adjacent_hot_regions_yield_the_range_across_their_boundary() -> None:
    s = snap(0.0, (0, H + H // 2, 20), (H + H // 2, 3 * H, 15))
    d, _ = decide(s, PolicyState(), PARAMS)
    assert d.hot_ranges == (BASE, BASE + H, BASE + 2 * H)


def test_range_straddling_a_hot_and_a_cold_region_is_not_chosen() -> None:
    s = snap(0.0, (0, H + H // 2, 20), (H + H // 2, 3 * H, 0))
    d, _ = decide(s, PolicyState(), PARAMS)
    assert d.hot_ranges == (BASE,)


def test_range_crossing_two_mappings_is_not_chosen_even_when_hot() -> None:
    s = snap(0.0, (0, H + 4096, 20), (H + 4096, 4 * H, 20))
    mappings = [AddrRange(BASE, BASE + H + 4096), AddrRange(BASE + H + 4096, BASE + 4 * H)]
    d, _ = decide(s, PolicyState(), PARAMS, mappings=mappings)
    assert d.hot_ranges == (BASE, BASE + 2 * H, BASE + 3 * H)


def test_hot_region_straddling_mappings_counts_only_for_one_holding_nearly_all_of_it() -> None:
    # DAMON has not split these regions at the boundary yet: their accesses may be either part's.
    idle, busy = AddrRange(BASE, BASE + 3 * H), AddrRange(BASE + 3 * H, BASE + 40 * H)
    blend = snap(0.0, (0, 10 * H, 20))  # 30 % idle, 70 % busy: evidence for neither
    d, _ = decide(blend, PolicyState(), PARAMS, mappings=[idle, busy])
    assert d.hot_ranges == ()
    mostly = snap(0.0, (0, 40 * H, 20))  # 92.5 % busy: counts for busy only
    d, _ = decide(mostly, PolicyState(), PARAMS, mappings=[idle, busy])
    assert d.hot_ranges == tuple(range(BASE + 3 * H, BASE + 40 * H, H))


def test_a_region_mostly_idle_whose_few_hits_its_busy_slice_explains_is_no_evidence() -> None:
    # 37 of 40 ranges idle, 3 in a busy buffer (7.5 %): 1 or 2 hits of 20 (5-10 %) are the
    # busy slice's, and the idle part must not read hot for them (seen on 7.3 at attach).
    busy, idle = AddrRange(BASE, BASE + 3 * H), AddrRange(BASE + 3 * H, BASE + 40 * H)
    for hits in (1, 2, 4):
        d, _ = decide(snap(0.0, (0, 40 * H, hits)), PolicyState(), PARAMS,
                      mappings=[busy, idle])
        assert d.hot_ranges == (), hits
    # Half the samples hit: more than the slice could draw, so the idle buffer's part is busy.
    d, _ = decide(snap(0.0, (0, 40 * H, 10)), PolicyState(), PARAMS, mappings=[busy, idle])
    assert d.hot_ranges == tuple(range(idle.start, idle.end, H))


def test_hot_region_outside_every_mapping_yields_nothing() -> None:
    s = snap(0.0, (0, 4 * H, 20))
    d, _ = decide(s, PolicyState(), PARAMS, mappings=[AddrRange(BASE + 8 * H, BASE + 9 * H)])
    assert d.hot_ranges == () and d.promote == ()


def test_empty_snapshot_changes_no_state() -> None:
    p = PolicyParams(promote_after_snapshots=3, promote_after_s=0.0, seed_streak_from_age=False)
    _, st = decide(snap(0.0, (0, 2 * H, 20)), PolicyState(), p)
    d, st2 = decide(snap(0.1), st, p)
    assert st2 == st and d.promote == () and d.demote == ()
    d3, _ = decide(snap(0.2, (0, 2 * H, 20)), st2, p)
    assert d3.promote == ()  # two hot snapshots so far, the empty one neither counted nor reset


def test_promotion_needs_a_streak_lasting_promote_after_s() -> None:
    p = PolicyParams(promote_after_snapshots=2, promote_after_s=2.0, seed_streak_from_age=False)
    st = PolicyState()
    for t in (0.0, 0.5, 1.0, 1.5):
        d, st = decide(snap(t, (0, H, 20)), st, p)
        assert d.promote == ()
    d, st = decide(snap(2.0, (0, H, 20)), st, p)
    assert d.promote == (BASE,)


def test_one_cold_snapshot_does_not_break_a_streak_but_two_do() -> None:
    p = PolicyParams(promote_after_snapshots=2, promote_after_s=1.0, promote_grace=1,
                     seed_streak_from_age=False)
    hot, cold = (0, H, 20), (0, H, 0)
    st = PolicyState()
    for t, region in ((0.0, hot), (0.4, cold), (0.8, hot)):
        d, st = decide(snap(t, region), st, p)
        assert d.promote == ()
    d, _ = decide(snap(1.2, hot), st, p)
    assert d.promote == (BASE,)  # the streak from 0.0 s held across the single miss
    st = PolicyState()
    for t, region in ((0.0, hot), (0.4, cold), (0.8, cold), (1.2, hot)):
        d, st = decide(snap(t, region), st, p)
        assert d.promote == ()  # two misses in a row: the streak restarted at 1.2 s
    d, _ = decide(snap(2.2, hot), st, p)
    assert d.promote == (BASE,)


def test_refused_collapse_is_retried_only_after_its_backoff() -> None:
    p = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0, retry_after_s=2.0)
    d, st = decide(snap(0.0, (0, H, 20)), PolicyState(), p)
    assert d.promote == (BASE,)
    st = record_outcomes(st, {BASE: "EAGAIN"}, p, now_s=0.0)
    d, st = decide(snap(1.0, (0, H, 20)), st, p)
    assert d.promote == ()
    d, st = decide(snap(2.5, (0, H, 20)), st, p)
    assert d.promote == (BASE,)
    st = record_outcomes(st, {BASE: "EAGAIN"}, p, now_s=2.5)
    # second refusal doubles the wait: 4 s
    d, st = decide(snap(5.0, (0, H, 20)), st, p)
    assert d.promote == ()
    d, st = decide(snap(6.6, (0, H, 20)), st, p)
    assert d.promote == (BASE,)


def test_a_range_the_target_unmapped_is_forgotten_not_backed_off() -> None:
    """What the target maps there next is new memory: judged afresh, collapsed at once."""
    p = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0, retry_after_s=2.0)
    d, st = decide(snap(0.0, (0, H, 20)), PolicyState(), p)
    assert d.promote == (BASE,)
    st = record_outcomes(st, {BASE: UNMAPPED}, p, now_s=0.0)
    assert BASE not in st.ranges
    d, st = decide(snap(1.0, (0, H, 20)), st, p)
    assert d.promote == (BASE,)  # a refusal (EAGAIN above) would wait until 2.0 s


def test_a_refused_range_that_flickers_out_of_the_hot_set_keeps_its_backoff() -> None:
    p = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0, retry_after_s=2.0,
                     max_retry_after_s=60.0)
    hot, cold = (0, H, 20), (0, H, 0)
    st, tries = PolicyState(), []
    t = 0.0
    while t < 30.0:
        d, st = decide(snap(t, hot if int(t * 2) % 2 == 0 else cold), st, p)
        if d.promote:
            tries.append(t)
            st = record_outcomes(st, {BASE: "EAGAIN"}, p, now_s=t)
        t += 0.5
    # 2, 4, 8, 16 s apart: tries at 0, 2, 6, 14 (and 30 would be the next), not every return
    assert tries == [0.0, 2.0, 6.0, 14.0], tries
    # ... and forgotten once it has stayed out of the hot set for a while
    d, st = decide(snap(14.5 + 16 + 60, cold), st, p)
    assert BASE not in st.failures and BASE not in st.retry_at


def test_demoted_range_that_turns_hot_is_remarked_before_it_is_collapsed_again() -> None:
    p = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0, demote_after_s=1.0)
    # A second huge range stays busy throughout: the witness that DAMON sees this process's
    # huge pages while the first one reads idle (policy rule 6; alone, idleness proves nothing).
    busy = (2 * H, 3 * H, 20)
    d, st = decide(snap(0.0, (0, H, 20), busy), PolicyState(), p)
    st = record_outcomes(st, {s: None for s in d.promote}, p, now_s=0.0)
    d, st = decide(snap(0.5, (0, H, 0), busy), st, p)
    assert d.demote == ()
    d, st = decide(snap(1.5, (0, H, 0), busy), st, p)
    assert d.demote == (BASE,) and d.nohugepage_marks == (AddrRange(BASE, BASE + H),)
    # Hot again, twice in a row (remark_after_snapshots): first the MADV_HUGEPAGE mark
    # (clears VM_NOHUGEPAGE), no collapse yet.
    d, st = decide(snap(2.0, (0, H, 20), busy), st, p)
    assert d.promote == () and d.hugepage_marks == ()
    d, st = decide(snap(2.1, (0, H, 20), busy), st, p)
    assert d.promote == ()
    assert d.hugepage_marks == (AddrRange(BASE, BASE + H),) and d.nohugepage_marks == ()
    d, st = decide(snap(2.2, (0, H, 20), busy), st, p)
    assert d.promote == (BASE,)
    st = record_outcomes(st, {BASE: None}, p, now_s=2.2)
    d, st = decide(snap(2.3, (0, H, 20), busy), st, p)
    assert d.hugepage_marks == () and BASE in st.promoted_last_hot


def _demoted(p: PolicyParams) -> PolicyState:
    """BASE promoted, then demoted while a second huge range (2H) read hot."""
    busy = (2 * H, 3 * H, 20)
    d, st = decide(snap(0.0, (0, H, 20), busy), PolicyState(), p)
    st = record_outcomes(st, {s: None for s in d.promote}, p, now_s=0.0)
    for t in (0.5, 1.5):
        d, st = decide(snap(t, (0, H, 0), busy), st, p)
    assert st.demoted == {BASE}
    return st


def test_a_demoted_range_is_not_remarked_on_one_hot_reading_however_old_its_region() -> None:
    # One reading is what a region mostly inside idle memory draws now and then from a busy
    # slice of it; DAMON's region age (20 aggregations here) seeds no re-mark.
    p = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0, demote_after_s=1.0)
    busy = (2 * H, 3 * H, 20)
    st = _demoted(p)
    t = 2.0
    for _ in range(5):  # a chance hot reading now and then, idle between
        d, st = decide(snap(t, (0, H, 20), busy, age=20), st, p)
        assert d.hugepage_marks == () and d.nohugepage_marks == (AddrRange(BASE, BASE + H),)
        for _ in range(2):  # two idle readings: the streak ends (promote_grace 1)
            t += 0.1
            d, st = decide(snap(t, (0, H, 0), busy), st, p)
        t += 0.1
    assert st.demoted == {BASE} and st.remarked == {}
    # remark_after_snapshots=1 re-marks on the first one, as the rule did before it.
    st1 = _demoted(replace(p, remark_after_snapshots=1))
    d, st1 = decide(snap(2.0, (0, H, 20), busy, age=20), st1, replace(p, remark_after_snapshots=1))
    assert d.hugepage_marks == (AddrRange(BASE, BASE + H),)


def test_a_demoted_range_hot_again_is_remarked_after_remark_after_snapshots_readings() -> None:
    busy = (2 * H, 3 * H, 20)
    for n in (1, 2, 3):
        p = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0, demote_after_s=1.0,
                         remark_after_snapshots=n)
        st = _demoted(p)
        marked_at = None
        for i in range(5):
            d, st = decide(snap(2.0 + 0.1 * i, (0, H, 20), busy), st, p)
            if d.hugepage_marks and marked_at is None:
                marked_at = i + 1
        assert marked_at == n, (n, marked_at)


def test_under_madvise_mode_promoted_and_planned_ranges_are_marked_hugepage() -> None:
    s = snap(0.0, (0, 2 * H, 20))
    d, st = decide(s, PolicyState(), PARAMS, thp_mode="madvise")
    assert d.hugepage_marks == (AddrRange(BASE, BASE + 2 * H),)
    d, _ = decide(s, PolicyState(), PARAMS, thp_mode="never")
    assert d.hugepage_marks == ()


def test_coalesce_joins_touching_ranges_only() -> None:
    assert ranges.coalesce([BASE + 2 * H, BASE, BASE + H, BASE + 5 * H]) == (
        AddrRange(BASE, BASE + 3 * H),
        AddrRange(BASE + 5 * H, BASE + 6 * H),
    )


def test_params_reject_nonsense() -> None:
    import pytest

    for bad in (
        {"hot_access_pct": 101},
        {"promote_after_snapshots": 0},
        {"max_huge_rss_pct": 150},
        {"collapse_bytes_per_s": 0},
        {"demote_after_s": -1},
    ):
        with pytest.raises(ValueError):
            PolicyParams(**bad)


def test_the_rate_bucket_holds_one_snapshot_interval_so_slow_snapshots_keep_the_rate() -> None:
    # 5 s aggregations (a foreign kdamond's): 64 ready ranges, 8 ranges/s allowed -> 40 per
    # snapshot, not the 8 a 1 s bucket would let through
    params = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0,
                          collapse_bytes_per_s=8 * H, collapse_burst_s=1.0)
    slow = Snapshot(taken_at_s=0.0, pid=1, sample_us=500_000, aggr_us=5_000_000,
                    regions=(Region(BASE, BASE + 64 * H, 10, 10),))
    d, _ = decide(slow, PolicyState(), params)
    assert len(d.promote) == 40 and d.held_by_rate == 24


def test_process_that_disabled_thp_gets_no_collapse_and_keeps_its_streaks() -> None:
    s = snap(0.0, (0, 4 * H, 20))
    params = PolicyParams(promote_after_snapshots=2, promote_after_s=0.0)
    _, state = decide(s, PolicyState(), params)
    later = snap(1.0, (0, 4 * H, 20))
    d, off = decide(later, state, params, thp_disabled=True)
    assert d.promote == ()
    assert d.held_by_thp_disabled == 4
    # The moment THP is allowed again, the streaks built meanwhile promote at once.
    d, _ = decide(snap(2.0, (0, 4 * H, 20)), off, params)
    assert d.promote and d.held_by_thp_disabled == 0


def test_demoted_range_of_a_process_that_disabled_thp_is_not_remarked() -> None:
    state = PolicyState({BASE: RangeState(demoted=True)})
    d, after = decide(snap(0.0, (0, H, 20)), state, PARAMS, thp_disabled=True)
    assert BASE in after.demoted and not after.remarked
    assert d.hugepage_marks == ()


def test_overlap_bytes_sweeps_two_disjoint_lists_in_any_order():
    from damon_hp.ranges import AddrRange, overlap_bytes

    hot = [AddrRange(20, 30), AddrRange(0, 10)]
    huge = [AddrRange(28, 40), AddrRange(5, 25)]
    assert overlap_bytes(hot, huge) == 5 + 5 + 2
    assert overlap_bytes([], huge) == 0


def test_overlap_bytes_is_the_sum_over_every_pair_on_random_lists():
    import random

    from damon_hp.ranges import AddrRange, overlap_bytes

    rng = random.Random(5)

    def disjoint(n: int) -> list[AddrRange]:
        out, at = [], 0
        for _ in range(n):
            at += rng.randrange(0, 5) << 20
            length = rng.randrange(1, 4) << 20
            out.append(AddrRange(at, at + length))
            at += length
        rng.shuffle(out)
        return out

    for _ in range(300):
        a, b = disjoint(rng.randrange(0, 30)), disjoint(rng.randrange(0, 30))
        assert overlap_bytes(a, b) == sum(x.overlap(y) for x in a for y in b)
