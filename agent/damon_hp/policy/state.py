"""What the policy remembers between snapshots (one record per 2 MiB range) and what it decides.

All frozen: the rule's functions return new records, so a replay can keep any step's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from damon_hp.ranges import HUGE_PAGE_BYTES, AddrRange

# Readings a streak keeps for its evidence: enough for the slowest rule (physical sources reach
# 6 sampled accesses in two hot readings at 30 %; a lukewarm range at 5 % in a few more).
KEPT_READINGS = 8

# The outcome of a collapse on a range the target had unmapped (actuate.collapse): not a
# refusal to back off from. The range's record is dropped; memory mapped there later is new.
UNMAPPED = "UNMAPPED"


@dataclass(frozen=True)
class Streak:
    """A not-yet-promoted range's run of hot readings and the evidence they carry."""

    since_s: float
    """time of the streak's first hot reading (earlier when DAMON's region age seeded it)"""
    hot_readings: int
    readings: tuple[tuple[float, int], ...]
    """the latest readings (at most KEPT_READINGS), oldest first: DAMON's sampled accesses of
    the range and the samples it took (a miss within the grace adds samples only)"""
    missed: int = 0
    """non-hot readings in a row (up to promote_grace)"""

    def then(self, accesses: float, samples: int, *, hot: bool) -> Streak:
        """The streak after one more reading."""
        return Streak(self.since_s, self.hot_readings + hot,
                      (*self.readings, (accesses, samples))[-KEPT_READINGS:],
                      0 if hot else self.missed + 1)

    def evidence(self, min_accesses: float, min_pct: float) -> bool:
        """Do the latest readings -- any run of them up to the newest -- hold `min_accesses`
        sampled accesses at `min_pct` of the samples? The newest first: older, lukewarm
        readings of a range that has turned busy do not dilute it."""
        accesses, samples = 0.0, 0
        for a, n in reversed(self.readings):
            accesses += a
            samples += n
            if accesses >= min_accesses - 1e-9 and 100.0 * accesses >= (min_pct - 1e-9) * samples:
                return True
        return False


@dataclass(frozen=True)
class Huge:
    """A promoted range: collapsed by us (or found huge) and kept so."""

    last_hot_s: float
    idle_witnessed_s: float = 0.0
    """seconds it read idle while other memory of the process read hot"""
    idle_huge_witnessed_s: float = 0.0
    """of those, seconds while another promoted range read hot"""


@dataclass(frozen=True)
class RangeState:
    """Everything the policy remembers of one 2 MiB-aligned range."""

    streak: Streak | None = None
    huge: Huge | None = None
    demoted: bool = False
    """marked MADV_NOHUGEPAGE after going cold"""
    remarked_at: float | None = None
    """a formerly demoted range re-marked MADV_HUGEPAGE, and when"""
    retry_at: float | None = None
    """its collapse failed: earliest time to try again"""
    failures: int = 0
    """consecutive failed collapses (for the back-off)"""

    # The two changes made to every hot or promoted range at every snapshot, by the
    # constructor: dataclasses.replace introspects the fields on each call, and was the largest
    # single cost of `decide` (600 calls per snapshot of a 4 GiB target, 2026-11-27 profile).
    def with_streak(self, streak: Streak | None) -> RangeState:
        return RangeState(streak, self.huge, self.demoted, self.remarked_at, self.retry_at,
                          self.failures)

    def with_huge(self, huge: Huge | None) -> RangeState:
        return RangeState(self.streak, huge, self.demoted, self.remarked_at, self.retry_at,
                          self.failures)

    @property
    def empty(self) -> bool:
        # field by field: the generated __eq__ builds two tuples per call
        return (self.streak is None and self.huge is None and not self.demoted
                and self.remarked_at is None and self.retry_at is None and not self.failures)


EMPTY = RangeState()
"""The record of a range the policy remembers nothing of (frozen, so one serves all)."""


@dataclass(frozen=True)
class PolicyState:
    """The policy's memory. Treat as immutable: functions return a new one."""

    ranges: Mapping[int, RangeState] = field(default_factory=dict)
    """range start -> its record (ranges with nothing to remember are left out)"""
    credit_bytes: float | None = None
    """collapse rate-limit tokens; None until the first snapshot"""
    last_taken_at_s: float | None = None

    def get(self, start: int) -> RangeState:
        return self.ranges.get(start, EMPTY)

    @property
    def promoted_last_hot(self) -> dict[int, float]:
        """promoted range -> the last time it read hot (what demotion counts from)"""
        return {s: r.huge.last_hot_s for s, r in self.ranges.items() if r.huge is not None}

    @property
    def demoted(self) -> frozenset[int]:
        return frozenset(s for s, r in self.ranges.items() if r.demoted)

    @property
    def remarked(self) -> dict[int, float]:
        return {s: r.remarked_at for s, r in self.ranges.items() if r.remarked_at is not None}

    @property
    def streaks(self) -> dict[int, Streak]:
        return {s: r.streak for s, r in self.ranges.items() if r.streak is not None}

    @property
    def retry_at(self) -> dict[int, float]:
        return {s: r.retry_at for s, r in self.ranges.items() if r.retry_at is not None}

    @property
    def failures(self) -> dict[int, int]:
        return {s: r.failures for s, r in self.ranges.items() if r.failures}

    @property
    def promoted_bytes(self) -> int:
        return sum(r.huge is not None for r in self.ranges.values()) * HUGE_PAGE_BYTES


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
    """ready ranges not promoted because the process turned THP off for itself"""
    unsteady: int = 0
    """hot ranges whose reading was not used: their resident pages may have grown during the
    aggregation (pipeline.FirstTouch)"""
    budget_bytes: int | None = None
    benefit: Mapping[int, float] = field(default_factory=dict)
    """promoted-now range -> its expected benefit (access % times hot span MiB), for a budget
    shared between processes (damon-hpd)"""
