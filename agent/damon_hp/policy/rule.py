"""The decision rule's steps, each a function of its inputs; `decide` runs them in order.

    hot_set           rules 1-2: hot regions -> hot 2 MiB ranges (hotset.py)
    advance_streaks   rule 3: absolute evidence per range, first touch withheld, age seeded
    judge_idle        rule 6: demotion on witnessed idleness (sources that can demote)
    ready_ranges      rules 3-4, 8: ranges whose evidence suffices, re-marks of demoted ones
    admit             rules 4-5: residency guard, ranking by benefit per byte, budget, rate
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from damon_hp.damon.model import PHYSICAL
from damon_hp.ranges import HUGE_PAGE_BYTES, PAGES_PER_HUGE, AddrRange, coalesce, starts_inside

from .hotset import HotSet, RangeHeat, SnapshotLike, hot_set, range_heat
from .params import MIB, PolicyParams
from .state import EMPTY, UNMAPPED, Decision, Huge, PolicyState, RangeState, Streak

_EPS = 1e-9


def reading_accesses(heat: RangeHeat, max_nr_accesses: int) -> float:
    """The sampled accesses one snapshot's reading of a range stands for."""
    return heat.mean_pct / 100.0 * max_nr_accesses


def forget_unmapped(ranges: dict[int, RangeState], mappings: Sequence[AddrRange] | None) -> None:
    """Drop the records of ranges whose memory is gone: nothing to keep huge or mark there."""
    if mappings is None:
        return
    kept = starts_inside(ranges, mappings)
    for start in [s for s in ranges if s not in kept]:
        del ranges[start]


def withheld_ranges(snapshot: SnapshotLike) -> frozenset[int]:
    """The ranges whose reading carries no evidence: those being faulted in (`unsteady`), and
    every range of a region that overlaps one of them. A region reads as one: a region holding
    a range being written reads hot for all its ranges, steady or not (seen in the test VM:
    vaddr regions of tens of MiB over a buffer being written, its finished ranges read hot
    beside the one being written)."""
    if not snapshot.unsteady:
        return frozenset()
    out = set(snapshot.unsteady)
    for r in snapshot.regions:
        windows = range(r.start - r.start % HUGE_PAGE_BYTES, r.end, HUGE_PAGE_BYTES)
        if any(w in snapshot.unsteady for w in windows):
            out.update(windows)
    return frozenset(out)


def advance_streaks(ranges: dict[int, RangeState], hot: HotSet, heat: Mapping[int, RangeHeat],
                    snapshot: SnapshotLike, params: PolicyParams,
                    withheld: frozenset[int]) -> None:
    """Rule 3: add this snapshot's reading to each not-yet-promoted range's streak.

    A hot reading adds DAMON's sampled accesses of the range and the samples it took; a range
    whose resident pages grew during the aggregation (`withheld`: `withheld_ranges`) adds
    nothing and loses nothing: a page being faulted in reads as accessed (the fault sets the
    accessed bit), so a buffer written once would otherwise read hot once, at its first touch. A
    non-hot reading adds samples only; more than `promote_grace` in a row end the streak.
    A new streak is seeded with DAMON's region age where the source's regions are the target's
    own (`seed_streak_from_age`): the region has held its level that many aggregations.
    """
    now, max_acc = snapshot.taken_at_s, snapshot.max_nr_accesses
    aggr_s = snapshot.aggr_us / 1e6
    hot_lookup = set(hot.ranges)
    for start in hot_lookup | {s for s, r in ranges.items() if r.streak is not None}:
        rec = ranges.get(start, EMPTY)
        if rec.huge is not None or start in withheld:
            continue
        s = rec.streak
        if start in hot_lookup:
            got = reading_accesses(heat[start], max_acc)
            if s is None:
                # A demoted range earns its way back on readings of its own (ready_ranges).
                seed = (min(heat[start].min_age, params.max_age_seed)
                        if params.seed_streak_from_age and not rec.demoted else 0)
                s = Streak(since_s=now - seed * aggr_s, hot_readings=seed,
                           readings=((got, max_acc),) * seed)
            s = s.then(got, max_acc, hot=True)
        elif s is not None:
            s = None if s.missed + 1 > params.promote_grace else s.then(0.0, max_acc, hot=False)
        ranges[start] = rec.with_streak(s)


def evidence_suffices(s: Streak | None, now: float, params: PolicyParams) -> bool:
    return (s is not None
            and s.hot_readings >= params.promote_after_snapshots
            and now - s.since_s >= params.promote_after_s - _EPS
            and s.evidence(params.promote_min_accesses, params.promote_rate_pct))


def judge_idle(ranges: dict[int, RangeState], heat: Mapping[int, RangeHeat], any_hot: bool,
               previous_s: float | None, now: float, params: PolicyParams) -> list[int]:
    """Rule 6: refresh promoted ranges that read hot; demote those shown idle long enough while
    DAMON demonstrably saw the process's accesses. Returns the ranges demoted now.

    "No access seen" alone is no evidence against a huge page: DAMON clears accessed bits
    without a TLB flush, and the CPU sets a page-table accessed bit only when it walks the page
    table, so a hot set whose translations stay cached reads idle however busy it is. Idle time
    counts as huge-witnessed when another promoted range read hot in the same snapshot, as
    base-witnessed when only memory on 4 KiB pages did, and not at all when nothing did.
    Sources that cannot demote (`can_demote` False) keep no such bookkeeping.
    """
    if not params.can_demote:
        # Nothing to refresh: the last hot reading only dates the idle time demotion counts.
        return []

    def reads_hot(start: int) -> bool:
        h = heat.get(start)
        return h is not None and h.max_pct >= params.hot_access_pct

    promoted = [s for s, r in ranges.items() if r.huge is not None]
    huge_witness = any(reads_hot(s) for s in promoted)
    demote: list[int] = []
    for start in promoted:
        rec = ranges[start]
        assert rec.huge is not None
        if reads_hot(start):
            ranges[start] = rec.with_huge(Huge(now))
            continue
        if not params.can_demote or not any_hot:
            continue
        since = max(previous_s if previous_s is not None else now, rec.huge.last_hot_s)
        seen_s = max(0.0, now - since)
        h = replace(rec.huge, idle_witnessed_s=rec.huge.idle_witnessed_s + seen_s,
                    idle_huge_witnessed_s=rec.huge.idle_huge_witnessed_s
                    + (seen_s if huge_witness else 0.0))
        if (h.idle_huge_witnessed_s >= params.demote_after_s
                or h.idle_witnessed_s >= params.demote_blind_after_s):
            ranges[start] = replace(rec, huge=None, demoted=True)
            demote.append(start)
        else:
            ranges[start] = rec.with_huge(h)
    return sorted(demote)


def _dense_enough(start: int, resident_pages: Mapping[int, int] | None,
                  params: PolicyParams) -> bool:
    """Rule 4: at most max_ptes_none of the range's base pages absent (None: unknown, off)."""
    if resident_pages is None:
        return True
    return resident_pages.get(start, 0) >= PAGES_PER_HUGE - params.max_ptes_none


def ready_ranges(ranges: dict[int, RangeState], hot: HotSet, snapshot: SnapshotLike,
                 params: PolicyParams, resident_pages: Mapping[int, int] | None,
                 thp_disabled: bool, withheld: frozenset[int]) -> tuple[list[int], int]:
    """Ranges whose evidence suffices and that may be collapsed now, in address order, and how
    many demoted ones the residency guard kept from being re-marked. A demoted range that is
    ready again, after `remark_after_snapshots` hot readings, is first re-marked MADV_HUGEPAGE
    (clearing VM_NOHUGEPAGE, which MADV_COLLAPSE refuses) and collapsed on a later snapshot."""
    now = snapshot.taken_at_s
    ready: list[int] = []
    held = 0
    for start in hot.ranges:
        rec = ranges.get(start, EMPTY)
        if (rec.huge is not None or start in withheld
                or not evidence_suffices(rec.streak, now, params)):
            continue
        if rec.demoted:
            if (thp_disabled or rec.streak is None
                    or rec.streak.hot_readings < params.remark_after_snapshots):
                continue
            if not _dense_enough(start, resident_pages, params):
                held += 1
                continue
            ranges[start] = replace(rec, demoted=False, remarked_at=now)
            continue
        if rec.remarked_at is not None and rec.remarked_at >= now:
            continue
        if rec.retry_at is not None and rec.retry_at > now:
            continue
        ready.append(start)
    return ready, held


def ranking_score(heat: RangeHeat, span_bytes: int, resident: int | None) -> float:
    """Expected TLB benefit per byte the collapse occupies: access frequency times the hot
    span (MiB) it belongs to, over the 2 MiB plus the absent pages the collapse would add (a
    fully resident range adds nothing, a half-resident one 1 MiB)."""
    added = 0 if resident is None else (PAGES_PER_HUGE - resident) * (HUGE_PAGE_BYTES
                                                                       // PAGES_PER_HUGE)
    return heat.mean_pct * (span_bytes / MIB) * HUGE_PAGE_BYTES / (HUGE_PAGE_BYTES + added)


def budget_bytes(params: PolicyParams, rss_bytes: int | None) -> int | None:
    limits = []
    if params.max_huge_bytes is not None:
        limits.append(params.max_huge_bytes)
    if params.max_huge_rss_pct is not None and rss_bytes is not None:
        limits.append(int(rss_bytes * params.max_huge_rss_pct / 100))
    return min(limits) if limits else None


@dataclass(frozen=True)
class Admission:
    promote: list[int]
    credit: float
    held_by_budget: int = 0
    held_by_rate: int = 0
    held_by_residency: int = 0
    held_by_thp_disabled: int = 0


def admit(ranked: Iterable[int], held_bytes: int, credit: float, budget: int | None,
          params: PolicyParams, resident_pages: Mapping[int, int] | None,
          thp_disabled: bool) -> Admission:
    """Rules 4, 5 and 8 in ranking order: residency guard, budget on huge bytes held, token
    bucket on bytes collapsed per second; nothing for a process that turned THP off."""
    promote: list[int] = []
    counts = {"budget": 0, "rate": 0, "residency": 0, "thp": 0}
    for start in ranked:
        if thp_disabled:
            counts["thp"] += 1
        elif not _dense_enough(start, resident_pages, params):
            counts["residency"] += 1
        elif budget is not None and held_bytes + HUGE_PAGE_BYTES > budget:
            counts["budget"] += 1
        elif credit < HUGE_PAGE_BYTES:
            counts["rate"] += 1
        else:
            promote.append(start)
            held_bytes += HUGE_PAGE_BYTES
            credit -= HUGE_PAGE_BYTES
    return Admission(promote, credit, counts["budget"], counts["rate"], counts["residency"],
                     counts["thp"])


def refill_credit(state: PolicyState, snapshot: SnapshotLike, params: PolicyParams) -> float:
    # The bucket holds at least one snapshot interval's worth: with a foreign kdamond's 5 s
    # aggregations a 1 s bucket let 256 MiB through per snapshot, a fifth of the set rate.
    burst = params.collapse_bytes_per_s * max(params.collapse_burst_s, snapshot.aggr_us / 1e6)
    if state.credit_bytes is None or state.last_taken_at_s is None:
        return burst
    elapsed = max(0.0, snapshot.taken_at_s - state.last_taken_at_s)
    return min(burst, state.credit_bytes + elapsed * params.collapse_bytes_per_s)


def _prune_retries(ranges: dict[int, RangeState], hot_lookup: set[int], now: float,
                   params: PolicyParams) -> None:
    # A refusal is remembered while the range stays hot, and for max_retry_after_s past its
    # retry time when it does not: forgetting at once let a range that flickers in and out of
    # the hot set be retried at every return, however often the kernel had refused it.
    for start, rec in list(ranges.items()):
        if (rec.retry_at is not None and start not in hot_lookup
                and now >= rec.retry_at + params.max_retry_after_s):
            ranges[start] = replace(rec, retry_at=None, failures=0)


def _compact(ranges: dict[int, RangeState]) -> dict[int, RangeState]:
    return {s: r for s, r in ranges.items() if not r.empty}


def decide(snapshot: SnapshotLike, state: PolicyState, params: PolicyParams, *,
           rss_bytes: int | None = None, mappings: Sequence[AddrRange] | None = None,
           thp_mode: str = "never", resident_pages: Mapping[int, int] | None = None,
           thp_disabled: bool = False) -> tuple[Decision, PolicyState]:
    """Decide what to promote and demote after `snapshot`; return the decision and next state.

    rss_bytes: the target's resident set (for `max_huge_rss_pct`); None = unknown, that limit off.
    mappings: the target's mappings where a huge page is possible (private anonymous memory);
        None = unknown, every aligned range of a hot span is a candidate.
    thp_mode: the system's THP `enabled` mode (`always`, `madvise`, `never`).
    resident_pages: range start -> base pages of it resident now (0..512), for every range
        it may collapse or re-mark (rules 4 and 5; the pipeline's observation counts all of
        them); a range missing from it counts as having none. None = unknown: the residency
        guard off, every range counted resident (replays of recordings that hold no page
        table).
    thp_disabled: the process turned THP off for itself (rule 8): nothing is collapsed.
    The promotions in the decision are plans: report their outcome with `record_outcomes`.
    """
    if snapshot.space == PHYSICAL:
        # Physical addresses are no process's ranges: revmap.reverse_map turns them into one
        # process's windows first (pipeline.py).
        raise ValueError("decide reads a process's virtual regions or windows, not a physical "
                         "snapshot")
    now = snapshot.taken_at_s
    if not snapshot.regions:
        # DAMON sometimes hands back an empty tried_regions (seen on 6.12 right after the
        # schemes were committed): that is no measurement, not a process gone cold.
        return _no_decision(now, state, thp_mode, rss_bytes, params), state
    hot = hot_set(snapshot, params, mappings)
    hot_lookup = set(hot.ranges)
    ranges = dict(state.ranges)
    forget_unmapped(ranges, mappings)
    huge = {s for s, r in ranges.items() if r.huge}
    # A promoted range's heat serves only demotion (judge_idle); the others' their streak and
    # their rank.
    heat = range_heat(snapshot, (hot_lookup - huge) | (huge if params.can_demote else set()))
    withheld = withheld_ranges(snapshot)
    advance_streaks(ranges, hot, heat, snapshot, params, withheld)
    # An idle range overlaps no hot region, so any hot region is a witness from elsewhere.
    demote = judge_idle(ranges, heat, bool(hot.regions), state.last_taken_at_s, now, params)
    ready, held_remark = ready_ranges(ranges, hot, snapshot, params, resident_pages,
                                      thp_disabled, withheld)
    score = {s: ranking_score(heat[s], hot.span_of[s],
                              None if resident_pages is None else resident_pages.get(s, 0))
             for s in ready}
    ready.sort(key=lambda s: (-score[s], s))
    budget = budget_bytes(params, rss_bytes)
    held_bytes = sum(r.huge is not None for r in ranges.values()) * HUGE_PAGE_BYTES
    adm = admit(ready, held_bytes, refill_credit(state, snapshot, params), budget, params,
                resident_pages, thp_disabled)
    _prune_retries(ranges, hot_lookup, now, params)
    next_state = PolicyState(_compact(ranges), adm.credit, now)
    decision = Decision(
        taken_at_s=now,
        hot_bytes=sum(r.size for r in hot.regions),
        hot_regions=tuple(hot.regions),
        hot_ranges=tuple(hot.ranges),
        promote=tuple(adm.promote),
        demote=tuple(demote),
        hugepage_marks=coalesce(_marks(next_state, thp_mode, adm.promote)),
        nohugepage_marks=coalesce(next_state.demoted),
        held_by_budget=adm.held_by_budget,
        held_by_rate=adm.held_by_rate,
        held_by_residency=adm.held_by_residency + held_remark,
        held_by_thp_disabled=adm.held_by_thp_disabled,
        unsteady=len(hot_lookup & withheld),
        budget_bytes=budget,
        benefit={s: score[s] for s in adm.promote},
    )
    return decision, next_state


def _marks(state: PolicyState, thp_mode: str, planned: Iterable[int] = ()) -> set[int]:
    """Rule 7: re-marked ranges always; under THP `madvise` promoted ones too, so khugepaged
    keeps them huge and new faults there get huge pages."""
    marks = set(state.remarked)
    if thp_mode == "madvise":
        marks |= set(state.promoted_last_hot) | set(planned)
    return marks


def _no_decision(now: float, state: PolicyState, thp_mode: str, rss_bytes: int | None,
                 params: PolicyParams) -> Decision:
    return Decision(taken_at_s=now, hot_bytes=0, hot_regions=(), hot_ranges=(), promote=(),
                    demote=(), hugepage_marks=coalesce(_marks(state, thp_mode)),
                    nohugepage_marks=coalesce(state.demoted),
                    budget_bytes=budget_bytes(params, rss_bytes))


def record_outcomes(state: PolicyState, outcomes: Mapping[int, str | None],
                    params: PolicyParams, now_s: float) -> PolicyState:
    """Fold collapse results into the state: range start -> None (collapsed) or an errno name.

    A collapsed range becomes promoted (and stops being re-marked); a refused one is retried
    after `retry_after_s`, doubling with each consecutive refusal up to `max_retry_after_s`.
    An UNMAPPED range is forgotten: what the target maps there later starts afresh.
    """
    ranges = dict(state.ranges)
    for start, error in outcomes.items():
        rec = ranges.get(start, EMPTY)
        if error == UNMAPPED:
            ranges.pop(start, None)
        elif error is None:
            # Under `madvise` the mark stays through hugepage_marks; otherwise it has done its job.
            ranges[start] = RangeState(huge=Huge(now_s))
        else:
            n = rec.failures + 1
            delay = min(params.max_retry_after_s, params.retry_after_s * 2 ** (n - 1))
            ranges[start] = replace(rec, failures=n, retry_at=now_s + delay)
    return replace(state, ranges=ranges)
