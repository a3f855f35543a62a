"""Which MADV_COLLAPSE errors of a run a host test may accept: the kernel's "not now", proven
from /proc/vmstat, never a refusal.

madvise_collapse() (mm/khugepaged.c, 6.18) turns its last scan result into an errno
(madvise_collapse_errno):
  - ENOMEM: no huge page could be allocated (SCAN_ALLOC_HUGE_PAGE_FAIL); alloc_charge_folio
    counts each such failure in thp_collapse_alloc_failed. madvise also answers ENOMEM for a
    range that is not mapped, which would be damon-hp's bug: only as many ENOMEM as the kernel
    counted failed allocations over the run are accepted.
  - EAGAIN, EBUSY: a page was locked or off its LRU, or a memcg charge failed; a later try may
    pass.
  - EINVAL: a refusal (a VMA THP may not back, thp_vma_allowable_order), and also the default
    for results the loop only skips, such as a PTE that was a migration entry when read
    (SCAN_PTE_NON_PRESENT), which compaction leaves for a moment on a fragmented machine.
    Accepted only where the caller allows it, pages migrated during the run, and some collapse
    of the same run succeeded: a refusal refuses every range of its VMA.
CI on a fragmented host (stop 28, 2026-11-25) saw {'ENOMEM': 16, 'EINVAL': 1} beside 46
collapses of a 256 MiB hot buffer under PR_THP_DISABLE_EXCEPT_ADVISED.
"""

from __future__ import annotations

from dataclasses import dataclass

_COUNTERS = ("thp_collapse_alloc_failed", "pgmigrate_success")


@dataclass(frozen=True)
class Vmstat:
    alloc_failed: int
    migrated: int


def vmstat() -> Vmstat:
    """The two /proc/vmstat counters the errors are checked against, now."""
    with open("/proc/vmstat") as f:
        values = dict(line.split() for line in f)
    return Vmstat(*(int(values[name]) for name in _COUNTERS))


def unexplained(collapse: dict, before: Vmstat, after: Vmstat, *,
                einval_may_be_migration: bool = True) -> dict[str, int]:
    """The errors of a report's collapse summary ({"ok": N, "errors": {name: count}}) that the
    kernel's counters do not explain; {} when every failure was the kernel's "not now"."""
    left = dict(collapse["errors"])
    for transient in ("EAGAIN", "EBUSY"):
        left.pop(transient, None)
    if "ENOMEM" in left:
        left["ENOMEM"] -= after.alloc_failed - before.alloc_failed
    if ("EINVAL" in left and einval_may_be_migration and collapse["ok"] > 0
            and after.migrated > before.migrated):
        del left["EINVAL"]
    return {name: n for name, n in left.items() if n > 0}
