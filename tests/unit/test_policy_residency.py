"""The residency guard (policy rule 4): a hot range is collapsed only when at most
`max_ptes_none` of its 512 base pages are absent, since MADV_COLLAPSE makes all 2 MiB resident
from a single resident page. Hand-made snapshots for the exact rule; the recordings for the
promise the agent relies on: counting the candidates only is as good as counting every range.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from damon_hp import options
from damon_hp.damon.model import Recording, Region, Snapshot
from damon_hp.errors import EnvironmentProblem
from damon_hp.policy import (
    PAGES_PER_HUGE_PAGE,
    PolicyParams,
    PolicyState,
    decide,
    record_outcomes,
)
from damon_hp.ranges import HUGE_PAGE_BYTES as H

BASE = 0x7F0000000000  # 2 MiB aligned
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FULL = PAGES_PER_HUGE_PAGE


def snap(t: float, *regions: tuple[int, int, int]) -> Snapshot:
    """Regions as (first range, end range, nr_accesses) in 2 MiB units from BASE; 20 samples."""
    return Snapshot(taken_at_s=t, pid=1, sample_us=5_000, aggr_us=100_000,
                    regions=tuple(Region(BASE + a * H, BASE + b * H, n, 10)
                                  for a, b, n in regions))


NOW = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0)


def test_default_asks_for_at_least_half_of_the_range_resident() -> None:
    assert PolicyParams().max_ptes_none == 256
    d, _ = decide(snap(0.0, (0, 3, 20)), PolicyState(), NOW,
                  resident_pages={BASE: FULL, BASE + H: 256, BASE + 2 * H: 255})
    assert d.promote == (BASE, BASE + H)
    assert d.held_by_residency == 1


def test_a_hot_range_with_one_touched_page_per_64k_stays_on_base_pages() -> None:
    sparse = FULL // 16  # the sparse workload's default stride
    d, _ = decide(snap(0.0, (0, 4, 20)), PolicyState(), NOW,
                  resident_pages={BASE + i * H: sparse for i in range(4)})
    assert d.promote == () and d.held_by_residency == 4
    assert d.hot_ranges == tuple(BASE + i * H for i in range(4))  # hot all the same


@pytest.mark.parametrize(("max_ptes_none", "need"), [(0, FULL), (256, 256), (511, 1)])
def test_max_ptes_none_counts_absent_pages_as_khugepaged_does(max_ptes_none: int,
                                                               need: int) -> None:
    p = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0, max_ptes_none=max_ptes_none)
    enough, _ = decide(snap(0.0, (0, 1, 20)), PolicyState(), p, resident_pages={BASE: need})
    short, _ = decide(snap(0.0, (0, 1, 20)), PolicyState(), p, resident_pages={BASE: need - 1})
    assert enough.promote == (BASE,) and enough.held_by_residency == 0
    assert short.promote == () and short.held_by_residency == 1


def test_a_candidate_missing_from_the_counts_is_held_and_no_counts_turn_the_guard_off() -> None:
    d, _ = decide(snap(0.0, (0, 2, 20)), PolicyState(), NOW, resident_pages={BASE: FULL})
    assert d.promote == (BASE,) and d.held_by_residency == 1
    d, _ = decide(snap(0.0, (0, 2, 20)), PolicyState(), NOW, resident_pages=None)
    assert d.promote == (BASE, BASE + H) and d.held_by_residency == 0


def test_a_held_range_keeps_its_streak_and_is_collapsed_once_it_fills() -> None:
    p = PolicyParams(promote_after_snapshots=2, promote_after_s=1.0)
    st = PolicyState()
    d, st = decide(snap(0.0, (0, 1, 20)), st, p, resident_pages={BASE: 10})
    d, st = decide(snap(1.0, (0, 1, 20)), st, p, resident_pages={BASE: 10})
    assert d.promote == () and d.held_by_residency == 1
    d, st = decide(snap(2.0, (0, 1, 20)), st, p, resident_pages={BASE: 300})
    assert d.promote == (BASE,)  # no new streak needed: it was ready all along


def test_held_ranges_spend_neither_budget_nor_collapse_rate() -> None:
    # The sparse range ranks first (hotter); the rate allows one collapse per snapshot.
    p = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0, collapse_bytes_per_s=H,
                     max_huge_bytes=H)
    s = snap(0.0, (0, 1, 20), (1, 2, 10))
    d, _ = decide(s, PolicyState(), p, resident_pages={BASE: 3, BASE + H: FULL})
    assert d.promote == (BASE + H,)
    assert (d.held_by_residency, d.held_by_rate, d.held_by_budget) == (1, 0, 0)


def test_a_demoted_range_that_turns_hot_but_sparse_is_not_remarked_hugepage() -> None:
    # Under THP `madvise` a MADV_HUGEPAGE mark would let khugepaged (max_ptes_none 511 by
    # default) fill the sparse range just as a collapse would.
    p = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0, demote_after_s=1.0)
    busy = (4, 5, 20)  # a second huge range that stays hot: the witness for the demotion
    d, st = decide(snap(0.0, (0, 1, 20), busy), PolicyState(), p)
    st = record_outcomes(st, {s: None for s in d.promote}, p, now_s=0.0)
    d, st = decide(snap(0.5, (0, 1, 0), busy), st, p)
    d, st = decide(snap(1.5, (0, 1, 0), busy), st, p)
    assert d.demote == (BASE,)
    d, st = decide(snap(1.9, (0, 1, 20), busy), st, p, thp_mode="madvise",
                   resident_pages={BASE: 2})  # the first of the two hot readings a re-mark needs
    d, st = decide(snap(2.0, (0, 1, 20), busy), st, p, thp_mode="madvise",
                   resident_pages={BASE: 2})
    assert d.held_by_residency == 1 and BASE in st.demoted
    assert all(not (m.start <= BASE < m.end) for m in d.hugepage_marks)
    d, st = decide(snap(2.5, (0, 1, 20), busy), st, p, thp_mode="madvise",
                   resident_pages={BASE: FULL})
    assert BASE not in st.demoted and BASE in st.remarked


def test_params_and_option_reject_a_max_ptes_none_outside_a_huge_page() -> None:
    for bad in (-1, PAGES_PER_HUGE_PAGE):
        with pytest.raises(ValueError):
            PolicyParams(max_ptes_none=bad)
    parser = argparse.ArgumentParser()
    options.add_options(parser)
    opts = options.options_from_args(parser.parse_args(["--max-ptes-none", "511"]))
    assert opts.params.max_ptes_none == 511
    assert options.options_from_args(parser.parse_args([])).params.max_ptes_none == 256
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-ptes-none", "512"])
    opts = options.options_from_args(parser.parse_args(["--demote-blind-after", "60"]))
    assert opts.params.demote_blind_after_s == 60.0
    with pytest.raises(EnvironmentProblem):  # the policy's own check, as a usage error
        options.options_from_args(parser.parse_args(["--hot-pct", "101"]))


@pytest.mark.parametrize("name", ["damon-hotcold-256m-1g.json", "damon-phases-4x64m.json"])
def test_every_range_counted_full_decides_as_no_guard(name: str) -> None:
    """What the pipeline relies on: it hands `decide` the resident pages of every 2 MiB range
    of the mappings (its observation counted them). With every range full, the decisions
    equal those without a guard, promotions included."""
    rec = Recording.load(FIXTURES / name)
    maps = list(rec.ground_truth.values())
    full = {s: FULL for m in maps for s in range(m.start - m.start % H, m.end, H)}
    p = PolicyParams(demote_after_s=3.0, demote_blind_after_s=3.0)
    free = guarded = PolicyState()
    checked = 0
    for s in rec.snapshots:
        d_free, free = decide(s, free, p, mappings=maps)
        d, guarded = decide(s, guarded, p, mappings=maps, resident_pages=full)
        assert d == d_free
        free = record_outcomes(free, {x: None for x in d.promote}, p, s.taken_at_s)
        guarded = record_outcomes(guarded, {x: None for x in d.promote}, p, s.taken_at_s)
        checked += len(d.promote)
    assert checked > 0
