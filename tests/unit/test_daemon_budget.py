"""The machine-wide budget: ranges of every process admitted by expected benefit."""

from __future__ import annotations

from damon_hp.daemon.budget import Candidate, admit

MIB = 1 << 20
HP = 2 * MIB


def cands(pid, rule, n, value, base=0):
    return [Candidate(pid, rule, base + i * HP, value) for i in range(n)]


def test_the_budget_holds_and_the_best_ranges_win_across_processes() -> None:
    pool = cands(1, "a", 10, 5.0) + cands(2, "a", 10, 50.0) + cands(3, "b", 10, 20.0)
    adm = admit(pool, {1: 0, 2: 0, 3: 0}, {1: "a", 2: "a", 3: "b"}, 30 * MIB, {})
    assert len(adm.admitted[2]) == 10  # the hottest process first
    assert len(adm.admitted[3]) == 5
    assert 1 not in adm.admitted
    assert adm.held_by_budget == {1: 10, 3: 5}
    assert sum(len(v) for v in adm.admitted.values()) * HP <= 30 * MIB


def test_what_is_held_already_counts_and_nothing_is_admitted_over_the_budget() -> None:
    adm = admit(cands(1, "a", 4, 9.0), {1: 4 * MIB, 2: 24 * MIB}, {1: "a", 2: "a"},
                32 * MIB, {})
    assert adm.admitted == {1: (0, HP)}
    assert adm.held_by_budget == {1: 2}


def test_a_rule_budget_limits_its_processes_together_and_others_take_the_rest() -> None:
    pool = cands(1, "small", 8, 90.0) + cands(2, "small", 8, 80.0) + cands(3, "big", 8, 1.0)
    adm = admit(pool, {}, {1: "small", 2: "small", 3: "big"}, None, {"small": 12 * MIB})
    assert len(adm.admitted[1]) == 6 and 2 not in adm.admitted
    assert adm.held_by_rule == {1: 2, 2: 8}
    assert len(adm.admitted[3]) == 8


def test_no_budget_admits_everything() -> None:
    adm = admit(cands(1, "a", 3, 1.0), {}, {1: "a"}, None, {})
    assert adm.admitted == {1: (0, HP, 2 * HP)}


def test_equal_benefit_is_admitted_in_a_stable_order() -> None:
    pool = cands(2, "a", 2, 1.0) + cands(1, "a", 2, 1.0)
    assert admit(pool, {}, {}, 2 * HP, {}).admitted == {1: (0, HP)}
