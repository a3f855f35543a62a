"""Demotion on evidence (policy rule 6): a huge range is not demoted on "no access seen" alone.

DAMON clears accessed bits without flushing the TLB, so a hot set on huge pages whose
translations stay cached reads idle while it is busy: 0 % for 17 s in the test VM. No recording
of that exists here, so the sequences are constructed, in two parts:

1. the real recording `damon-hotcold-256m-1g.json` (hotcold 256M/1G in the 6.12 test VM,
   DAMON vaddr) replayed through the policy with default thresholds: the hot buffer is promoted
   as the agent would promote it (every collapse succeeds);
2. a continuation: the recording's last snapshot repeated at the recording's median snapshot
   gap, DAMON's real region layout kept, each region's nr_accesses set by the scenario. The
   "blind" hot set reads 0 in every region overlapping it -- what the VM showed while hotcold
   kept reading its buffer at full speed -- for far longer than demote_after_s, so the old rule
   (idle for demote_after_s of wall time) would demote all of it. "Busy" memory reads half the
   samples.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from damon_hp.damon.model import Recording, Region, Snapshot
from damon_hp.policy import Decision, PolicyParams, PolicyState, decide, record_outcomes
from damon_hp.ranges import HUGE_PAGE_BYTES as H
from damon_hp.ranges import AddrRange, align_down

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "damon-hotcold-256m-1g.json"
P = PolicyParams()


@dataclass
class Run:
    decisions: list[Decision]
    state: PolicyState
    promoted_at_end_of_recording: frozenset[int]
    last_recorded_s: float

    def demoted_at(self) -> dict[int, float]:
        return {s: d.taken_at_s for d in self.decisions for s in d.demote}


def recording() -> tuple[Recording, AddrRange, AddrRange]:
    rec = Recording.load(FIXTURE)
    return rec, rec.ground_truth["hot"], rec.ground_truth["cold"]


def continuation(rec: Recording, seconds: float, reads: dict[AddrRange, int],
                 extra: tuple[Region, ...] = ()) -> list[Snapshot]:
    """The last recorded snapshot repeated for `seconds`. A region overlapping a key of `reads`
    is cut at the key's bounds and reads that nr_accesses inside it and 0 outside (its recorded
    accesses were the key memory's); other regions read as recorded."""
    snaps = [s for s in rec.snapshots if s.regions]
    gap = statistics.median(b.taken_at_s - a.taken_at_s
                            for a, b in zip(snaps, snaps[1:], strict=False))
    last = snaps[-1]
    regions: list[Region] = []
    for r in last.regions:
        cuts = sorted({r.start, r.end} | {x for k in reads for x in (k.start, k.end)
                                          if r.start < x < r.end})
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            overlapped = any(k.overlap(AddrRange(r.start, r.end)) for k in reads)
            n = next((v for k, v in reads.items() if k.start <= lo and hi <= k.end),
                     0 if overlapped else r.nr_accesses)
            regions.append(Region(lo, hi, n, r.age))
    regions += extra
    out = []
    for i in range(1, int(seconds / gap) + 1):
        out.append(replace(last, taken_at_s=last.taken_at_s + i * gap, regions=tuple(regions)))
    return out


def run(rec: Recording, maps: list[AddrRange], extra_snaps: list[Snapshot],
        params: PolicyParams = P) -> Run:
    state = PolicyState()
    decisions = []
    promoted_then: frozenset[int] = frozenset()
    for i, snap in enumerate((*rec.snapshots, *extra_snaps)):
        d, state = decide(snap, state, params, mappings=maps)
        state = record_outcomes(state, {s: None for s in d.promote}, params, snap.taken_at_s)
        decisions.append(d)
        if i == len(rec.snapshots) - 1:
            promoted_then = frozenset(state.promoted_last_hot)
    return Run(decisions, state, promoted_then, rec.snapshots[-1].taken_at_s)


def hot_ranges(hot: AddrRange) -> set[int]:
    return {s for s in range(hot.start, hot.end, H) if s % H == 0 and s + H <= hot.end}


def test_the_recording_promotes_the_hot_buffer_before_the_continuation() -> None:
    rec, hot, cold = recording()
    r = run(rec, [hot, cold], [])
    assert len(r.promoted_at_end_of_recording & hot_ranges(hot)) >= 0.9 * len(hot_ranges(hot))


def test_a_busy_huge_hot_set_that_reads_idle_is_not_demoted() -> None:
    """The VM's blind spot: the whole promoted hot set reads 0 %, the cold buffer stays idle as
    recorded; nothing of the process reads hot, so nothing is evidence of idleness."""
    rec, hot, cold = recording()
    blind = continuation(rec, 4 * P.demote_after_s, {hot: 0})
    assert not any(decide(s, PolicyState(), P)[0].hot_regions for s in blind), "none hot"
    r = run(rec, [hot, cold], blind)
    promoted = r.promoted_at_end_of_recording
    assert promoted
    # The old rule would have demoted every one of them: idle far longer than demote_after_s.
    assert all(blind[-1].taken_at_s - r.state.promoted_last_hot[s] >= 3 * P.demote_after_s
               for s in promoted)
    assert r.demoted_at() == {}
    assert promoted <= set(r.state.promoted_last_hot)


def test_idleness_witnessed_only_by_4k_memory_demotes_after_the_blind_window() -> None:
    """As above, while some memory of the process on 4 KiB pages reads hot (a region outside
    the collapsible mappings: program text, a file mapping): that shows the process runs and
    DAMON samples it, not that its huge translations leave the TLB. The hot set is kept for
    demote_blind_after_s of such idleness, then demoted."""
    rec, hot, cold = recording()
    text = Region(hot.end + 64 * H, hot.end + 65 * H, 10, 5)  # busy, not collapsible
    blind = continuation(rec, P.demote_blind_after_s + 10, {hot: 0}, extra=(text,))
    r = run(rec, [hot, cold], blind)
    promoted = r.promoted_at_end_of_recording
    demoted = r.demoted_at()
    assert set(demoted) == promoted  # all of them, in the end
    for start, t in demoted.items():
        last_hot = max(d.taken_at_s for d in r.decisions
                       if start in d.hot_ranges and d.taken_at_s < t)
        assert t - last_hot >= P.demote_blind_after_s
        assert t - last_hot < P.demote_blind_after_s + 10  # and not much later


def test_half_the_hot_set_going_cold_while_the_other_half_reads_hot_is_demoted() -> None:
    """The work moved: the lower half of the hot buffer reads 0 while the upper half, on huge
    pages, reads hot in the same snapshots. DAMON demonstrably sees this process's huge pages,
    so the silence of the lower half counts: demoted after demote_after_s, the upper half kept."""
    rec, hot, cold = recording()
    mid = align_down(hot.start + hot.size // 2)
    lower, upper = AddrRange(hot.start, mid), AddrRange(mid, hot.end)
    moved = continuation(rec, 2 * P.demote_after_s, {lower: 0, upper: 10})
    r = run(rec, [hot, cold], moved)
    promoted = r.promoted_at_end_of_recording
    demoted = r.demoted_at()
    assert set(demoted) == {s for s in promoted if s < mid}
    assert {s for s in promoted if s >= mid} <= set(r.state.promoted_last_hot)
    for start, t in demoted.items():
        last_hot = max(d.taken_at_s for d in r.decisions
                       if start in d.hot_ranges and d.taken_at_s < t)
        # Witnessed from the first continuation snapshot on: demote_after_s after its last hot
        # reading, give or take one snapshot interval (the first counts from the collapse).
        assert P.demote_after_s <= t - last_hot <= P.demote_after_s + 2 * (moved[1].taken_at_s
                                                                           - moved[0].taken_at_s)


# -- the rule on hand-made snapshots ------------------------------------------------------------

BASE = 0x7F0000000000


def snap(t: float, *regions: tuple[int, int, int]) -> Snapshot:
    """Regions as (first range, end range, nr_accesses) in 2 MiB units from BASE; 20 samples."""
    return Snapshot(taken_at_s=t, pid=1, sample_us=5_000, aggr_us=100_000,
                    regions=tuple(Region(BASE + a * H, BASE + b * H, n, 10)
                                  for a, b, n in regions))


EDGE = PolicyParams(promote_after_snapshots=1, promote_after_s=0.0, demote_after_s=3.0,
                    demote_blind_after_s=10.0)
MAPS = [AddrRange(BASE, BASE + 4 * H)]  # ranges 0-3 collapsible; range 8 is not (file, text)


def promoted_pair() -> PolicyState:
    d, st = decide(snap(0.0, (0, 2, 20)), PolicyState(), EDGE, mappings=MAPS)
    assert d.promote == (BASE, BASE + H)
    return record_outcomes(st, {s: None for s in d.promote}, EDGE, 0.0)


def test_only_huge_witnessed_idle_time_counts_toward_demote_after_s() -> None:
    st = promoted_pair()
    # 0-5 s: range 0 idle, only non-collapsible memory busy (base witness): 5 s of weak evidence
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        d, st = decide(snap(t, (0, 1, 0), (1, 2, 0), (8, 9, 10)), st, EDGE, mappings=MAPS)
        assert d.demote == ()
    # from 5 s: range 1 busy again (huge witness); range 0 goes after 3 s more of that
    for t in (6.0, 7.0):
        d, st = decide(snap(t, (0, 1, 0), (1, 2, 20)), st, EDGE, mappings=MAPS)
        assert d.demote == ()
    d, st = decide(snap(8.0, (0, 1, 0), (1, 2, 20)), st, EDGE, mappings=MAPS)
    assert d.demote == (BASE,)


def test_base_witnessed_idle_time_demotes_after_the_blind_window() -> None:
    st = promoted_pair()
    for t in range(1, 10):
        d, st = decide(snap(float(t), (0, 2, 0), (8, 9, 10)), st, EDGE, mappings=MAPS)
        assert d.demote == ()
    d, st = decide(snap(10.0, (0, 2, 0), (8, 9, 10)), st, EDGE, mappings=MAPS)
    assert d.demote == (BASE, BASE + H)


def test_snapshots_where_nothing_reads_hot_stop_the_clocks_and_a_hot_reading_resets_them() -> None:
    st = promoted_pair()
    for t in (1.0, 2.0):  # huge-witnessed: 2 s
        d, st = decide(snap(t, (0, 1, 0), (1, 2, 20)), st, EDGE, mappings=MAPS)
    for t in (10.0, 20.0, 30.0):  # nothing of the process reads hot: no evidence, no time
        d, st = decide(snap(t, (0, 2, 0)), st, EDGE, mappings=MAPS)
        assert d.demote == ()
    d, st = decide(snap(30.5, (0, 1, 0), (1, 2, 20)), st, EDGE, mappings=MAPS)
    assert d.demote == ()  # 2.5 s witnessed so far
    d, st = decide(snap(31.0, (0, 1, 0), (1, 2, 20)), st, EDGE, mappings=MAPS)
    assert d.demote == (BASE,)  # 3 s witnessed
    st = promoted_pair()
    for t in (1.0, 2.0):
        d, st = decide(snap(t, (0, 1, 0), (1, 2, 20)), st, EDGE, mappings=MAPS)
    d, st = decide(snap(2.5, (0, 2, 20)), st, EDGE, mappings=MAPS)  # range 0 hot: counts reset
    for t in (3.5, 4.5, 5.0):
        d, st = decide(snap(t, (0, 1, 0), (1, 2, 20)), st, EDGE, mappings=MAPS)
        assert d.demote == ()
    d, st = decide(snap(5.5, (0, 1, 0), (1, 2, 20)), st, EDGE, mappings=MAPS)
    assert d.demote == (BASE,)


def test_params_reject_a_negative_blind_window() -> None:
    import pytest

    with pytest.raises(ValueError):
        PolicyParams(demote_blind_after_s=-1)
