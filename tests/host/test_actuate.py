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
from damon_hp import actuate, procfs
from damon_hp.errors import EnvironmentProblem
from damon_hp.policy import HUGE_PAGE_BYTES, Span

CHILD = Path(__file__).with_name("memchild.py")


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

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child("16")
    yield c
    c.stop()


def anon_huge_bytes(pid: int, start: int, end: int) -> int:
    return procfs.smaps_in_ranges(procfs.read_smaps(pid), [(start, end)]).anon_huge_bytes


def test_collapse_makes_populated_aligned_buffer_anon_huge(child: Child) -> None:
    assert anon_huge_bytes(child.pid, child.start, child.end) == 0
    starts = list(range(child.start, child.end, HUGE_PAGE_BYTES))
    with actuate.Target.open(child.pid) as target:
        results = actuate.collapse(target, starts)
    assert [r.error for r in results] == [None] * len(starts)
    assert sum(r.bytes_done for r in results) == child.end - child.start
    assert all(r.seconds >= 0 for r in results)
    assert anon_huge_bytes(child.pid, child.start, child.end) == child.end - child.start
    assert procfs.huge_bytes_in(child.pid, [(child.start, child.end)]) == child.end - child.start


def test_collapse_touches_only_the_ranges_asked_for(child: Child) -> None:
    chosen = [child.start + HUGE_PAGE_BYTES, child.start + 3 * HUGE_PAGE_BYTES]
    with actuate.Target.open(child.pid) as target:
        results = actuate.collapse(target, chosen)
    assert all(r.error is None for r in results)
    assert procfs.huge_bytes_in(child.pid, [(child.start, child.end)]) == 2 * HUGE_PAGE_BYTES
    for start in chosen:
        assert procfs.huge_bytes_in(child.pid, [(start, start + HUGE_PAGE_BYTES)]) == (
            HUGE_PAGE_BYTES
        )
    untouched = child.start + 2 * HUGE_PAGE_BYTES
    assert procfs.huge_bytes_in(child.pid, [(untouched, untouched + HUGE_PAGE_BYTES)]) == 0


def test_collapse_of_nohugepage_memory_is_recorded_as_einval_not_raised() -> None:
    c = Child("4", "nohuge")
    try:
        with actuate.Target.open(c.pid) as target:
            results = actuate.collapse(target, [c.start])
        assert results[0].error == "EINVAL"
        assert results[0].bytes_done == 0
        assert anon_huge_bytes(c.pid, c.start, c.end) == 0
    finally:
        c.stop()


def test_collapse_of_unmapped_range_is_recorded_as_enomem(child: Child) -> None:
    maps = procfs.read_maps(child.pid)
    # Find a 2 MiB-aligned hole below the buffer that no mapping touches.
    hole = child.start - 64 * HUGE_PAGE_BYTES
    while any(m.start < hole + HUGE_PAGE_BYTES and hole < m.end for m in maps):
        hole -= HUGE_PAGE_BYTES
    with actuate.Target.open(child.pid) as target:
        (result,) = actuate.collapse(target, [hole])
    assert result.error == "ENOMEM"


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
    huge = [Span(0x200000, 0x600000)]
    nohuge = [Span(0x800000, 0xA00000), Span(0xC00000, 0xE00000)]
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
    assert [s.action for s in actuate.mark_schemes([], [Span(0, HUGE_PAGE_BYTES)])] == [
        "nohugepage"
    ]
