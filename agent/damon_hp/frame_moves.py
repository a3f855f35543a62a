"""Whether a process's page frames may have moved since a look: the kernel's counters that say
so, for FrameReader (frame_reader.py), which re-reads pagemap only when they moved.

    page_counters(pid) -> (moves | None, churn)    the machine's counters and the process's own
    with shared_machine_counters(): ...             one read of the machine's for a whole round
    with own_collapses(pid): ...                    our collapses of one process, told apart
    own_collapse_count(pid) -> int                  how many of those so far
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from damon_hp.procfs import read_stat

# Events that move a page to another frame: migration (compaction, NUMA balancing, demotion)
# and THP splits (which may remap zero-filled pages to the zero page, or follow a collapse
# within one interval).
_VMSTAT_MOVES = (b"pgmigrate_success", b"thp_split_page", b"thp_split_pmd")
# Events that change which pages of a process are present or PMD-mapped without moving a kept
# frame elsewhere or faulting: collapses (khugepaged's and MADV_COLLAPSE's alike:
# alloc_charge_folio, mm/khugepaged.c, counts every huge folio a collapse allocates), swap-out,
# reclaimed MADV_FREE pages.
_VMSTAT_CHURN = (b"thp_collapse_alloc", b"pswpout", b"pglazyfreed")


def page_counters(pid: int, *, attributed: bool = True
                  ) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """(moves, churn): the counters that say frames may have moved (None when they may move
    untracked: KSM runs), then those that say pages were unmapped or collapsed in place, with
    the target's resident pages (an unmap with no counter of its own, such as MADV_DONTNEED,
    lowers them). /proc/PID/stat's RSS is get_mm_rss, which reads the per-CPU counters without
    summing them: an unmap smaller than their batch on each CPU (32 pages per CPU here) may not
    show, and waits for the next full read.

    `attributed`: the collapse count leaves out what `own_collapses` counted for other
    processes. damon-hpd's collapses of one process made every other one walk its page tables
    at the next round (thp_collapse_alloc is machine-wide; 918 of 1,200 reads at 50 processes,
    docs/cost.md). A collapse by khugepaged during one of those calls is taken for ours and
    missed by the process it was in: that process's entries of the window stay stale until the
    next full read. A reader that may demote must not take that chance (FrameReader.eager)."""
    moving: tuple[int, ...] | None = None
    ksm, moves, churn = _machine_counters()
    stat = read_stat(pid)
    if not ksm:
        moving = (*moves, stat.minflt + stat.majflt)
    if attributed:
        churn = (churn[0] - _own_total[0] + _own_by_pid.get(pid, 0), *churn[1:])
    return moving, (*churn, stat.rss_pages)


# thp_collapse_alloc counted inside `own_collapses`, by target pid and in all.
_own_by_pid: dict[int, int] = {}
_own_total = [0]


@contextmanager
def own_collapses(pid: int) -> Iterator[None]:
    """Our collapse calls on process `pid` happen within it: the collapse count's rise over it
    is put down to `pid` alone (`page_counters`). MADV_COLLAPSE allocates each huge folio
    inside the call (collapse_huge_page -> alloc_charge_folio, mm/khugepaged.c), so nothing
    of it lands after."""
    before = _collapse_allocs()
    try:
        yield
    finally:
        rise = _collapse_allocs() - before
        _own_by_pid[pid] = _own_by_pid.get(pid, 0) + rise
        _own_total[0] += rise


def own_collapse_count(pid: int) -> int:
    """The collapses (huge folios allocated) `own_collapses` has put down to `pid` so far."""
    return _own_by_pid.get(pid, 0)


def forget_pid(pid: int) -> None:
    """`pid` exited: drop its count (what it collapsed stays in the total, as in the kernel's)."""
    _own_by_pid.pop(pid, None)


def _collapse_allocs() -> int:
    return _vmstat(_VMSTAT_CHURN[:1])[0]


def _vmstat(names: tuple[bytes, ...]) -> tuple[int, ...]:
    """The /proc/vmstat counters `names` (-1 for one this kernel lacks)."""
    with open("/proc/vmstat", "rb") as f:
        text = b"\n" + f.read()
    out = []
    for name in names:
        at = text.find(b"\n" + name + b" ")
        if at < 0:
            out.append(-1)
            continue
        value_at = at + len(name) + 2
        out.append(int(text[value_at:text.index(b"\n", value_at)]))
    return tuple(out)


# The machine's counters for a round of reads (`shared_machine_counters`), else None.
_round: list[tuple[bool, tuple[int, ...], tuple[int, ...]]] | None = None


@contextmanager
def shared_machine_counters() -> Iterator[None]:
    """Within it, the machine's counters are read once, by the first read, for every process
    read: damon-hpd reads all its processes' frames in one round before it acts on any, and
    parsing /proc/vmstat for each cost ~0.1 ms per process. A move after that one read shows
    at the next round, as a move during a page-table read does."""
    global _round
    _round = []
    try:
        yield
    finally:
        _round = None


def _machine_counters() -> tuple[bool, tuple[int, ...], tuple[int, ...]]:
    """(KSM runs, _VMSTAT_MOVES, _VMSTAT_CHURN)."""
    if _round:
        return _round[0]
    try:
        with open("/sys/kernel/mm/ksm/run", "rb") as f:
            ksm = f.read().strip() != b"0"
    except FileNotFoundError:
        ksm = False  # no KSM in this kernel
    counters = _vmstat(_VMSTAT_MOVES + _VMSTAT_CHURN)
    read = (ksm, counters[:len(_VMSTAT_MOVES)], counters[len(_VMSTAT_MOVES):])
    if _round is not None:
        _round.append(read)
    return read
