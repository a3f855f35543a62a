"""The whole huge-page decision rule: DAMON snapshots in, promotions and demotions out.

Pure: no I/O, no clock, no globals. Everything a decision depends on arrives as an argument
(the snapshot, the previous `PolicyState`, the target's RSS, its collapsible mappings, the system
THP mode) and everything it changes leaves as a return value (a `Decision` and the next
`PolicyState`). The agent threads the state from one call to the next; tests replay recorded
snapshots through the same functions.

The rule, in order:

1. **Hot regions.** A DAMON region is hot in a snapshot when its access frequency
   (nr_accesses as a percentage of the snapshot's max_nr_accesses) is at least
   `hot_access_pct` and its age (aggregation intervals its frequency has held, in seconds) is
   at least `min_hot_age_s`.
2. **Aligned ranges.** Adjacent hot regions form hot spans (DAMON may split one hot buffer into
   several regions; the boundary between two hot regions is not a reason to lose the 2 MiB range
   across it). A span yields only the 2 MiB-aligned ranges it covers completely, and, when the
   target's mappings are known, only those inside one mapping (a huge page cannot cross a VMA);
   a hot region that straddles mappings counts only for a mapping holding nearly all of it.
   A 2 MiB range partly covered by a hot span is never collapsed.
3. **Hysteresis up.** A range is promoted only after a hot streak of at least
   `promote_after_snapshots` hot snapshots spanning at least `promote_after_s` (a streak
   survives `promote_grace` non-hot snapshots in a row), so neither one noisy aggregation
   interval nor a sequential pass through the range triggers a collapse.
4. **Residency guard.** A ready range is collapsed (or re-marked, see 6) only when at most
   `max_ptes_none` of its 512 base pages are absent, counted by the caller from the target's
   page table (`resident_pages`, for the `collapse_candidates` only). MADV_COLLAPSE ignores
   khugepaged's max_ptes_none: one resident page is enough and the collapse makes all 2 MiB
   resident, so a hot but sparse range collapsed is memory bloat. Ranges held here keep their
   streak and are looked at again every snapshot (`Decision.held_by_residency` counts them).
5. **Ranking and limits.** Ready ranges are ranked by expected TLB benefit: the access frequency
   over the range times the size of the hot span it belongs to. They are admitted in that order
   while the budget (`max_huge_bytes`, `max_huge_rss_pct` of RSS) and the collapse rate limit
   (`collapse_bytes_per_s`, token bucket of `collapse_burst_s`) allow.
6. **Hysteresis down, on evidence.** A promoted range is demoted -- marked MADV_NOHUGEPAGE so
   that nothing collapses it again -- only after DAMON has shown it idle (below
   `hot_access_pct`) for long enough *while DAMON demonstrably saw the process's accesses*.
   "No access seen" alone is no evidence for a huge page: DAMON clears accessed bits without a
   TLB flush, and the CPU sets a page-table accessed bit only when it walks the page table, so
   a hot set whose translations stay cached reads idle however busy it is (0 % for 17 s seen
   in the test VM; long stretches on real arm64 machines, per the DAMON maintainers). A huge
   page needs 512 times fewer TLB entries than the same memory on 4 KiB pages, so huge ranges
   are what the blind spot hides first. Each snapshot in which the range reads idle counts the
   time since the previous snapshot as
     - *huge-witnessed* idle time, when another promoted range of the process read hot in the
       same snapshot: DAMON saw this process's huge pages being walked, so the silence of this
       one means something; demoted after `demote_after_s` of it;
     - *base-witnessed* idle time, when only memory on 4 KiB pages read hot: the process runs
       and DAMON samples it, but its huge translations may all be cached; demoted only after
       `demote_blind_after_s` (much longer) of witnessed idle time of either kind;
     - nothing, when no memory of the process read hot: DAMON saw nothing at all, which a
       sleeping process and a blind spot both explain. A process that reads idle throughout
       keeps its huge pages (demotion frees nothing anyway: MADV_NOHUGEPAGE splits no page).
   A hot reading of the range clears both counts. What this cannot tell apart: a skewed hot set
   larger than the TLB reach, whose hottest huge ranges stay cached (idle) while the lukewarm
   ones miss (hot, witnesses); such ranges are demoted after `demote_after_s`, re-marked and
   re-collapsed (cheap on a page that is still huge) when they next read hot.
   A demoted range that turns hot again is first re-marked MADV_HUGEPAGE (clearing
   VM_NOHUGEPAGE, which MADV_COLLAPSE refuses) and promoted on a later snapshot.
7. **Marks.** Under the system THP mode `madvise`, promoted ranges are also marked MADV_HUGEPAGE
   so that khugepaged keeps them huge and new faults there get huge pages.
8. **A process that turned THP off for itself** (prctl(PR_SET_THP_DISABLE), `thp_disabled`)
   gets no collapse and no re-mark: the kernel refuses MADV_COLLAPSE on every range of it
   (EINVAL). Its ready ranges are counted (`Decision.held_by_thp_disabled`), its streaks kept,
   so that it is managed as before the moment it allows THP again.

Failed collapses (see `record_outcomes`) are retried after an exponential back-off, so a range the
kernel keeps refusing (EAGAIN under memory pressure, EINVAL for an unsuitable mapping) does not
burn the rate budget every snapshot.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from damon_hp.ranges import (
    HUGE_PAGE_BYTES,
    AddrRange,
    coalesce,
    huge_starts,
    inside_any,
    intersect,
    merge_adjacent,
)

MIB = 1 << 20
BASE_PAGE_BYTES = 4096
PAGES_PER_HUGE_PAGE = HUGE_PAGE_BYTES // BASE_PAGE_BYTES  # 512


class RegionLike(Protocol):
    """What the policy reads of a DAMON region (damon.model.Region has these)."""

    start: int
    end: int
    nr_accesses: int
    age: int


class SnapshotLike(Protocol):
    """What the policy reads of a DAMON snapshot (damon.model.Snapshot has these)."""

    taken_at_s: float
    aggr_us: int
    regions: Sequence[RegionLike]

    @property
    def max_nr_accesses(self) -> int: ...


@dataclass(frozen=True)
class PolicyParams:
    """Thresholds of the decision rule, with the reasons for their defaults.

    hot_access_pct = 5.0
        DAMON's own example scheme for selective THP ("ethp") calls a region hot from 5 %
        access. Before a range is collapsed DAMON samples a 4 KiB PTE's accessed bit, so a large
        randomly read buffer -- the case huge pages help most -- shows only a few accesses per
        aggregation interval even when it is the hottest memory of the process; a higher
        threshold would miss exactly that case. After collapse the PMD's accessed bit is sampled
        and the same buffer reads near 100 %.
    min_hot_age_s = 0.0
        DAMON resets a region's age whenever its sampled frequency moves by more than about a
        tenth of the maximum, which a randomly read buffer does most intervals before collapse;
        requiring age there would delay promotion by seconds for nothing. Noise is filtered by
        `promote_after_snapshots` instead. Raise it to ignore short-lived bursts.
    mapping_share_pct = 90.0
        A hot region that spans several of the target's mappings is evidence only for a mapping
        holding at least this share of it (unmapped gaps count against it). DAMON's regions
        start coarse and are split over a few aggregations; a region half in a hot and half in
        an idle buffer reads hot and would otherwise collapse idle memory. At 90 % at most a
        tenth of a region can lend its accesses to the rest.
    promote_after_snapshots = 2
        A range must be hot in at least two snapshots of its streak: one noisy aggregation
        interval never triggers a collapse, which costs a 2 MiB copy per range.
    promote_after_s = 2.0
        ... and for at least this long, snapshot after snapshot. A sequential pass (initialising
        a buffer, a copy, a scan) touches each range once, but while DAMON's regions are still
        coarse the region holding the pass reads hot for as long as the pass takes to cross it:
        up to a second or two in the emulated test VM (seen: 84 MiB of a buffer written once,
        collapsed after two 0.4 s snapshots), milliseconds natively. Memory read at random
        stays hot. Two seconds are nothing against the lifetime of a promoted huge page.
    promote_grace = 1
        A streak survives one snapshot in which the range is not hot, but not two in a row.
        Before collapse a randomly read 256 MiB buffer shows only a few sampled accesses per
        snapshot in the test VM and now and then none at all; without the grace such a zero
        restarts the count, and a busy buffer can wait many seconds for an unbroken streak.
        A sequential pass that has moved on stays cold and ends its streak.
    demote_after_s = 30.0
        Seconds of *huge-witnessed* idleness (rule 6: idle while another huge range of the
        process read hot) before a promoted range is demoted. DAMON's ethp example demotes
        after 7 s idle; a promoted range has already paid for its collapse, so we wait longer
        before giving it up, so that phases a few seconds apart (a solver iteration, a
        checkpoint) do not flip ranges back and forth.
    demote_blind_after_s = 300.0
        Seconds of idleness witnessed only by memory on 4 KiB pages (or by both kinds) before a
        promoted range is demoted. The process is seen running, but its huge translations may
        all sit in the TLB, so this evidence is weak: ten times `demote_after_s`, about 18 times
        the longest blind stretch we have measured (17 s, test VM). A choice, not a measurement:
        no longer window is known to be safe, and a range wrongly demoted after it is re-marked
        and re-collapsed when it next reads hot.
    max_ptes_none = 256
        Base pages (of the 512 of a 2 MiB range) that may be absent for a range to be collapsed,
        as khugepaged's knob of the same name counts them; with 256, at least half the range
        must be resident. khugepaged's default, 511 (one resident page is enough), suits
        THP `always`, where a fault would have made the whole huge page anyway; MADV_COLLAPSE
        ignores the knob altogether. damon-hp's point is huge pages without THP-always's bloat,
        so it is stricter: a collapse at most doubles a range's resident memory (at most 1 MiB
        of zeroes per 2 MiB), while memory used at random -- resident in full after its first
        touch, the case huge pages pay for -- passes. A hot range that is mostly absent has its
        accesses on a few pages: a few TLB entries to gain against over 1 MiB of zeroes. 511
        turns the guard off (MADV_COLLAPSE's own rule); 0 asks for fully resident ranges.
        Absent means not in RAM (never touched, or swapped out: a collapse would swap it in).
    max_huge_bytes = None, max_huge_rss_pct = None
        No budget by default: the hot threshold is the selector. Set either (or both: the smaller
        wins) to cap the huge-page memory this agent creates.
    collapse_bytes_per_s = 256 MiB/s, collapse_burst_s = 1.0
        MADV_COLLAPSE copies each range and may compact or reclaim, charged to the agent. 512 MB
        collapsed in about 0.3 s on the development host, so 256 MiB/s keeps the agent's kernel
        time around a sixth of a core while still covering a 1 GiB hot set in about 4 s. The
        bucket holds at least one aggregation interval's worth, so slow snapshots (a foreign
        kdamond's 5 s) get the same rate.
    promote_evidence_pct = 0.0
        Off by default. The access frequencies of a streak's hot snapshots, each as % of the
        hottest not-yet-promoted range of its snapshot, must add up to at least this before the
        range is promoted. A physical (reverse-mapped) source reads a cold range hot when its
        frames share DAMON regions with busy frames of any process, a few % to 30 % per
        snapshot, flickering; a hot range climbs to the top as DAMON splits its regions.
        Physical sources set 100, one snapshot's worth of the hottest candidate
        (`agent.streak_for_source`). Replayed on a recorded passive run here
        (hotcold 1G/3G beside VM tests, tests/unit/test_policy_physical.py), cold ranges
        promoted / hot ones promoted 42 s into the run: streak alone 17 % / 70 %, 100: 7.0 % /
        53 %, 150: 2.7 % / 40 %. A cold range collapsed by mistake was resident (no bloat);
        a hot one left on 4 KiB pages loses the speedup, hence the middle.
    retry_after_s = 2.0, max_retry_after_s = 60.0
        A refused collapse (EAGAIN, ENOMEM, EINVAL) is retried after 2 s, doubling up to a minute.
    """

    hot_access_pct: float = 5.0
    min_hot_age_s: float = 0.0
    mapping_share_pct: float = 90.0
    promote_after_snapshots: int = 2
    promote_after_s: float = 2.0
    promote_grace: int = 1
    promote_evidence_pct: float = 0.0
    demote_after_s: float = 30.0
    demote_blind_after_s: float = 300.0
    max_ptes_none: int = 256
    max_huge_bytes: int | None = None
    max_huge_rss_pct: float | None = None
    collapse_bytes_per_s: int = 256 * MIB
    collapse_burst_s: float = 1.0
    retry_after_s: float = 2.0
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if not 50.0 < self.mapping_share_pct <= 100.0:
            raise ValueError(f"mapping_share_pct must be within 50..100, got "
                             f"{self.mapping_share_pct}")
        if not 0.0 <= self.hot_access_pct <= 100.0:
            raise ValueError(f"hot_access_pct must be within 0..100, got {self.hot_access_pct}")
        if min(self.min_hot_age_s, self.demote_after_s, self.promote_after_s,
               self.demote_blind_after_s) < 0:
            raise ValueError("min_hot_age_s, promote_after_s, demote_after_s and "
                             "demote_blind_after_s must not be negative")
        if not 0 <= self.max_ptes_none < PAGES_PER_HUGE_PAGE:
            raise ValueError(f"max_ptes_none must be within 0..{PAGES_PER_HUGE_PAGE - 1} (base "
                             f"pages of a 2 MiB range that may be absent), got "
                             f"{self.max_ptes_none}")
        if self.promote_evidence_pct < 0:
            raise ValueError("promote_evidence_pct must not be negative")
        if self.promote_after_snapshots < 1 or self.promote_grace < 0:
            raise ValueError("promote_after_snapshots must be at least 1, promote_grace >= 0")
        if self.max_huge_bytes is not None and self.max_huge_bytes < 0:
            raise ValueError("max_huge_bytes must not be negative")
        if self.max_huge_rss_pct is not None and not 0 <= self.max_huge_rss_pct <= 100:
            raise ValueError("max_huge_rss_pct must be within 0..100")
        if self.collapse_bytes_per_s <= 0 or self.collapse_burst_s <= 0:
            raise ValueError("collapse_bytes_per_s and collapse_burst_s must be positive")


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between snapshots. Treat as immutable: functions return a new one.

    Ranges are keyed by the start address of their 2 MiB-aligned range.
    """

    hot_streak: Mapping[int, int] = field(default_factory=dict)
    """consecutive snapshots each not-yet-promoted range has been hot"""
    hot_since: Mapping[int, float] = field(default_factory=dict)
    """time (s) of the first snapshot of each range's current hot streak"""
    hot_missed: Mapping[int, int] = field(default_factory=dict)
    """snapshots in a row each streaking range has not been hot (up to promote_grace)"""
    hot_evidence: Mapping[int, float] = field(default_factory=dict)
    """sum of each streaking range's access frequency (%) over its hot snapshots"""
    promoted: Mapping[int, float] = field(default_factory=dict)
    """promoted range -> last snapshot time (s) it was accessed at or above the hot threshold"""
    idle_witnessed_s: Mapping[int, float] = field(default_factory=dict)
    """promoted range -> seconds it read idle while other memory of the process read hot"""
    idle_huge_witnessed_s: Mapping[int, float] = field(default_factory=dict)
    """promoted range -> of those, seconds while another promoted range read hot"""
    demoted: frozenset[int] = frozenset()
    """ranges marked MADV_NOHUGEPAGE after going cold"""
    remarked: Mapping[int, float] = field(default_factory=dict)
    """formerly demoted ranges re-marked MADV_HUGEPAGE -> time of the re-mark"""
    retry_at: Mapping[int, float] = field(default_factory=dict)
    """range whose collapse failed -> earliest time to try again"""
    failures: Mapping[int, int] = field(default_factory=dict)
    """range -> consecutive failed collapses (for the back-off)"""
    credit_bytes: float | None = None
    """collapse rate-limit tokens; None until the first snapshot"""
    last_taken_at_s: float | None = None

    @property
    def promoted_bytes(self) -> int:
        return len(self.promoted) * HUGE_PAGE_BYTES


@dataclass(frozen=True)
class Decision:
    """What to do after one snapshot, and what the snapshot showed."""

    taken_at_s: float
    hot_bytes: int
    """bytes of the regions that were hot in this snapshot (not aligned)"""
    hot_regions: tuple[AddrRange, ...]
    hot_ranges: tuple[int, ...]
    """2 MiB ranges fully covered by hot spans, in address order"""
    promote: tuple[int, ...]
    """ranges to collapse now, best first"""
    demote: tuple[int, ...]
    """promoted ranges that went cold: add them to the MADV_NOHUGEPAGE marks"""
    hugepage_marks: tuple[AddrRange, ...]
    """the full set of ranges the MADV_HUGEPAGE scheme must cover after this decision"""
    nohugepage_marks: tuple[AddrRange, ...]
    """the full set of ranges the MADV_NOHUGEPAGE scheme must cover after this decision"""
    held_by_budget: int = 0
    """ready ranges not promoted because of the budget"""
    held_by_rate: int = 0
    """ready ranges not promoted because of the collapse rate limit"""
    held_by_residency: int = 0
    """ready ranges not promoted (or not re-marked) because too few of their pages are resident"""
    held_by_thp_disabled: int = 0
    """ready ranges not promoted because the process turned THP off for itself (rule 8)"""
    budget_bytes: int | None = None


def access_pct(nr_accesses: int, max_nr_accesses: int) -> float:
    """A region's access frequency as a percentage of the most a snapshot can show."""
    if max_nr_accesses <= 0:
        return 0.0
    return min(100.0, 100.0 * nr_accesses / max_nr_accesses)


@dataclass(frozen=True)
class _RangeHeat:
    """Per 2 MiB range: the byte-weighted access frequency and the largest overlapping one."""

    mean_pct: float
    max_pct: float


def _range_heat(snapshot: SnapshotLike, starts: Iterable[int]) -> dict[int, _RangeHeat]:
    """Access frequency over each 2 MiB range, from the regions overlapping it.

    Regions are sorted; a two-pointer walk keeps this linear in regions + ranges.
    """
    regions = sorted(snapshot.regions, key=lambda r: r.start)
    max_acc = snapshot.max_nr_accesses
    heat: dict[int, _RangeHeat] = {}
    i = 0
    for start in sorted(set(starts)):
        end = start + HUGE_PAGE_BYTES
        while i < len(regions) and regions[i].end <= start:
            i += 1
        weighted = 0.0
        peak = 0.0
        j = i
        while j < len(regions) and regions[j].start < end:
            r = regions[j]
            overlap = min(r.end, end) - max(r.start, start)
            if overlap > 0:
                pct = access_pct(r.nr_accesses, max_acc)
                weighted += pct * overlap
                peak = max(peak, pct)
            j += 1
        heat[start] = _RangeHeat(weighted / HUGE_PAGE_BYTES, peak)
    return heat


def hot_regions(snapshot: SnapshotLike, params: PolicyParams) -> list[AddrRange]:
    """Regions that pass both the access-frequency and the age threshold."""
    max_acc = snapshot.max_nr_accesses
    aggr_s = snapshot.aggr_us / 1e6
    return sorted(
        AddrRange(r.start, r.end)
        for r in snapshot.regions
        if access_pct(r.nr_accesses, max_acc) >= params.hot_access_pct
        and r.age * aggr_s >= params.min_hot_age_s
        and r.end > r.start
    )


def _dominant_part(
    region: AddrRange, mappings: Sequence[AddrRange], share_pct: float
) -> AddrRange | None:
    """The part of `region` inside the mapping holding at least `share_pct` of it, or None
    (`mappings` sorted and disjoint).

    DAMON samples one random page of a region, so a region spanning a hot and an idle mapping
    reads as a blend of the two: it is one DAMON has not yet split at the boundary, and its
    accesses cannot be pinned on either part. Seen in the test VM: regions of 65 to 184 MiB,
    40 to 60 % inside a hot buffer and the rest inside an idle one, read hot; attributing them
    to the idle part (or to the larger part) collapsed tens of MiB of idle memory.
    """
    best = None
    # `mappings` are sorted and disjoint (VMAs): start at the first that ends past the region
    # and stop at the first that starts after it, instead of trying every mapping per region.
    first = bisect_right(mappings, region.start, key=lambda m: m.end)
    for m in mappings[first:]:
        if m.start >= region.end:
            break
        start, end = max(region.start, m.start), min(region.end, m.end)
        if end > start and (best is None or end - start > best.size):
            best = AddrRange(start, end)
    if best is None or 100 * best.size < share_pct * region.size:
        return None
    return best


def _budget_bytes(params: PolicyParams, rss_bytes: int | None) -> int | None:
    limits = []
    if params.max_huge_bytes is not None:
        limits.append(params.max_huge_bytes)
    if params.max_huge_rss_pct is not None and rss_bytes is not None:
        limits.append(int(rss_bytes * params.max_huge_rss_pct / 100))
    return min(limits) if limits else None


@dataclass(frozen=True)
class _HotSet:
    """Rules 1 and 2 applied to one snapshot."""

    regions: list[AddrRange]
    """the hot regions"""
    ranges: list[int]
    """2 MiB ranges fully covered by hot spans (inside one mapping when mappings are known)"""
    span_of: dict[int, int]
    """range -> bytes of the hot span it belongs to"""


def _hot_set(
    snapshot: SnapshotLike, params: PolicyParams, mappings: Sequence[AddrRange] | None
) -> _HotSet:
    regions_hot = hot_regions(snapshot, params)
    if mappings is None:
        spans = merge_adjacent(regions_hot)
    else:
        maps = sorted(mappings)
        # A region that straddles mappings counts only for one holding nearly all of it (see
        # _dominant_part); mappings are not merged: a huge page cannot cross a VMA boundary.
        owned = (_dominant_part(r, maps, params.mapping_share_pct) for r in regions_hot)
        spans = intersect(merge_adjacent(p for p in owned if p is not None), maps)
        spans = [s for s in spans if s.size > 0]
    hot_set: list[int] = []
    span_of: dict[int, int] = {}
    for span in spans:
        for start in huge_starts(span):
            hot_set.append(start)
            span_of[start] = span.size
    hot_set.sort()
    return _HotSet(regions_hot, hot_set, span_of)


def _streak_long_enough(count: int, since: float, now: float, params: PolicyParams) -> bool:
    return count >= params.promote_after_snapshots and now - since >= params.promote_after_s


def collapse_candidates(
    snapshot: SnapshotLike,
    state: PolicyState,
    params: PolicyParams,
    *,
    mappings: Sequence[AddrRange] | None = None,
    thp_disabled: bool = False,
) -> tuple[int, ...]:
    """The ranges `decide` may collapse or re-mark after `snapshot`, in address order: hot in
    it, not promoted, with a streak long enough counting it. Same arguments as `decide`.

    The caller counts their resident pages for `decide(resident_pages=...)` (rule 4); every
    other range needs no page-table read.
    """
    if not snapshot.regions or thp_disabled:
        return ()
    now = snapshot.taken_at_s
    return tuple(
        start for start in _hot_set(snapshot, params, mappings).ranges
        if start not in state.promoted
        and _streak_long_enough(state.hot_streak.get(start, 0) + 1,
                                state.hot_since.get(start, now), now, params)
    )


def decide(
    snapshot: SnapshotLike,
    state: PolicyState,
    params: PolicyParams,
    *,
    rss_bytes: int | None = None,
    mappings: Sequence[AddrRange] | None = None,
    thp_mode: str = "never",
    resident_pages: Mapping[int, int] | None = None,
    thp_disabled: bool = False,
) -> tuple[Decision, PolicyState]:
    """Decide what to promote and demote after `snapshot`; return the decision and next state.

    rss_bytes: the target's resident set (for `max_huge_rss_pct`); None = unknown, that limit off.
    mappings: the target's mappings where a huge page is possible (private anonymous memory);
        None = unknown, every aligned range of a hot span is a candidate.
    thp_mode: the system's THP `enabled` mode (`always`, `madvise`, `never`).
    resident_pages: range start -> base pages of it resident now (0..512), for the ranges
        `collapse_candidates` names (rule 4); a candidate missing from it counts as having none.
        None = unknown, the residency guard off (replays of recordings that hold no page table).
    thp_disabled: the process turned THP off for itself (rule 8): nothing is collapsed.
    The promotions in the decision are plans: report their outcome with `record_outcomes`.
    """
    now = snapshot.taken_at_s
    if not snapshot.regions:
        # DAMON sometimes hands back an empty tried_regions (seen on 6.12 right after the
        # schemes were committed): that is no measurement, not a process gone cold.
        return _no_decision(now, state, thp_mode, rss_bytes, params), state
    hot = _hot_set(snapshot, params, mappings)
    regions_hot, hot_set, span_of = hot.regions, hot.ranges, hot.span_of
    hot_lookup = set(hot_set)
    heat = _range_heat(snapshot, list(hot_lookup) + list(state.promoted))

    # Forget ranges whose memory is gone: nothing to keep huge or mark there.
    promoted = dict(state.promoted)
    idle_witnessed = dict(state.idle_witnessed_s)
    idle_huge_witnessed = dict(state.idle_huge_witnessed_s)
    demoted = set(state.demoted)
    remarked = dict(state.remarked)
    if mappings is not None:
        for table in (promoted, remarked, idle_witnessed, idle_huge_witnessed):
            for start in [s for s in table if not inside_any(s, mappings)]:
                del table[start]
        demoted = {s for s in demoted if inside_any(s, mappings)}

    # Hysteresis up: count the hot snapshots of each range's streak and since when it runs. A
    # streak survives `promote_grace_snapshots` misses in a row (a zero draw of a randomly read
    # buffer), not more (a sequential pass that moved on).
    streak: dict[int, int] = {}
    since: dict[int, float] = {}
    missed: dict[int, int] = {}
    evidence: dict[int, float] = {}
    # Evidence is relative to the hottest candidate of this snapshot: how often DAMON catches a
    # hot range's accesses varies with the machine (in the emulated VM a randomly read buffer
    # reads a few %, natively near 100 %), and promoted ranges read hotter than any 4 KiB one.
    peak = max((heat[s].mean_pct for s in hot_set if s not in promoted), default=0.0)
    for start in hot_set:
        if start not in promoted:
            streak[start] = state.hot_streak.get(start, 0) + 1
            since[start] = state.hot_since.get(start, now)
            evidence[start] = (state.hot_evidence.get(start, 0.0)
                               + (100.0 * heat[start].mean_pct / peak if peak else 0.0))
    for start, count in state.hot_streak.items():
        gap = state.hot_missed.get(start, 0) + 1
        if start not in hot_lookup and start not in promoted and gap <= params.promote_grace:
            streak[start], since[start], missed[start] = count, state.hot_since[start], gap
            evidence[start] = state.hot_evidence.get(start, 0.0)

    def hot_long_enough(start: int) -> bool:
        return (start in hot_lookup
                and _streak_long_enough(streak[start], since[start], now, params)
                and evidence[start] >= params.promote_evidence_pct)

    # Hysteresis down, on evidence (rule 6): idle time counts only while DAMON saw accesses
    # elsewhere in the process -- on another huge range (huge-witnessed), or anywhere.
    def reads_hot(start: int) -> bool:
        h = heat.get(start)
        return h is not None and h.max_pct >= params.hot_access_pct

    huge_witness = any(reads_hot(s) for s in promoted)
    # An idle range overlaps no hot region (its heat is the max over the regions overlapping
    # it), so any hot region is a witness from elsewhere in the process.
    any_witness = bool(regions_hot)
    demote: list[int] = []
    for start, last_hot in list(promoted.items()):
        if reads_hot(start):
            promoted[start] = now
            idle_witnessed.pop(start, None)
            idle_huge_witnessed.pop(start, None)
            continue
        if not any_witness:
            continue  # DAMON saw nothing of the process: no evidence either way
        # This snapshot stands for the time since the previous one (or since the collapse).
        previous = state.last_taken_at_s if state.last_taken_at_s is not None else now
        seen_s = max(0.0, now - max(previous, last_hot))
        idle_witnessed[start] = idle_witnessed.get(start, 0.0) + seen_s
        if huge_witness:
            idle_huge_witnessed[start] = idle_huge_witnessed.get(start, 0.0) + seen_s
        if (idle_huge_witnessed.get(start, 0.0) >= params.demote_after_s
                or idle_witnessed[start] >= params.demote_blind_after_s):
            del promoted[start]
            idle_witnessed.pop(start, None)
            idle_huge_witnessed.pop(start, None)
            demoted.add(start)
            demote.append(start)

    # Residency guard (rule 4): at most max_ptes_none of the range's base pages absent.
    def dense_enough(start: int) -> bool:
        if resident_pages is None:
            return True
        return resident_pages.get(start, 0) >= PAGES_PER_HUGE_PAGE - params.max_ptes_none

    held_by_residency = 0
    # A demoted range that is hot again must lose VM_NOHUGEPAGE before it can be collapsed
    # (and, under THP `madvise`, a MADV_HUGEPAGE mark lets khugepaged fill a sparse range too).
    for start in streak:
        if start in demoted and hot_long_enough(start) and not thp_disabled:
            if not dense_enough(start):
                held_by_residency += 1
                continue
            demoted.discard(start)
            remarked[start] = now

    ready = [
        start
        for start in streak
        if hot_long_enough(start)
        and start not in demoted
        and not (start in remarked and remarked[start] >= now)
        and state.retry_at.get(start, float("-inf")) <= now
    ]
    ready.sort(key=lambda s: (-heat[s].mean_pct * span_of[s], s))

    # Limits: budget on huge bytes held, token bucket on bytes collapsed per second.
    budget = _budget_bytes(params, rss_bytes)
    # The bucket holds at least one snapshot interval's worth: with a foreign kdamond's 5 s
    # aggregations a 1 s bucket let 256 MiB through per snapshot, a fifth of the set rate.
    interval = snapshot.aggr_us / 1e6
    burst = params.collapse_bytes_per_s * max(params.collapse_burst_s, interval)
    if state.credit_bytes is None or state.last_taken_at_s is None:
        credit = burst
    else:
        elapsed = max(0.0, now - state.last_taken_at_s)
        credit = min(burst, state.credit_bytes + elapsed * params.collapse_bytes_per_s)
    held_bytes = len(promoted) * HUGE_PAGE_BYTES
    promote: list[int] = []
    held_by_budget = held_by_rate = held_by_thp_disabled = 0
    for start in ready:
        if thp_disabled:
            held_by_thp_disabled += 1
        elif not dense_enough(start):
            held_by_residency += 1
        elif budget is not None and held_bytes + HUGE_PAGE_BYTES > budget:
            held_by_budget += 1
        elif credit < HUGE_PAGE_BYTES:
            held_by_rate += 1
        else:
            promote.append(start)
            held_bytes += HUGE_PAGE_BYTES
            credit -= HUGE_PAGE_BYTES

    next_state = replace(
        state,
        hot_streak=streak,
        hot_since=since,
        hot_missed=missed,
        hot_evidence=evidence,
        promoted=promoted,
        idle_witnessed_s=idle_witnessed,
        idle_huge_witnessed_s=idle_huge_witnessed,
        demoted=frozenset(demoted),
        remarked=remarked,
        # A refusal is remembered while the range stays hot, and for max_retry_after_s past
        # its retry time when it does not: forgetting at once let a range that flickers in and
        # out of the hot set (as physical sources' cold ranges do) be retried at every return,
        # every 2 s, however often the kernel had refused it.
        retry_at={s: t for s, t in state.retry_at.items()
                  if s in hot_lookup or now < t + params.max_retry_after_s},
        failures={s: n for s, n in state.failures.items()
                  if s in hot_lookup
                  or now < state.retry_at.get(s, now) + params.max_retry_after_s},
        credit_bytes=credit,
        last_taken_at_s=now,
    )
    decision = Decision(
        taken_at_s=now,
        hot_bytes=sum(s.size for s in regions_hot),
        hot_regions=tuple(regions_hot),
        hot_ranges=tuple(hot_set),
        promote=tuple(promote),
        demote=tuple(sorted(demote)),
        hugepage_marks=coalesce(_marks(next_state, thp_mode, promote)),
        nohugepage_marks=coalesce(demoted),
        held_by_budget=held_by_budget,
        held_by_rate=held_by_rate,
        held_by_residency=held_by_residency,
        held_by_thp_disabled=held_by_thp_disabled,
        budget_bytes=budget,
    )
    return decision, next_state


def _marks(state: PolicyState, thp_mode: str, planned: Iterable[int] = ()) -> set[int]:
    marks = set(state.remarked)
    if thp_mode == "madvise":
        marks |= set(state.promoted) | set(planned)
    return marks


def _no_decision(
    now: float, state: PolicyState, thp_mode: str, rss_bytes: int | None, params: PolicyParams
) -> Decision:
    return Decision(
        taken_at_s=now,
        hot_bytes=0,
        hot_regions=(),
        hot_ranges=(),
        promote=(),
        demote=(),
        hugepage_marks=coalesce(_marks(state, thp_mode)),
        nohugepage_marks=coalesce(state.demoted),
        budget_bytes=_budget_bytes(params, rss_bytes),
    )


def record_outcomes(
    state: PolicyState,
    outcomes: Mapping[int, str | None],
    params: PolicyParams,
    now_s: float,
) -> PolicyState:
    """Fold collapse results into the state: range start -> None (collapsed) or an errno name.

    A collapsed range becomes promoted (and stops being re-marked); a refused one is retried after
    `retry_after_s`, doubling with each consecutive refusal up to `max_retry_after_s`.
    """
    promoted = dict(state.promoted)
    remarked = dict(state.remarked)
    retry_at = dict(state.retry_at)
    failures = dict(state.failures)
    streak = dict(state.hot_streak)
    since = dict(state.hot_since)
    missed = dict(state.hot_missed)
    evidence = dict(state.hot_evidence)
    for start, error in outcomes.items():
        if error is None:
            promoted[start] = now_s
            streak.pop(start, None)
            since.pop(start, None)
            missed.pop(start, None)
            evidence.pop(start, None)
            retry_at.pop(start, None)
            failures.pop(start, None)
            # Under `madvise` the mark stays through hugepage_marks; otherwise it has done its job.
            remarked.pop(start, None)
        else:
            n = failures.get(start, 0) + 1
            failures[start] = n
            delay = min(params.max_retry_after_s, params.retry_after_s * 2 ** (n - 1))
            retry_at[start] = now_s + delay
    return replace(
        state,
        promoted=promoted,
        remarked=remarked,
        retry_at=retry_at,
        failures=failures,
        hot_streak=streak,
        hot_evidence=evidence,
        hot_since=since,
        hot_missed=missed,
    )
