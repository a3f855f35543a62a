"""The whole huge-page decision rule: snapshots of a target's virtual memory in, promotions and
demotions out.

Pure: no I/O, no clock, no globals. Everything a decision depends on arrives as an argument
(the snapshot, the previous `PolicyState`, the target's RSS, its collapsible mappings, the
resident pages of the candidates, the system THP mode) and everything it changes leaves as a
return value (a `Decision` and the next `PolicyState`). Tests replay recorded snapshots
through the same functions.

`decide` runs the rule's steps, each a function exported here so a test can call it alone:
`hot_set` and `range_heat` (rules 1-2), `advance_streaks` (3), `judge_idle` (6),
`ready_ranges` (3-4, 8) and `admit` (4-5, 8; it returns an `Admission`). The steps that keep
records update the dict of `RangeState` they are handed; `decide` hands them a copy.

The rule, in order:

1. **Hot regions.** A region is hot in a snapshot when DAMON saw it accessed in at least
   `hot_access_pct` of the samples it took, at an age of at least `min_hot_age_s`.
2. **Aligned ranges.** Adjacent hot regions form hot spans; a span yields the 2 MiB-aligned
   ranges it covers completely, inside one mapping (a huge page cannot cross a VMA); a region
   straddling mappings counts only for one holding nearly all of it.
3. **Evidence, absolute.** Each range's streak of hot readings sums what DAMON sampled of it:
   accesses out of the samples taken. A range is ready when the sum reaches
   `promote_min_accesses` at a rate of `promote_access_pct` over at least
   `promote_after_snapshots` hot readings. A reading of a range whose resident pages may have
   grown during the aggregation (first touch: the fault sets the accessed bit), or that DAMON's
   regions have just come to cover, is withheld (`Snapshot.unsteady`, marked by the pipeline);
   the rest of the snapshot is used, so a steady process is judged from its first aggregation. Where
   the regions are the target's own (vaddr), DAMON's region age seeds the streak.
4. **Residency guard.** A ready range is collapsed only when at most `max_ptes_none` of its
   512 base pages are absent: MADV_COLLAPSE makes all 2 MiB resident, so a sparse hot range
   collapsed is memory bloat.
5. **Ranking and limits.** Ready ranges are ranked by expected benefit per byte the collapse
   occupies (access frequency times hot span, over 2 MiB plus the absent pages it adds) and
   admitted while the budget (`max_huge_bytes`, `max_huge_rss_pct` of RSS) and the collapse
   rate limit (`collapse_bytes_per_s`) allow.
6. **Demotion, on evidence, where it can act.** A promoted range is marked MADV_NOHUGEPAGE only
   after reading idle long enough while DAMON demonstrably saw the process's accesses
   (`demote_after_s` while another huge range read hot, `demote_blind_after_s` while only
   4 KiB memory did): DAMON cannot see accesses that hit the TLB, and huge pages are what the
   TLB keeps. A demoted range ready again is re-marked MADV_HUGEPAGE first. Sources without a
   DAMOS scheme of ours cannot demote (`can_demote`) and keep no idle bookkeeping.
7. **Marks.** Under THP `madvise`, promoted ranges are also marked MADV_HUGEPAGE.
8. **A process that turned THP off for itself** gets no collapse and no re-mark; its streaks
   are kept for the moment it allows THP again.

Refused collapses (`record_outcomes`) are retried after an exponential back-off; a range the
target unmapped before its collapse (UNMAPPED) is forgotten.
"""

from damon_hp.ranges import HUGE_PAGE_BYTES, PAGES_PER_HUGE

from .hotset import (
    HotSet,
    RangeHeat,
    RegionLike,
    SnapshotLike,
    access_pct,
    hot_regions,
    hot_set,
    range_heat,
)
from .params import MIB, PolicyParams
from .rule import (
    Admission,
    admit,
    advance_streaks,
    budget_bytes,
    decide,
    evidence_suffices,
    judge_idle,
    ranking_score,
    ready_ranges,
    record_outcomes,
)
from .state import UNMAPPED, Decision, Huge, PolicyState, RangeState, Streak

BASE_PAGE_BYTES = HUGE_PAGE_BYTES // PAGES_PER_HUGE
PAGES_PER_HUGE_PAGE = PAGES_PER_HUGE

__all__ = [
    "BASE_PAGE_BYTES", "HUGE_PAGE_BYTES", "MIB", "PAGES_PER_HUGE_PAGE", "Admission", "Decision",
    "HotSet", "Huge", "PolicyParams", "PolicyState", "RangeHeat", "RangeState", "RegionLike",
    "SnapshotLike", "Streak", "access_pct", "admit", "advance_streaks", "budget_bytes",
    "decide", "evidence_suffices", "hot_regions", "hot_set", "judge_idle", "range_heat",
    "ranking_score", "ready_ranges", "record_outcomes", "UNMAPPED",
]
