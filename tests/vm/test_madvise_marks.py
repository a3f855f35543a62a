"""Under THP `madvise` the agent's DAMOS schemes mark the hot set MADV_HUGEPAGE and memory gone
cold MADV_NOHUGEPAGE, read back from the kernel: VmFlags `hg` / `nh` and AnonHugePages in
/proc/PID/smaps (inside the test VM).

The workload is `phases` with two 256 MiB regions; the test, not a timer, moves the hot set
(SIGUSR1 ends a phase) once it has seen what it waits for, and every wait is on a kernel-visible
condition with a deadline far above what it takes in a loaded TCG VM. Nothing here asks how soon:
a slow DAMON only makes the test longer.

History (#14): this check failed in loaded runs and was opt-in (tests/vm/madvise_marks.py). The
cause was a real bug, not only emulation timing: DAMOS madvises one DAMON region at a time, so
the first MADV_HUGEPAGE on a just-collapsed range split its VMA at DAMON's region boundaries
(4 KiB granularity), which split the huge page's PMD mapping. Region 0 stalled at 84 % huge
with 99 % of it VM_HUGEPAGE; 17 of its 18 missing 2 MiB ranges were PTE-mapped THPs
(/proc/kpageflags). The more regions DAMON had split the buffer into, the more PMDs were lost.
The actuator now re-collapses ranges the mark split (actuate.py): 12 to 38 of them per run of
this test (`summary.recollapse`). On top of that the fixed 60 s phases made the cold-range check
race the workload's own clock.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from damon_hp import procfs
from damon_hp.ranges import AddrRange
from test_agent import (  # noqa: F401  (fixtures are found by name in this module)
    DAMON_HP,
    ROOT,
    THP_ENABLED,
    no_kdamond_left,
    stop,
    thp_never,
)

REGION = "256M"
# A deadline only matters when something is broken. Measured 2026-11-23 (17 passing runs): each
# wait took 6-19 s with one host core kept busy, up to 49 s with the 2-core host at load 12
# (four other test VMs beside it).
DEADLINE_S = 240.0
POLL_S = 1.0  # each poll reads smaps, which walks page tables the agent and workload also need
SHARE = 0.9
# The marks follow the hot set the agent saw, which under emulation lags its huge pages by a few
# ranges: a loaded fresh-clone run ended phase 1 with region 1 90.6 % huge but 89.1 % marked
# (2026-11-25, four suites on the host). Marks are judged at 80 %; a missing mark reads 0 %.
MARKED = 0.8
IDLE_HUGE_MAX = 0.3  # see the phase-0 check
DEMOTE_AFTER_S = 4


def flag_share(pid: int, rng: tuple[int, int], flag: str) -> float:
    """Share of `rng` in VMAs carrying VmFlag `flag` (madvise splits VMAs at its edges)."""
    lo, hi = rng
    inside = sum(max(0, min(m.end, hi) - max(m.start, lo))
                 for m in procfs.read_smaps(pid) if flag in m.vm_flags)
    return inside / (hi - lo)


def huge_share(pid: int, rng: tuple[int, int]) -> float:
    lo, hi = rng
    return procfs.huge_bytes_in(pid, [AddrRange(lo, hi)]) / (hi - lo)


def state(pid: int, rng: tuple[int, int]) -> dict[str, float]:
    return {"huge": round(huge_share(pid, rng), 3), "hg": round(flag_share(pid, rng, "hg"), 3),
            "nh": round(flag_share(pid, rng, "nh"), 3)}


def wait_until(cond: Callable[[], bool], deadline_s: float) -> float | None:
    """Seconds until `cond()` held, or None if it did not within `deadline_s`."""
    t0 = time.monotonic()
    while True:
        if cond():
            return time.monotonic() - t0
        if time.monotonic() - t0 > deadline_s:
            return None
        time.sleep(POLL_S)


def digest(report_path: Path, rng: tuple[int, int]) -> str:
    """The agent's timeline and its actions on `rng`, for failure messages."""
    if not report_path.exists():
        return "(no JSON report)"
    d = json.loads(report_path.read_text())
    lines = [f"{e['monotonic_s']:.1f} hot={e['hot_bytes'] >> 20}M "
             f"huge={(e['huge_bytes'] or 0) >> 20}M {e['actions']}" for e in d["timeline"]]
    lines += [f"{a['t_s']} {a['action']} {a['start']:#x} {a['error']}" for a in d["actions"]
              if "start" in a and rng[0] <= a["start"] < rng[1]]
    lines += [f"{a['t_s']} {a['action']} {a.get('error')}" for a in d["actions"]
              if "start" not in a]
    return "\n".join(lines)


@pytest.mark.timeout(900)  # a hung readline must not hold the VM until the tier's timeout
def test_under_thp_madvise_promoted_memory_is_marked_hugepage_and_cold_memory_nohugepage(
    tmp_path, record_testsuite_property,
) -> None:
    THP_ENABLED.write_text("madvise")  # thp_never restores the original mode afterwards
    out = tmp_path / "out.json"
    log = tmp_path / "agent.log"
    proc = subprocess.Popen(
        [DAMON_HP, "run", "--progress-s", "5", "--json", str(out),
         "--demote-after", str(DEMOTE_AFTER_S), "--",
         str(ROOT / "workloads/bin/phases"), "--regions", "2", "--region-size", REGION,
         "--phase-seconds", "3600", "--phases", "2"],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    try:
        line = proc.stdout.readline()
        if not line:  # the agent ended before starting the workload: say why
            proc.wait(timeout=60)
            pytest.fail(f"damon-hp run exited {proc.returncode} before phases started:\n"
                        f"{log.read_text()}")
        layout = json.loads(line)
        pid = layout["pid"]
        first, second = ((r["start"], r["end"]) for r in layout["regions"])
        assert json.loads(proc.stdout.readline())["region"] == 0

        # Phase 0: region 0 is read at random, region 1 idle. Region 0 is collapsed and marked
        # MADV_HUGEPAGE, and stays huge under its mark (the mark must not split it again).
        took0 = wait_until(lambda: huge_share(pid, first) >= SHARE
                           and flag_share(pid, first, "hg") >= MARKED, DEADLINE_S)
        hot0, cold0 = state(pid, first), state(pid, second)
        if took0 is None:
            pytest.fail(f"region 0 not huge and VM_HUGEPAGE while hot: {hot0}\n"
                        f"{digest(out, first)}\n{log.read_text()}")
        # The idle region carries no mark: the agent marks what it promotes, nothing else. Its
        # huge share is bounded looser: promoting at the first steady reading (issue 21), a
        # DAMON region not yet split at the mappings' boundary and 90 % inside the idle region
        # lends the hot region's accesses to it (policy mapping_share_pct): 16.4 % of it was
        # collapsed in one fresh-clone run of 2026-11-25, 0 % in the other. A known cost of the
        # faster rule, to be closed by a stricter share once it is measured (issue 21).
        assert cold0["hg"] <= 1 - SHARE and cold0["huge"] <= IDLE_HUGE_MAX, (
            cold0, digest(out, second))

        os.kill(pid, signal.SIGUSR1)  # phase 1: the hot set moves to region 1
        assert json.loads(proc.stdout.readline())["region"] == 1

        # Phase 1: region 1 is promoted and marked in turn; region 0, idle while region 1's huge
        # pages read hot, is marked MADV_NOHUGEPAGE after --demote-after (and loses `hg`).
        def moved() -> bool:
            return (flag_share(pid, first, "nh") >= MARKED
                    and flag_share(pid, first, "hg") <= 1 - SHARE
                    and huge_share(pid, second) >= SHARE
                    and flag_share(pid, second, "hg") >= MARKED)

        took1 = wait_until(moved, DEADLINE_S)
        cold1, hot1 = state(pid, first), state(pid, second)
    finally:
        stop(proc)
    err = log.read_text()
    # In junit.xml of the VM run: how long each wait took, to see the margin to DEADLINE_S.
    record_testsuite_property("phase0", {"took_s": round(took0, 1), "region0": hot0,
                                         "region1": cold0})
    record_testsuite_property("phase1", {"took_s": took1 and round(took1, 1), "region0": cold1,
                                         "region1": hot1})
    assert took1 is not None, (f"after the switch region 0 is {cold1} (want nh), region 1 is "
                               f"{hot1} (want huge and hg)\n{digest(out, first)}\n{err}")
    assert proc.returncode == 0, err  # phases exits 0 on SIGTERM, passed through
    d = json.loads(out.read_text())
    s = d["summary"]
    assert s["thp_mode"] == "madvise"
    assert s["demotions"] >= 1
    record_testsuite_property("recollapse", s["recollapse"])
