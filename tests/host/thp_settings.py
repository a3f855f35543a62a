"""The host's global THP and khugepaged settings, for tests that prove damon-hp leaves them
alone (khugepaged's counters, full_scans and pages_collapsed, move by themselves and are left
out), and `require_thp_mode` for tests that can only show their behaviour under some modes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from damon_hp import procfs

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


def require_thp_mode(*modes: str, why: str) -> None:
    """Fail, naming the mode and why, unless the host's THP mode is one of `modes`.

    Never a skip (tests/README.md): on a machine set up by `make setup` every host test runs.
    Neither the tests nor damon-hp change the global mode on a host (the brief forbids it); a
    test that cannot show its behaviour under this mode says so as a failure instead.
    """
    mode = procfs.thp_mode()
    if mode not in modes:
        pytest.fail(f"this test needs the host's THP mode to be {' or '.join(modes)} ({why}); "
                    f"this host's is {mode}. damon-hp and its tests never "
                    f"change it: set it yourself (Debian's default is madvise) or run on a host "
                    f"that has it", pytrace=False)
