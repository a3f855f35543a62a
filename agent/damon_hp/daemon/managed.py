"""One process damon-hpd manages: pinned by a pidfd, with its own pipeline (policy state,
actuator), what it holds against the budgets and what it did, for status records and --json.
"""

from __future__ import annotations

import time
from typing import Any

from damon_hp import actuate, frame_moves, policy, procfs
from damon_hp.daemon import selection
from damon_hp.daemon.reporting import log
from damon_hp.damon.model import Snapshot
from damon_hp.pipeline import ProcessPipeline
from damon_hp.ranges import AddrRange

THP_DISABLED_REASON = ("it turned THP off for itself (prctl PR_SET_THP_DISABLE, THP_enabled: 0 "
                       "in /proc/PID/status): the kernel refuses every collapse of its memory")


class Managed:
    """One managed process: pinned by a pidfd, with its own policy state and actuator."""

    def __init__(self, info: selection.ProcessInfo, rule: str, params: policy.PolicyParams,
                 target: actuate.Target, physical: bool) -> None:
        self.info = info
        self.pid = info.pid
        self.rule = rule
        self.target = target
        self.files = procfs.ProcessFiles(info.pid)
        self.pipeline = ProcessPipeline(target, self.files, params,
                                        actuate.Actuator(target, self.files, None),
                                        physical=physical)
        self.mappings: list[AddrRange] = []
        self.since = time.time()
        self.snapshots = 0
        self.collapses = 0
        self.collapsed_bytes = 0
        self.errors: dict[str, int] = {}
        self.held_by_budget = 0
        self.held_by_rule = 0
        self.hot_bytes = 0
        self.huge_bytes: int | None = None
        self.pending: tuple[Snapshot, policy.Decision] | None = None
        self.skipped: str | None = None
        """why this process gets no collapse (it disabled THP for itself), None while managed"""
        self.status_written: tuple[dict[str, Any], dict[str, Any], float] | None = None
        """its status record as last written, split (status_refresh.split: less its time, its
        figures), and when (time.monotonic)"""

    @property
    def state(self) -> policy.PolicyState:
        return self.pipeline.state

    @property
    def held_bytes(self) -> int:
        """What counts against the budgets: the ranges promoted, or the huge pages measured
        if more (a range the policy let go of stays huge: no split without a DAMOS mark)."""
        return max(self.state.promoted_bytes, self.huge_bytes or 0)

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "held_bytes": self.held_bytes, "rule": self.rule,
                "command": list(self.info.cmdline),
                "since": self.since, "snapshots": self.snapshots,
                "promotions": self.collapses, "promoted_bytes": self.state.promoted_bytes,
                "collapsed_bytes": self.collapsed_bytes, "collapse_errors": dict(self.errors),
                "held_by_budget": self.held_by_budget, "held_by_rule": self.held_by_rule,
                "hot_bytes": self.hot_bytes, "anon_huge_bytes": self.huge_bytes,
                "skipped": self.skipped}

    def measure_huge(self, applied: actuate.Applied | None = None) -> int | None:
        """Bytes of its private anonymous memory on PMD huge pages: one PAGEMAP_SCAN
        (smaps_rollup's AnonHugePages walks every page with its rmap counts, ~30 ms per 4 GiB),
        or, after a round that did nothing to it (`applied`), the frame reader's scan of this
        round (FrameReader.huge_parts)."""
        known = None if applied is None else self.pipeline.huge_as_read(applied, self.mappings)
        if known is not None:
            return sum(r.size for r in known)
        try:
            return sum(r.size for r in self.files.huge_regions_in(self.mappings))
        except procfs.PagemapScanUnsupported:
            return self.files.rollup().get("AnonHugePages")

    def close(self) -> None:
        self.files.close()
        self.target.close()
        frame_moves.forget_pid(self.pid)

    def skip_if_thp_disabled(self, status: procfs.Status) -> bool:
        """Skip a process that turned THP off for itself; say so once, and once when it ends."""
        if procfs.thp_disabled_by_process(status):
            if self.skipped is None:
                self.skipped = THP_DISABLED_REASON
                log(f"skipping pid {self.pid} (rule {self.rule}): {THP_DISABLED_REASON}; no "
                    "collapse is tried until it allows THP again. To have it managed, start it "
                    "from a process that has not disabled THP and without the program's own "
                    "opt-out, or have it use PR_THP_DISABLE_EXCEPT_ADVISED (Linux 6.18+), which "
                    "allows collapses")
            return True
        if self.skipped is not None:
            self.skipped = None
            log(f"managing pid {self.pid} (rule {self.rule}) again: it allows THP now")
        return False
