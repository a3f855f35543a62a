"""A demoted range comes back only on readings of its own (policy `remark_after_snapshots`).

Replays a recording of the VM's marks scenario (what tests/vm/test_madvise_marks.py runs):
`phases` with two 256 MiB regions under THP `madvise` in the 7.3 test VM, our vaddr kdamond,
`--demote-after 4`. Region 0 is read until it is huge and marked, then the hot set moves to
region 1 and region 0 stays idle. In that run a 9 MiB DAMON region wholly inside idle region 0
read 2 of 20 samples once, and the agent re-marked 4 of region 0's demoted ranges
MADV_HUGEPAGE on that one reading. Every collapse is taken as successful in the replay, as the
agent's were in the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from damon_hp.damon.model import Recording
from damon_hp.policy import PolicyParams, PolicyState, decide, record_outcomes
from damon_hp.ranges import AddrRange

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / \
    "agent-run-phases-2x256m-madvise-7.3.json.gz"


@dataclass
class Replay:
    demoted: set[int]
    remarked: set[int]
    promoted: set[int]


def replay(params: PolicyParams) -> tuple[Replay, Replay]:
    """What the policy did to region 0 and to region 1."""
    rec = Recording.load(FIXTURE)
    r0, r1 = rec.ground_truth["region0"], rec.ground_truth["region1"]
    st = PolicyState()
    demoted: set[int] = set()
    remarked: set[int] = set()
    promoted: set[int] = set()
    for snap in rec.snapshots:
        d, nxt = decide(snap, st, params, mappings=sorted([r0, r1]), thp_mode="madvise")
        demoted |= set(d.demote)
        remarked |= set(nxt.remarked) - set(st.remarked)
        promoted |= set(d.promote)
        st = record_outcomes(nxt, {s: None for s in d.promote}, params, now_s=snap.taken_at_s)

    def of(r: AddrRange) -> Replay:
        def inside(xs: set[int]) -> set[int]:
            return {x for x in xs if r.start <= x < r.end}
        return Replay(inside(demoted), inside(remarked), inside(promoted))

    return of(r0), of(r1)


def test_the_idle_region_s_demoted_ranges_are_not_remarked_on_a_chance_reading() -> None:
    region0, region1 = replay(PolicyParams(demote_after_s=4.0))
    # Every range promoted while region 0 was hot is demoted once the hot set has moved on.
    assert len(region0.promoted) >= 115 and region0.demoted == region0.promoted
    assert region0.remarked == set()
    assert len(region1.promoted) >= 115, len(region1.promoted)  # the new hot set is promoted


def test_one_reading_would_have_remarked_them_as_the_run_did() -> None:
    # The recording holds the case: with the earlier rule (one reading, age-seeded) the replay
    # re-marks idle ranges, as the agent did in the VM.
    region0, _ = replay(PolicyParams(demote_after_s=4.0, remark_after_snapshots=1))
    assert region0.remarked, "the recording no longer shows a chance reading of idle memory"
    assert region0.remarked <= region0.demoted
