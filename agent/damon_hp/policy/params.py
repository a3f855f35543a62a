"""The decision rule's thresholds, each with the reason for its default."""

from __future__ import annotations

from dataclasses import dataclass

from damon_hp.ranges import PAGES_PER_HUGE

MIB = 1 << 20


@dataclass(frozen=True)
class PolicyParams:
    """Thresholds of the decision rule, with the reasons for their defaults.

    hot_access_pct = 5.0
        A range reads hot in a snapshot when DAMON saw it accessed in at least this share of
        the samples it took (nr_accesses / (aggr_us / sample_us)). DAMON's own example scheme
        for selective THP ("ethp") calls a region hot from 5 %. Before a range is collapsed DAMON
        samples a 4 KiB PTE's accessed bit, so a large randomly read buffer -- the case huge
        pages help most -- shows only a few accesses per aggregation even when it is the hottest
        memory of the process.
    min_hot_age_s = 0.0
        Age a hot region must have. Off: noise is filtered by the evidence below, and DAMON
        resets a region's age whenever its frequency moves, which a randomly read buffer does
        most intervals.
    mapping_share_pct = 90.0
        A hot region that spans several of the target's mappings is evidence only for a mapping
        holding at least this share of it (unmapped gaps count against it). DAMON's regions
        start coarse; a region half in a hot and half in an idle buffer reads hot and would
        otherwise collapse idle memory.
    promote_min_accesses = 1.0, promote_access_pct = None (= hot_access_pct)
        The evidence, absolute: over a range's streak of steady hot readings, DAMON's sampled
        accesses of it (its access frequency times the samples DAMON took, summed) must reach
        `promote_min_accesses`, at an overall rate of at least `promote_access_pct` of those
        samples. It does not depend on what else the process does: a heap read evenly is
        promoted as soon as one range read far harder than the rest (the earlier rule, relative
        to each snapshot's hottest range, held an even heap back for 10 snapshots or more).
        With a vaddr kdamond of ours (20 samples per 400 ms) one sampled access in one steady
        aggregation is enough: a range that is not accessed reads 0 there. Physical sources
        ask for more (`pipeline.params_for_source`): their regions mix frames of many processes.
    promote_after_snapshots = 1, promote_after_s = 0.0
        Hot readings and seconds a streak must also span. One steady aggregation: the
        first-touch rule (a range whose resident pages grew during the aggregation carries no
        evidence) is what keeps a buffer being written once from reading hot, which the earlier
        2-snapshot, 2-second streak was for.
    promote_grace = 1
        A streak survives one non-hot reading in a row, not two: a randomly read buffer shows
        only a few sampled accesses per snapshot before collapse and now and then none; a
        sequential pass that has moved on stays cold and ends its streak. A miss adds samples,
        not accesses, to the streak's evidence.
    seed_streak_from_age = True
        DAMON's region age (aggregations the region's access level has held) counts as hot
        readings already seen, up to `max_age_seed` of them, where the source's regions are the
        target's own (vaddr). A physical region's age says how long the *region* held its level,
        not the target's frames in it: physical sources turn this off.
    max_age_seed = 3
    can_demote = True
        Whether demotion (rule 6) can act at all. process_madvise cannot mark MADV_NOHUGEPAGE on
        another process nor split its huge pages, so without a DAMOS scheme of ours a promoted
        range stays huge: sources without one keep no idle bookkeeping, and a promoted range
        that reads idle for a while needs no new streak when it turns hot again.
    remark_after_snapshots = 2
        Hot readings a *demoted* range needs, with no age seed, before it is re-marked
        MADV_HUGEPAGE: it was shown idle for `demote_after_s`, and one reading is cheap to come
        by by chance. In a VM run of the marks scenario (tests/vm/test_madvise_marks.py,
        2026-11-29) a 9 MiB DAMON region wholly inside the idle buffer read 2 of 20 samples once,
        ~9 s after its 120 ranges were demoted, and 4 of them were re-marked; replaying that
        recording with two readings re-marks none. A region mostly inside idle memory with a
        slice of a busy buffer draws such readings too (`hotset.REST_MARGIN` makes them rare per
        aggregation, not impossible over thousands: a vaddr kdamond of ours aggregates every
        100-400 ms). One fresh-clone run of that test (2026-11-27) failed with 26 of 119 demoted
        ranges re-marked. Two readings in a row cost a range that is truly hot again one
        aggregation.
    demote_after_s = 30.0
        Seconds of *huge-witnessed* idleness (idle while another huge range of the process read
        hot) before a promoted range is demoted. DAMON's ethp example demotes after 7 s idle; a
        promoted range has already paid for its collapse, so we wait longer.
    demote_blind_after_s = 300.0
        Seconds of idleness witnessed only by memory on 4 KiB pages before a promoted range is
        demoted: its huge translations may all sit in the TLB, which DAMON cannot see (0 % for
        17 s seen in the test VM), so this evidence is weak. A choice, not a measurement.
    max_ptes_none = 256
        Base pages (of the 512 of a 2 MiB range) that may be absent for a range to be collapsed,
        as khugepaged's knob counts them. MADV_COLLAPSE ignores the knob (one resident page is
        enough and the collapse makes all 2 MiB resident), so a hot but sparse range collapsed
        is memory bloat; with 256 a collapse at most doubles a range's resident memory. 511 turns
        the guard off; 0 asks for fully resident ranges.
    max_huge_bytes = None, max_huge_rss_pct = None
        No budget by default: the evidence is the selector. Either (the smaller wins) caps the
        huge-page memory this agent creates.
    collapse_bytes_per_s = 256 MiB/s, collapse_burst_s = 1.0
        MADV_COLLAPSE copies each range and may compact or reclaim. 256 MiB/s keeps the agent's
        kernel time around a sixth of a core and covers a 1 GiB hot set in about 4 s. The bucket
        holds at least one aggregation's worth, so slow snapshots get the same rate.
    retry_after_s = 2.0, max_retry_after_s = 60.0
        A refused collapse (EAGAIN, ENOMEM, EINVAL) is retried after 2 s, doubling up to a
        minute, so a range the kernel keeps refusing does not burn the rate budget.
    """

    hot_access_pct: float = 5.0
    min_hot_age_s: float = 0.0
    mapping_share_pct: float = 90.0
    promote_min_accesses: float = 1.0
    promote_access_pct: float | None = None
    promote_after_snapshots: int = 1
    promote_after_s: float = 0.0
    promote_grace: int = 1
    seed_streak_from_age: bool = True
    max_age_seed: int = 3
    can_demote: bool = True
    remark_after_snapshots: int = 2
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
        for name in ("hot_access_pct", "promote_access_pct"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 100.0:
                raise ValueError(f"{name} must be within 0..100, got {value}")
        if min(self.min_hot_age_s, self.demote_after_s, self.promote_after_s,
               self.demote_blind_after_s) < 0:
            raise ValueError("min_hot_age_s, promote_after_s, demote_after_s and "
                             "demote_blind_after_s must not be negative")
        if not 0 <= self.max_ptes_none < PAGES_PER_HUGE:
            raise ValueError(f"max_ptes_none must be within 0..{PAGES_PER_HUGE - 1} (base "
                             f"pages of a 2 MiB range that may be absent), got "
                             f"{self.max_ptes_none}")
        if self.promote_min_accesses < 0 or self.max_age_seed < 0:
            raise ValueError("promote_min_accesses and max_age_seed must not be negative")
        if (self.promote_after_snapshots < 1 or self.remark_after_snapshots < 1
                or self.promote_grace < 0):
            raise ValueError("promote_after_snapshots and remark_after_snapshots must be at "
                             "least 1, promote_grace >= 0")
        if self.max_huge_bytes is not None and self.max_huge_bytes < 0:
            raise ValueError("max_huge_bytes must not be negative")
        if self.max_huge_rss_pct is not None and not 0 <= self.max_huge_rss_pct <= 100:
            raise ValueError("max_huge_rss_pct must be within 0..100")
        if self.collapse_bytes_per_s <= 0 or self.collapse_burst_s <= 0:
            raise ValueError("collapse_bytes_per_s and collapse_burst_s must be positive")

    @property
    def promote_rate_pct(self) -> float:
        """The streak's overall access rate a promotion needs (promote_access_pct or, unset,
        hot_access_pct)."""
        return self.hot_access_pct if self.promote_access_pct is None else self.promote_access_pct
