"""Which MADV_COLLAPSE errors of a run a host or vm test may accept: the kernel's "not now", proven
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
  - UNMAPPED (damon-hp's, not an errno): the range was gone when the agent read the target's
    maps after an ENOMEM or EINVAL. hotcold unmaps its buffers as it exits, so a batch the
    exit cuts fails so on every range left; ESRCH ends it once the process is gone. Accepted
    only where the caller says the target exits during the run, and only in the run's last
    batch of collapses: an unmap anywhere else would be the agent choosing memory that is not
    there.
CI on a fragmented host (stop 28, 2026-11-25) saw {'ENOMEM': 16, 'EINVAL': 1} beside 46
collapses of a 256 MiB hot buffer under PR_THP_DISABLE_EXCEPT_ADVISED. Stop 31's CI and a
fresh clone (2026-11-26) saw {'ENOMEM': 29} and {'EINVAL': 1, 'ENOMEM': 28, 'ESRCH': 1}, all in
the batch running when the test sent SIGTERM, ENOMEMs of 4 us each: ranges hotcold had just
unmapped, before the agent told them apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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


# The kernel's "not now" (module doc): a later try of the same range may pass.
NOT_NOW = ("EAGAIN", "EBUSY")


def until_settled(collapse: Callable[[list[int]], list[Any]], starts: Sequence[int], *,
                  tries: int = 5, pause_s: float = 0.2) -> list[Any]:
    """`collapse(starts)` (actuate.collapse bound to a target), the ranges that failed with
    NOT_NOW tried again, up to `tries` calls in all: one final result per start, in order. For
    a test that needs every range collapsed: a host run of the suite (2026-12-02) had one of 8
    ranges of an idle buffer fail EAGAIN, a page locked or off its LRU for a moment (this
    host's foreign kdamond runs a pageout scheme, which isolates pages; compaction migrates
    them). Any other error is returned at once, for the test to judge."""
    results = dict(zip(starts, collapse(list(starts)), strict=True))
    for _ in range(tries - 1):
        again = [start for start, r in results.items() if r.error in NOT_NOW]
        if not again:
            break
        time.sleep(pause_s)
        results.update(zip(again, collapse(again), strict=True))
    return [results[start] for start in starts]


# What a target's exit explains (actuate.collapse): UNMAPPED on the ranges it unmapped, ESRCH once
# it is gone.
EXIT_ERRORS = ("UNMAPPED", "ESRCH")


def exit_cut(actions: Sequence[dict]) -> dict[str, int]:
    """The EXIT_ERRORS among a report's actions that fall in its last batch of collapses, by
    name: the batch a target exiting while the agent runs may cut."""
    collapses = [a for a in actions if a["action"] == "collapse"]
    out: dict[str, int] = {}
    for a in collapses:
        if a["error"] in EXIT_ERRORS and a["t_s"] == collapses[-1]["t_s"]:
            out[a["error"]] = out.get(a["error"], 0) + 1
    return out


def unexplained(collapse: dict, before: Vmstat, after: Vmstat, *,
                einval_may_be_migration: bool = True,
                exit_actions: Sequence[dict] = ()) -> dict[str, int]:
    """The errors of a report's collapse summary ({"ok": N, "errors": {name: count}}) that the
    kernel's counters do not explain; {} when every failure was the kernel's "not now".

    `exit_actions`: the report's action records, given where the target exits while the agent
    runs; its `exit_cut` is then explained by the exit."""
    left = dict(collapse["errors"])
    for name, n in exit_cut(exit_actions).items():
        left[name] -= n
    for transient in NOT_NOW:
        left.pop(transient, None)
    if "ENOMEM" in left:
        left["ENOMEM"] -= after.alloc_failed - before.alloc_failed
    if ("EINVAL" in left and einval_may_be_migration and collapse["ok"] > 0
            and after.migrated > before.migrated):
        del left["EINVAL"]
    return {name: n for name, n in left.items() if n > 0}
