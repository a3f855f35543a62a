"""Pure: one machine-wide budget for damon-hp's huge pages, shared by every managed process.

Each process's policy (`policy.decide`, run without a budget of its own) names the ranges it
would collapse now. `admit` pools those candidates of all processes and admits them best first
by the policy's own ranking score (`Decision.benefit`: expected TLB benefit per byte the
collapse occupies, policy/rule.py `ranking_score`) -- while the machine-wide budget and the
per-rule budgets allow. So ranges compete by benefit across processes, not first come first
served. What is held already counts against the budgets: a huge page is never taken back to
make room (with a physical source there is no DAMOS mark that could keep it small).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from damon_hp.ranges import HUGE_PAGE_BYTES


@dataclass(frozen=True)
class Candidate:
    """A range one process's policy would collapse now."""

    pid: int
    rule: str
    start: int
    benefit: float


@dataclass(frozen=True)
class Admission:
    admitted: Mapping[int, tuple[int, ...]]
    """pid -> ranges to collapse, in the order the policy gave them"""
    held_by_budget: Mapping[int, int] = field(default_factory=dict)
    """pid -> candidates not admitted because of the machine-wide budget"""
    held_by_rule: Mapping[int, int] = field(default_factory=dict)
    """pid -> candidates not admitted because of their rule's budget"""


def admit(candidates: Iterable[Candidate], held_bytes: Mapping[int, int],
          rule_of: Mapping[int, str], budget_bytes: int | None,
          rule_budgets: Mapping[str, int | None]) -> Admission:
    """Admit candidates best first (benefit, then pid and address for a stable order).

    held_bytes: pid -> huge bytes damon-hp holds in it now (its promoted ranges).
    rule_of: pid -> the name of its rule; rule_budgets: rule name -> bytes or None.
    """
    total = sum(held_bytes.values())
    per_rule: dict[str, int] = {}
    for pid, held in held_bytes.items():
        rule = rule_of.get(pid)
        if rule is not None:
            per_rule[rule] = per_rule.get(rule, 0) + held
    admitted: dict[int, list[int]] = {}
    by_budget: dict[int, int] = {}
    by_rule: dict[int, int] = {}
    for c in sorted(candidates, key=lambda c: (-c.benefit, c.pid, c.start)):
        limit = rule_budgets.get(c.rule)
        if budget_bytes is not None and total + HUGE_PAGE_BYTES > budget_bytes:
            by_budget[c.pid] = by_budget.get(c.pid, 0) + 1
        elif limit is not None and per_rule.get(c.rule, 0) + HUGE_PAGE_BYTES > limit:
            by_rule[c.pid] = by_rule.get(c.pid, 0) + 1
        else:
            admitted.setdefault(c.pid, []).append(c.start)
            total += HUGE_PAGE_BYTES
            per_rule[c.rule] = per_rule.get(c.rule, 0) + HUGE_PAGE_BYTES
    return Admission({pid: tuple(s) for pid, s in admitted.items()}, by_budget, by_rule)
