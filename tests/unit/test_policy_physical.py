"""The promotion rule for physical (reverse-mapped) sources, replayed on a real recording.

The fixture is a passive run on the CI host (hotcold 1 GiB hot / 3 GiB cold, the host's foreign
paddr kdamond at 500 ms / 5 s, VM tests running beside it): the agent's virtual snapshots after
the pagemap reverse map. Its cold ranges flicker hot whenever their frames share a DAMON region
with busy frames of any process, which the streak rule alone lets through; the evidence sum
(`promote_evidence_pct`) is what holds them back.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from damon_hp.agent import streak_for_source
from damon_hp.damon.model import Region, Snapshot
from damon_hp.damon.sources import populating
from damon_hp.policy import PolicyParams, PolicyState, decide, record_outcomes
from damon_hp.ranges import HUGE_PAGE_BYTES as H
from damon_hp.ranges import AddrRange

FIXTURE = Path(__file__).parents[1] / "fixtures/passive-hotcold-1g-3g-host-6.18.json.gz"
PAGE = 4096


def load() -> tuple[list[Snapshot], AddrRange, AddrRange]:
    fx = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    base = fx["base"]
    snaps = [
        Snapshot(taken_at_s=s["taken_at_s"], pid=1, sample_us=fx["sample_us"],
                 aggr_us=fx["aggr_us"],
                 regions=tuple(Region(base + off * PAGE, base + (off + n) * PAGE, acc, age)
                               for off, n, acc, age in s["regions"]))
        for s in fx["snapshots"]
    ]
    return snaps, AddrRange(*fx["hot"]), AddrRange(*fx["cold"])


def promoted(snaps: list[Snapshot], params: PolicyParams,
             mappings: list[AddrRange]) -> dict[int, float]:
    """range start -> time of its promotion; every planned collapse succeeds."""
    state, when = PolicyState(), {}
    for snap in snaps:
        d, state = decide(snap, state, params, mappings=mappings)
        state = record_outcomes(state, {s: None for s in d.promote}, params, snap.taken_at_s)
        when.update({s: snap.taken_at_s for s in d.promote})
    return when


def share(starts: dict[int, float], r: AddrRange) -> float:
    return sum(1 for s in starts if r.start <= s and s + H <= r.end) * H / r.size


@pytest.fixture(scope="module")
def recording() -> tuple[list[Snapshot], AddrRange, AddrRange]:
    return load()


def physical(evidence_pct: float | None = None) -> PolicyParams:
    p = streak_for_source(PolicyParams(), "passive", 5_000_000)
    return p if evidence_pct is None else PolicyParams(**{**p.__dict__,
                                                          "promote_evidence_pct": evidence_pct})


def test_physical_sources_ask_for_evidence_and_vaddr_does_not() -> None:
    assert physical().promote_evidence_pct > 0
    assert streak_for_source(PolicyParams(), "vaddr", 5_000_000).promote_evidence_pct == 0


def test_the_evidence_sum_keeps_flickering_cold_ranges_on_4k_pages(recording) -> None:
    snaps, hot, cold = recording
    maps = [hot, cold]
    streak_only = promoted(snaps, physical(0.0), maps)
    with_evidence = promoted(snaps, physical(), maps)
    print(f"streak only: hot {share(streak_only, hot):.1%} cold {share(streak_only, cold):.1%}; "
          f"with evidence: hot {share(with_evidence, hot):.1%} "
          f"cold {share(with_evidence, cold):.1%}")
    # The recording shows the problem: the streak alone collapses a sizeable part of the cold
    # buffer ...
    assert share(streak_only, cold) > 0.05
    # ... the evidence sum cuts it to a fraction, and promotes only what the streak would have.
    assert share(with_evidence, cold) < share(streak_only, cold) / 2
    assert set(with_evidence) <= set(streak_only)
    # It costs the hot buffer time, not coverage: most of it is still promoted, each range no
    # earlier than under the streak alone.
    assert share(with_evidence, hot) >= 0.75
    assert all(with_evidence[s] >= streak_only[s] for s in with_evidence)


def test_evidence_is_the_sum_of_a_streaks_access_frequencies() -> None:
    """Synthetic, each snapshot's frequencies relative to its hottest candidate: next to a range
    at 100 %, one at 20 % gathers 20 a snapshot; once the hot one is promoted it is the
    hottest candidate left and gathers 100. A miss within the grace keeps the sum, two drop it."""
    params = PolicyParams(promote_after_snapshots=3, promote_after_s=0.0,
                          promote_evidence_pct=150.0, promote_grace=1)
    a, b = AddrRange(0, H), AddrRange(4 * H, 5 * H)

    def snap(t: float, acc_a: int, acc_b: int) -> Snapshot:
        return Snapshot(t, 1, 100_000, 1_000_000,
                        (Region(a.start, a.end, acc_a, 0), Region(b.start, b.end, acc_b, 0)))

    state, when = PolicyState(), {}
    for t in range(6):
        d, state = decide(snap(float(t), 2, 10), state, params, mappings=[a, b])
        state = record_outcomes(state, {s: None for s in d.promote}, params, float(t))
        when.update({s: t for s in d.promote})
    # b: 3 snapshots, 300 %. a: 20 + 20 + 20, then 100 alone: 160 % at t = 3.
    assert when == {b.start: 2, a.start: 3}
    # a miss inside the grace keeps the sum; the next two misses reset it
    state = PolicyState()
    for t, acc in enumerate([10, 0, 10, 0, 0, 10, 10]):
        d, state = decide(snap(float(t), acc, 0), state, params, mappings=[a, b])
        assert not d.promote, t
        state = record_outcomes(state, {}, params, float(t))
    assert state.hot_evidence[a.start] == pytest.approx(200.0)


@pytest.mark.parametrize(("before_mib", "now_mib", "blurred"), [
    (None, 4, False),      # a small process's first snapshot
    (None, 320, True),     # the first snapshot holds the whole start-up
    (0, 64, True),         # faulting 64 MiB in within one aggregation
    (320, 327, False),     # 7 MiB: under the 8 MiB floor
    (320, 329, True),      # 9 MiB of 320: over the floor and 2 %
    (4096, 4170, False),   # 74 MiB of 4 GiB: under 2 %
    (4096, 4180, True),    # 84 MiB of 4 GiB: over 2 %
    (4096, 1024, False),   # shrinking (freed, paged out) blurs nothing
])
def test_aggregations_of_a_target_faulting_memory_in_are_withheld(before_mib, now_mib,
                                                                    blurred) -> None:
    mib = 1 << 20
    before = None if before_mib is None else before_mib * mib
    assert populating(before, now_mib * mib) is blurred
