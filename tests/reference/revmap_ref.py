"""Slow page-by-page reference for the paddr reverse map (damon/revmap.py), for tests only.

Each resident page looks its frame up in the physical regions one bisect at a time, the
obvious way; the product vectorises per run of consecutive frames, so agreement shows the
shortcut loses nothing. Used by the unit tier (recorded snapshot) and the host tier (live one).

    page_by_page(snapshot, frames, share_pct=50.0)
        -> {2 MiB window start: (resident, monitored, accessed pages, share level)}
"""

from __future__ import annotations

from bisect import bisect_right

PAGE_BYTES = 4096
HUGE_PAGE_BYTES = 2 << 20
PM_PRESENT = 1 << 63
PM_PFN_MASK = (1 << 55) - 1


def page_by_page(phys, frames, share_pct: float = 50.0) -> dict[int, tuple[int, int, int, int]]:
    """The share level is the nr_accesses reached by share_pct % of the window's 512 pages
    (0 when fewer monitored pages exist), as the reverse map defines it."""
    regions = sorted(phys.regions, key=lambda r: r.start)
    starts = [r.start for r in regions]
    per_window: dict[int, list[int | None]] = {}
    for run in frames.runs:
        for i, entry in enumerate(run.entries):
            if not entry & PM_PRESENT:
                continue
            addr = (entry & PM_PFN_MASK) * PAGE_BYTES
            k = bisect_right(starts, addr) - 1
            acc = regions[k].nr_accesses if k >= 0 and addr < regions[k].end else None
            vaddr = run.start + i * PAGE_BYTES
            per_window.setdefault(vaddr - vaddr % HUGE_PAGE_BYTES, []).append(acc)
    need = share_pct / 100 * (HUGE_PAGE_BYTES // PAGE_BYTES)
    out = {}
    for window, accs in per_window.items():
        known = sorted((a for a in accs if a is not None), reverse=True)
        level = next((a for n, a in enumerate(known, 1) if n >= need), 0)
        out[window] = (len(accs), len(known), sum(1 for a in known if a), level)
    return out
