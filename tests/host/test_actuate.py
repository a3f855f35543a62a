"""actuate on real processes of this host: process_madvise(MADV_COLLAPSE) through a pidfd.

Per-process only (allowed on the host): no DAMON sysfs, no global THP setting is touched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from collapse_errors import until_settled
from damon_hp import actuate, procfs, report
from damon_hp.damon.model import SchemeStats
from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.policy import Decision
from damon_hp.ranges import HUGE_PAGE_BYTES, AddrRange, huge_range

CHILD = Path(__file__).with_name("memchild.py")
MADV_HUGEPAGE = 14


class Child:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        info = json.loads(self.proc.stdout.readline())
        self.pid: int = info["pid"]
        self.start: int = info["start"]
        self.end: int = info["end"]

    def madvise(self, start: int, length: int, advice: int) -> None:
        """madvise(2) by the child on its own memory, as the kdamond does for a DAMOS action."""
        self.proc.stdin.write(f"madvise {start} {length} {advice}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child("16")
    yield c
    c.stop()


def anon_huge_bytes(pid: int, start: int, end: int) -> int:
    return procfs.smaps_in_ranges(procfs.read_smaps(pid), [AddrRange(start, end)]).anon_huge_bytes


def test_collapse_makes_populated_aligned_buffer_anon_huge(child: Child) -> None:
    assert anon_huge_bytes(child.pid, child.start, child.end) == 0
    starts = list(range(child.start, child.end, HUGE_PAGE_BYTES))
    with actuate.Target.open(child.pid) as target:
        results = until_settled(lambda s: actuate.collapse(target, s), starts)
    assert [r.error for r in results] == [None] * len(starts)
    assert sum(r.bytes_done for r in results) == child.end - child.start
    assert all(r.seconds >= 0 for r in results)
    assert anon_huge_bytes(child.pid, child.start, child.end) == child.end - child.start
    whole = AddrRange(child.start, child.end)
    assert procfs.huge_bytes_in(child.pid, [whole]) == whole.size


def test_collapse_touches_only_the_ranges_asked_for(child: Child) -> None:
    chosen = [child.start + HUGE_PAGE_BYTES, child.start + 3 * HUGE_PAGE_BYTES]
    with actuate.Target.open(child.pid) as target:
        results = until_settled(lambda s: actuate.collapse(target, s), chosen)
    assert all(r.error is None for r in results)
    whole = AddrRange(child.start, child.end)
    assert procfs.huge_bytes_in(child.pid, [whole]) == 2 * HUGE_PAGE_BYTES
    for start in chosen:
        assert procfs.huge_bytes_in(child.pid, [AddrRange(start, start + HUGE_PAGE_BYTES)]) == (
            HUGE_PAGE_BYTES
        )
    untouched = child.start + 2 * HUGE_PAGE_BYTES
    assert procfs.huge_bytes_in(child.pid, [AddrRange(untouched, untouched + HUGE_PAGE_BYTES)]) == 0


def test_collapse_of_nohugepage_memory_is_recorded_as_einval_not_raised() -> None:
    """A refusal stays EINVAL also where the maps are read: the range is mapped."""
    c = Child("4", "nohuge")
    try:
        with actuate.Target.open(c.pid) as target, procfs.ProcessFiles(c.pid) as files:
            results = actuate.collapse(target, [c.start], files.maps_cover)
        assert results[0].error == "EINVAL"
        assert results[0].bytes_done == 0
        assert anon_huge_bytes(c.pid, c.start, c.end) == 0
    finally:
        c.stop()


def test_collapse_of_unmapped_range_is_enomem_from_the_kernel_and_unmapped_by_the_maps(
        child: Child) -> None:
    maps = procfs.read_maps(child.pid)
    # Find a 2 MiB-aligned hole below the buffer that no mapping touches.
    hole = child.start - 64 * HUGE_PAGE_BYTES
    while any(m.start < hole + HUGE_PAGE_BYTES and hole < m.end for m in maps):
        hole -= HUGE_PAGE_BYTES
    with actuate.Target.open(child.pid) as target, procfs.ProcessFiles(child.pid) as files:
        (bare,) = actuate.collapse(target, [hole])
        (told,) = actuate.collapse(target, [hole], files.maps_cover)
    assert bare.error == "ENOMEM"  # madvise_walk_vmas: part of the range has no VMA
    assert told.error == actuate.UNMAPPED


def test_ranges_the_target_unmapped_are_unmapped_and_the_rest_collapse(child: Child) -> None:
    """A target freeing (or exiting) while a batch runs: its gone ranges are UNMAPPED, not a
    failed allocation."""
    gone = child.start + 2 * HUGE_PAGE_BYTES
    child.proc.stdin.write(f"munmap {gone} {HUGE_PAGE_BYTES}\n")
    child.proc.stdin.flush()
    assert child.proc.stdout.readline().strip() == "ok"
    starts = [child.start, gone, child.start + 4 * HUGE_PAGE_BYTES]
    with actuate.Target.open(child.pid) as target, procfs.ProcessFiles(child.pid) as files:
        assert not files.maps_cover(AddrRange(child.start, child.end))
        assert files.maps_cover(AddrRange(child.start, gone))
        results = until_settled(lambda s: actuate.collapse(target, s, files.maps_cover),
                                starts)
    assert [r.error for r in results] == [None, actuate.UNMAPPED, None]
    assert procfs.huge_bytes_in(child.pid, [AddrRange(child.start, child.end)]) == (
        2 * HUGE_PAGE_BYTES)


def test_target_open_rejects_a_pid_that_does_not_exist() -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    with pytest.raises(EnvironmentProblem, match=f"no process {p.pid}"):
        actuate.Target.open(p.pid)


def test_target_notices_exit_through_its_pidfd() -> None:
    c = Child("2")
    target = actuate.Target.open(c.pid)
    try:
        assert not target.exited()
        c.stop()
        assert target.exited(timeout_s=10)
    finally:
        target.close()


def test_target_pinned_before_exit_reports_esrch_instead_of_touching_a_reused_pid() -> None:
    c = Child("2")
    target = actuate.Target.open(c.pid)
    try:
        c.stop()  # exited and reaped: the PID may now be reused, the pidfd still names the old one
        (result,) = actuate.collapse(target, [c.start])
        assert result.error == "ESRCH"
    finally:
        target.close()


def test_mark_schemes_limit_each_action_to_its_ranges() -> None:
    huge = [AddrRange(0x200000, 0x600000)]
    nohuge = [AddrRange(0x800000, 0xA00000), AddrRange(0xC00000, 0xE00000)]
    schemes = actuate.mark_schemes(huge, nohuge)
    assert [s.action for s in schemes] == ["hugepage", "nohugepage"]
    assert [(a.start, a.end) for a in schemes[0].addr_filters] == [(0x200000, 0x600000)]
    assert [(a.start, a.end) for a in schemes[1].addr_filters] == [
        (0x800000, 0xA00000),
        (0xC00000, 0xE00000),
    ]


def test_mark_schemes_leave_out_a_scheme_with_no_ranges() -> None:
    # An unfiltered scheme would madvise the whole address space.
    assert actuate.mark_schemes([], []) == []
    assert [s.action for s in actuate.mark_schemes([], [AddrRange(0, HUGE_PAGE_BYTES)])] == [
        "nohugepage"
    ]


# -- the Actuator: one decision in, one record of what was applied out ---------------------


class _SchemeHost:
    """Stands in for our vaddr kdamond (none can run on this host): records what is installed,
    and can answer a commit with DAMON's EBUSY."""

    def __init__(self, busy: int = 0) -> None:
        self.installed: list[tuple] = []
        self.busy = busy

    def set_schemes(self, schemes) -> None:
        if self.busy:
            self.busy -= 1
            raise DamonHpError("damon-hp: writing 'commit' failed: Device or resource busy")
        self.installed.append(tuple(schemes))

    def scheme_stats(self):
        return [SchemeStats(1, HUGE_PAGE_BYTES, 1, HUGE_PAGE_BYTES, 0)
                for _ in self.installed[-1]]

    def is_running(self) -> bool:
        return True


def _decision(promote=(), demote=(), huge_marks=(), nohuge_marks=()) -> Decision:
    return Decision(taken_at_s=1.0, hot_bytes=0, hot_regions=(), hot_ranges=tuple(promote),
                    promote=tuple(promote), demote=tuple(demote),
                    hugepage_marks=tuple(huge_marks), nohugepage_marks=tuple(nohuge_marks))


def test_actuator_collapses_adopts_what_is_huge_already_and_reports_each_outcome(
        child: Child) -> None:
    first, second = child.start, child.start + HUGE_PAGE_BYTES
    with actuate.Target.open(child.pid) as target, procfs.ProcessFiles(child.pid) as files:
        act = actuate.Actuator(target, files, None)
        one = act.apply(_decision(promote=[first]), 1.0)
        assert [r.error for r in one.collapses] == [None] and one.adopted == ()
        # `first` is PMD-mapped now: chosen again, it is adopted without a collapse call
        two = act.apply(_decision(promote=[first, second]), 2.0)
    assert two.adopted == (first,)
    assert [r.start for r in two.collapses] == [second]
    assert two.outcomes == {first: None, second: None}
    assert [rec["action"] for rec in two.action_records()] == ["collapse"]
    assert one.commit is None and act.marks_unavailable  # no kdamond of ours: no marks


MADV_COLLAPSE = 25


def test_damos_collapses_that_land_after_the_last_check_are_counted_at_the_stop(
        child: Child) -> None:
    """A range handed to the DAMOS collapse action and collapsed after the agent's last check
    (here the child collapses it itself, as the kdamond would on its behalf) is counted once
    the kdamond has stopped; a range never collapsed is left out, not counted as failed."""
    first, second = child.start, child.start + HUGE_PAGE_BYTES
    with actuate.Target.open(child.pid) as target, procfs.ProcessFiles(child.pid) as files:
        act = actuate.Actuator(target, files, _SchemeHost(), damos_collapse=True)
        queued = act.apply(_decision(promote=[first, second]), 1.0)
        assert queued.collapses == [] and queued.damos_collapses == []
        assert sorted(act.pending_damos) == [first, second]
        child.madvise(first, HUGE_PAGE_BYTES, MADV_COLLAPSE)
        settled = act.settle_damos_collapses()
        assert act.pending_damos == {}
        assert act.settle_damos_collapses() == []
    assert [(r.action, r.start, r.bytes_done, r.error) for r in settled] == [
        ("damos_collapse", first, HUGE_PAGE_BYTES, None)]


def test_a_damos_range_given_up_that_the_kdamond_collapses_later_is_revived_at_the_stop(
        child: Child) -> None:
    first = child.start
    with actuate.Target.open(child.pid) as target, procfs.ProcessFiles(child.pid) as files:
        act = actuate.Actuator(target, files, _SchemeHost(), damos_collapse=True)
        act.apply(_decision(promote=[first]), 1.0)
        checks = [act.apply(_decision(), 2.0 + i) for i in range(actuate.DAMOS_COLLAPSE_CHECKS)]
        assert [(r.start, r.error) for r in checks[-1].damos_collapses] == [
            (first, "NOT_COLLAPSED")]
        child.madvise(first, HUGE_PAGE_BYTES, MADV_COLLAPSE)  # the kdamond, late
        settled = act.settle_damos_collapses()
    assert [(r.action, r.start, r.error) for r in settled] == [
        ("damos_collapse_late", first, None)]
    tally = report.CollapseTally()
    tally.add(False, 0, "NOT_COLLAPSED", 0.0)
    tally.revive(HUGE_PAGE_BYTES, "NOT_COLLAPSED")
    assert (tally.tried, tally.ok, tally.bytes, tally.errors) == (1, 1, HUGE_PAGE_BYTES, {})


def test_a_damos_range_given_up_then_queued_again_counts_once_when_it_collapses(
        child: Child) -> None:
    """Given up as NOT_COLLAPSED, chosen again and collapsed at its new check: one success,
    not a second one at the stop (the range left the given-up set when it was queued)."""
    first = child.start
    with actuate.Target.open(child.pid) as target, procfs.ProcessFiles(child.pid) as files:
        act = actuate.Actuator(target, files, _SchemeHost(), damos_collapse=True)
        act.apply(_decision(promote=[first]), 1.0)
        for i in range(actuate.DAMOS_COLLAPSE_CHECKS):
            act.apply(_decision(), 2.0 + i)
        assert act.damos_given_up == {first}
        act.apply(_decision(promote=[first]), 10.0)
        child.madvise(first, HUGE_PAGE_BYTES, MADV_COLLAPSE)  # the kdamond, this time in time
        checked = act.apply(_decision(), 11.0)
        settled = act.settle_damos_collapses()
    assert [(r.action, r.start, r.error) for r in checked.damos_collapses] == [
        ("damos_collapse", first, None)]
    assert settled == []


def test_actuator_in_dry_run_changes_nothing(child: Child) -> None:
    with actuate.Target.open(child.pid) as target, procfs.ProcessFiles(child.pid) as files:
        host = _SchemeHost()
        act = actuate.Actuator(target, files, host, dry_run=True)
        applied = act.apply(_decision(promote=[child.start], demote=[child.start]), 1.0)
        assert applied.outcomes == {} and applied.action_records() == []
        assert host.installed == []
        assert files.huge_bytes_in([AddrRange(child.start, child.end)]) == 0


def test_actuator_installs_marks_once_and_retries_a_busy_commit(child: Child) -> None:
    huge = AddrRange(child.start, child.start + HUGE_PAGE_BYTES)
    with actuate.Target.open(child.pid) as target, procfs.ProcessFiles(child.pid) as files:
        host = _SchemeHost(busy=1)
        act = actuate.Actuator(target, files, host)
        d = _decision(demote=[child.start], nohuge_marks=[huge])
        busy = act.apply(d, 1.0)
        assert busy.commit is not None and "busy" in (busy.commit.error or "")
        assert host.installed == [] and act.installed == ()
        again = act.apply(_decision(nohuge_marks=[huge]), 2.0)
        assert again.commit is not None and again.commit.error is None
        assert [s.action for s in host.installed[0]] == ["nohugepage"]
        # unchanged marks: nothing to commit
        assert act.apply(_decision(nohuge_marks=[huge]), 3.0).commit is None
        act.fold_scheme_stats()
    assert [r.action for r in busy.demotions] == ["nohugepage"]
    assert act.damos_totals == {"nohugepage": {"nr_applied": 1, "sz_applied": HUGE_PAGE_BYTES}}


def test_a_hugepage_mark_that_splits_a_collapsed_range_gets_it_collapsed_again(
        child: Child) -> None:
    first, second = child.start, child.start + HUGE_PAGE_BYTES
    both = AddrRange(first, second + HUGE_PAGE_BYTES)
    marked = _decision(huge_marks=[both])
    with actuate.Target.open(child.pid) as target, procfs.ProcessFiles(child.pid) as files:
        act = actuate.Actuator(target, files, _SchemeHost())
        promoted = act.apply(_decision(promote=[first, second], huge_marks=[both]), 1.0)
        assert [r.error for r in promoted.collapses] == [None, None]
        # The mark is committed but the kdamond has not applied it yet: nothing to repair.
        assert act.apply(marked, 2.0).recollapses == []
        # The kdamond madvises region by region; a DAMON region boundary 1 MiB into `first`
        # splits the VMA there, and with it the PMD: the huge page is PTE-mapped now.
        child.madvise(first, HUGE_PAGE_BYTES // 2, MADV_HUGEPAGE)
        child.madvise(first + HUGE_PAGE_BYTES // 2, 3 * HUGE_PAGE_BYTES // 2, MADV_HUGEPAGE)
        assert files.huge_regions_in([both]) == [huge_range(second)]
        repaired = act.apply(marked, 3.0)
        assert [(r.action, r.start, r.error) for r in repaired.recollapses] == [
            ("recollapse", first, None)]
        assert repaired.outcomes == {}  # promoted already: nothing new for the policy
        assert files.huge_bytes_in([both]) == both.size
        assert files.flagged_in([both], "hg") == [both]
        # Settled: the mark changes no flag any more, so nothing is watched or re-read.
        assert act.unsettled == {} and act.apply(marked, 4.0).recollapses == []
