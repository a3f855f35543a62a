"""The daemon's rounds replayed on snapshots recorded from a real DAMON: two hotcold processes
(tests/fixtures/damon-hotcold-256m-1g.json and damon-hotcold-64m-256m.json, 6.12 VM, vaddr)
share one budget smaller than their hot sets together.

Each round does what `Service.round` does without its I/O: `policy.decide` per process (no
budget of its own) with its candidates' `Decision.benefit`, `budget.admit` across processes, then
every admitted collapse succeeds (`record_outcomes`). What a process holds against the budget is
what the daemon counts (`Managed.held_bytes`): its promoted ranges, or its huge pages if more,
since a range the policy lets go of stays huge (MADV_COLLAPSE only, no split). Expectations are
relations (who wins, what never exceeds what), not numbers copied from an earlier run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from damon_hp.daemon.budget import Candidate, admit
from damon_hp.damon.model import Recording, Snapshot
from damon_hp.policy import PolicyParams, PolicyState, decide, record_outcomes
from damon_hp.ranges import HUGE_PAGE_BYTES as H

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MIB = 1 << 20
BIG, SMALL = 1, 2  # pids: the 256 MiB hot set and the 64 MiB one


def recording(name: str) -> Recording:
    rec = Recording.load(FIXTURES / name)
    assert rec.kernel and rec.command, f"{name} does not say where it came from"
    return rec


BIG_REC = recording("damon-hotcold-256m-1g.json")
SMALL_REC = recording("damon-hotcold-64m-256m.json")


@dataclass
class Round:
    candidates: list[Candidate]
    admitted: set[tuple[int, int]]
    held_after: dict[int, int]


@dataclass
class Replay:
    rounds: list[Round] = field(default_factory=list)

    def contested(self) -> list[Round]:
        return [r for r in self.rounds
                if r.admitted and len(r.admitted) < len(r.candidates)]

    def held(self, pid: int) -> int:
        return self.rounds[-1].held_after[pid]


def replay(streams: dict[int, list[Snapshot | None]], rule_of: dict[int, str],
           budget_bytes: int | None, rule_budgets: dict[str, int | None]) -> Replay:
    """streams: pid -> its snapshot in each round (None: nothing from it that round)."""
    # The captures are DAMON's own snapshots, without the pipeline's first-touch marks, so the
    # replay asks for two hot readings a second apart: the cold buffer's one-time write must not
    # read as hot here. The rule itself is tested in test_policy*.py; these tests are about the
    # rounds and the shared budget.
    params = PolicyParams(promote_after_snapshots=2, promote_after_s=1.0,
                          seed_streak_from_age=False)
    states = {pid: PolicyState() for pid in streams}
    huge: dict[int, set[int]] = {pid: set() for pid in streams}  # collapsed starts: stay huge

    def held_bytes(pid: int) -> int:
        return max(states[pid].promoted_bytes, len(huge[pid]) * H)

    out = Replay()
    for k in range(max(len(s) for s in streams.values())):
        candidates: list[Candidate] = []
        pending = {}
        for pid, stream in streams.items():
            snap = stream[k] if k < len(stream) else None
            if snap is None:
                continue
            gt = (BIG_REC if pid == BIG else SMALL_REC).ground_truth
            decision, states[pid] = decide(snap, states[pid], params,
                                           mappings=[gt["hot"], gt["cold"]])
            candidates += [Candidate(pid, rule_of[pid], s, decision.benefit[s])
                           for s in decision.promote]
            pending[pid] = snap
        held = {pid: held_bytes(pid) for pid in states}
        adm = admit(candidates, held, rule_of, budget_bytes, rule_budgets)
        for pid, snap in pending.items():
            done = {s: None for s in adm.admitted.get(pid, ())}
            huge[pid].update(done)
            states[pid] = record_outcomes(states[pid], done, params, snap.taken_at_s)
        out.rounds.append(Round(
            candidates, {(pid, s) for pid, starts in adm.admitted.items() for s in starts},
            {pid: held_bytes(pid) for pid in states}))
    return out


def side_by_side(small_delay: int = 0, big_delay: int = 0) -> dict[int, list[Snapshot | None]]:
    """Both recordings as one daemon sees them, each process starting that many rounds late
    (started together, both hot sets show in the same round)."""
    return {BIG: [None] * big_delay + list(BIG_REC.snapshots),
            SMALL: [None] * small_delay + list(SMALL_REC.snapshots)}


def assert_budgets_held(rep: Replay, budget_bytes: int | None,
                        rule_budgets: dict[str, int], rule_of: dict[int, str]) -> None:
    for r in rep.rounds:
        if budget_bytes is not None:
            assert sum(r.held_after.values()) <= budget_bytes
        for rule, limit in rule_budgets.items():
            assert sum(b for pid, b in r.held_after.items() if rule_of[pid] == rule) <= limit


def test_when_both_hot_sets_show_in_one_round_the_larger_one_takes_the_budget() -> None:
    rule_of = {BIG: "a", SMALL: "a"}
    budget = 192 * MIB  # hot sets: 256 + 64 MiB
    rep = replay(side_by_side(), rule_of, budget, {})
    assert_budgets_held(rep, budget, {}, rule_of)
    contested = rep.contested()
    assert contested, "the recordings no longer show both hot sets in one round"
    first = contested[0]
    assert {c.pid for c in first.candidates} == {BIG, SMALL}
    for r in contested:
        won = [c.benefit for c in r.candidates if (c.pid, c.start) in r.admitted]
        lost = [c.benefit for c in r.candidates if (c.pid, c.start) not in r.admitted]
        assert min(won) >= max(lost)
    # a range of the 256 MiB hot span is worth more than one of the 64 MiB span, at equal heat
    assert rep.held(BIG) == budget and rep.held(SMALL) == 0
    hot = BIG_REC.ground_truth["hot"]
    assert all(hot.start <= s and s + H <= hot.end for pid, s in first.admitted)


def test_a_rule_budget_caps_the_larger_hot_set_and_the_rest_goes_to_the_other_rule() -> None:
    rule_of = {BIG: "big", SMALL: "small"}
    budget, big_cap = 192 * MIB, 64 * MIB
    rep = replay(side_by_side(small_delay=1), rule_of, budget, {"big": big_cap})
    assert_budgets_held(rep, budget, {"big": big_cap}, rule_of)
    assert rep.held(BIG) == big_cap
    assert rep.held(SMALL) == 64 * MIB  # its whole hot set: the budget had room left


def test_huge_pages_held_are_not_taken_back_for_a_later_more_beneficial_hot_set() -> None:
    # The big process starting two rounds later, the small hot set shows first and is admitted
    # whole; the big one, worth more per range, gets only what is left (no split without a
    # DAMOS mark).
    rule_of = {BIG: "a", SMALL: "a"}
    budget = 192 * MIB
    rep = replay(side_by_side(big_delay=2), rule_of, budget, {})
    assert_budgets_held(rep, budget, {}, rule_of)
    small = rep.held(SMALL)
    assert 64 * MIB - 2 * H <= small <= 64 * MIB  # its whole hot set, to one edge range
    assert rep.held(BIG) == budget - small


def test_without_a_budget_every_hot_range_of_both_is_admitted() -> None:
    rule_of = {BIG: "a", SMALL: "a"}
    rep = replay(side_by_side(small_delay=1), rule_of, None, {})
    assert not rep.contested()
    for pid, rec in ((BIG, BIG_REC), (SMALL, SMALL_REC)):
        hot = rec.ground_truth["hot"]
        whole = (hot.end // H - (hot.start + H - 1) // H) * H  # aligned 2 MiB inside it
        assert whole - 2 * H <= rep.held(pid) <= whole
