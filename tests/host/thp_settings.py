"""The host's global THP and khugepaged settings, for tests that prove damon-hp leaves them
alone. khugepaged's counters (full_scans, pages_collapsed) move by themselves and are left out.
"""

from __future__ import annotations

from pathlib import Path

THP = Path("/sys/kernel/mm/transparent_hugepage")
COUNTERS = {"full_scans", "pages_collapsed"}


def thp_settings() -> dict[str, str]:
    out = {}
    for p in [THP / "enabled", THP / "defrag", *sorted((THP / "khugepaged").glob("*"))]:
        if p.name in COUNTERS:
            continue
        try:
            out[p.name] = p.read_text().strip()
        except OSError:
            continue
    return out
