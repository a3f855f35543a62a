"""What an agent run did, as a summary table for people and JSON (with a timeline) for scripts.

Pure formatting: the agent fills a `RunReport`; nothing here reads /proc or DAMON. A value the
agent could not measure is None and prints as `n/a`, never as 0.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from damon_hp import stagecpu

if TYPE_CHECKING:
    from damon_hp.actuate import Applied

REPORT_VERSION = 1


@dataclass
class CollapseTally:
    """Collapses attempted in some period: how many, how many bytes, why the others failed."""

    tried: int = 0
    ok: int = 0
    bytes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the agent's CPU in those calls (the kernel's copy)
    already_huge: int = 0  # chosen ranges found PMD-mapped already: adopted, not collapsed

    def add(self, ok: bool, nbytes: int, error: str | None, seconds: float,
            cpu_seconds: float = 0.0) -> None:
        self.tried += 1
        self.seconds += seconds
        self.cpu_seconds += cpu_seconds
        if ok:
            self.ok += 1
            self.bytes += nbytes
        else:
            key = error or "unknown"
            self.errors[key] = self.errors.get(key, 0) + 1

    def revive(self, nbytes: int, error: str) -> None:
        """A collapse counted as failed with `error` took after all (a DAMOS collapse the
        kdamond applied after the agent gave the range up): one failure becomes a success."""
        if self.errors.get(error, 0) <= 0:
            return
        self.errors[error] -= 1
        if not self.errors[error]:
            del self.errors[error]
        self.ok += 1
        self.bytes += nbytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "tried": self.tried,
            "ok": self.ok,
            "bytes": self.bytes,
            "errors": dict(sorted(self.errors.items())),
            "seconds": round(self.seconds, 6),
            "cpu_seconds": round(self.cpu_seconds, 6),
            "already_huge": self.already_huge,
        }


@dataclass
class TimelineEntry:
    """One snapshot: what DAMON showed, what the target held, what the agent did."""

    t_s: float  # seconds since monitoring started
    monotonic_s: float  # CLOCK_MONOTONIC when the snapshot was read (to line up with others)
    nr_regions: int
    hot_bytes: int  # bytes of regions above the hot thresholds
    hot_huge_bytes: int | None  # of those, bytes mapped by huge pages
    huge_bytes: int | None  # the target's AnonHugePages
    rss_bytes: int | None
    promoted_bytes: int  # bytes the agent holds promoted after this snapshot
    collapse: CollapseTally = field(default_factory=CollapseTally)
    planned: int = 0  # ranges the policy chose to promote at this snapshot
    demoted: int = 0
    held_by_budget: int = 0
    held_by_rate: int = 0
    held_by_residency: int = 0  # ready ranges too sparse to collapse (policy rule 4)
    schemes_changed: bool = False
    monitored_share: float | None = None  # physical sources: see RunReport.monitored_share
    unsteady: int = 0  # hot ranges whose reading was withheld: they gained resident pages
    stage_cpu_s: float | None = None
    """the pipeline's CPU in its stages (summary.monitoring_cpu_by_stage, summed) from the start
    to this snapshot, collapse copies left out: its rise between two entries is what watching
    cost over that stretch, without the start-up"""
    stage_cpu_by_stage_s: dict[str, float] | None = None
    """the same, stage by stage (summary.monitoring_cpu_by_stage as of this snapshot): which
    stage a stretch's cost went to (experiments/cost-phases.py)"""
    source_regions: int | None = None
    """regions in the aggregation DAMON gave (a passive source's: the foreign kdamond's, of
    physical memory), which the event stream's and the reverse map's CPU grow with"""
    frame_extents: int | None = None
    """physical sources: the target's runs of consecutive frames, which the reverse map looks
    up at every aggregation (more where physical memory is fragmented)"""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["t_s"] = round(self.t_s, 3)
        d["monotonic_s"] = round(self.monotonic_s, 3)
        d["collapse"] = self.collapse.to_dict()
        d["actions"] = {
            "collapse": d.pop("collapse"),
            "planned": d.pop("planned"),
            "demote": d.pop("demoted"),
            "held_by_budget": d.pop("held_by_budget"),
            "held_by_rate": d.pop("held_by_rate"),
            "held_by_residency": d.pop("held_by_residency"),
            "schemes_changed": d.pop("schemes_changed"),
        }
        return d


@dataclass
class RunReport:
    """Everything the summary table and the JSON report show."""

    mode: str  # run | attach
    target_pid: int
    command: list[str]
    kernel: str
    thp_mode: str
    options: dict[str, Any] = field(default_factory=dict)
    stopped_by: str = ""
    exit_code: int | None = None  # the target's, in run mode
    wall_s: float = 0.0
    target_cpu_s: float | None = None
    agent_cpu_s: float | None = None
    kdamond_cpu_s: float | None = None
    kdamond_pid: int | None = None
    source: dict[str, Any] = field(default_factory=dict)
    """the access source: name, why it was chosen, its kdamond, intervals, reader, limits"""
    snapshots: int = 0
    empty_snapshots: int = 0
    unsteady_readings: int = 0
    """hot 2 MiB range readings not used: the range gained resident pages in that aggregation
    (a page being faulted in reads as accessed)"""
    pagemap_reads: dict[str, int] | None = None
    """physical sources: ranges whose pagemap entries were read, reused (no frame moved), and
    2 MiB windows re-read inside otherwise unchanged ranges, and windows re-read because they
    read hot after frames moved (frame_reader.FrameReader)"""
    monitoring_cpu_by_stage: dict[str, float] | None = None
    """the agent thread's CPU per pipeline stage (stagecpu.py), the collapses' copies not
    included: where the monitoring CPU goes"""
    monitored_share: float | None = None
    """physical sources: share of the target's resident pages in the physical memory the
    kdamond monitors, at the last snapshot (the rest is invisible to damon-hp)"""
    snapshot_errors: int = 0
    scheme_errors: int = 0
    collapse: CollapseTally = field(default_factory=CollapseTally)
    recollapse: CollapseTally = field(default_factory=CollapseTally)
    """promoted ranges collapsed again after their MADV_HUGEPAGE mark split the PMD"""
    demotions: int = 0
    demoted_bytes: int = 0
    peak_huge_bytes: int | None = None
    final_huge_bytes: int | None = None
    peak_rss_bytes: int | None = None
    final_rss_bytes: int | None = None
    peak_pte_bytes: int | None = None
    final_pte_bytes: int | None = None
    minflt: int | None = None
    majflt: int | None = None
    hot_bytes: int | None = None  # at the last snapshot that saw a hot set (observe_hot)
    hot_huge_bytes: int | None = None
    damos: dict[str, dict[str, int]] = field(default_factory=dict)
    """per DAMOS action of our schemes: regions (nr_applied) and bytes (sz_applied) the kdamond
    applied it to, summed over every commit (re-applied each interval, so bytes repeat)"""
    extra: dict[str, Any] = field(default_factory=dict)  # --perf / --trace results
    timeline: list[TimelineEntry] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)  # every action, one by one
    notes: list[str] = field(default_factory=list)

    @property
    def coverage(self) -> float | None:
        """Share of the bytes DAMON last saw hot (the last snapshot with a hot set) that are
        mapped by huge pages."""
        if self.hot_bytes is None or self.hot_huge_bytes is None or self.hot_bytes == 0:
            return None
        return self.hot_huge_bytes / self.hot_bytes

    def observe_hot(self, hot_bytes: int, hot_huge_bytes: int | None) -> None:
        """Fold one snapshot's hot set and its huge bytes in. An empty hot set replaces only
        another empty one: a workload's last aggregations often see nothing hot (its work is
        done, it writes its results or exits), and the summary's coverage then read n/a
        however huge the hot set had been a moment before."""
        if hot_bytes or not self.hot_bytes:
            self.hot_bytes, self.hot_huge_bytes = hot_bytes, hot_huge_bytes

    def observe_memory(
        self, huge: int | None, rss: int | None, pte: int | None, final: bool = True
    ) -> None:
        """Fold one reading of the target's memory into the peak values, and with `final`
        into the final ones (only snapshots set those: a reading between them may catch the
        target's exit unmapping its memory)."""

        def peak(old: int | None, new: int | None) -> int | None:
            if new is None:
                return old
            return new if old is None else max(old, new)

        self.peak_huge_bytes = peak(self.peak_huge_bytes, huge)
        self.peak_rss_bytes = peak(self.peak_rss_bytes, rss)
        self.peak_pte_bytes = peak(self.peak_pte_bytes, pte)
        if not final:
            return
        if huge is not None:
            self.final_huge_bytes = huge
        if rss is not None:
            self.final_rss_bytes = rss
        if pte is not None:
            self.final_pte_bytes = pte

    def record_applied(self, applied: Applied, t_s: float, entry: TimelineEntry) -> None:
        """Fold what the actuator did after one snapshot into the totals and the action log."""
        for r in (*applied.damos_collapses, *applied.collapses):
            if r.action == "damos_collapse_late":  # counted as NOT_COLLAPSED before
                self.collapse.revive(r.bytes_done, "NOT_COLLAPSED")
                continue
            self.collapse.add(r.error is None, r.bytes_done, r.error, r.seconds,
                              r.cpu_seconds)
            entry.collapse.add(r.error is None, r.bytes_done, r.error, r.seconds,
                               r.cpu_seconds)
        for r in applied.recollapses:
            self.recollapse.add(r.error is None, r.bytes_done, r.error, r.seconds,
                              r.cpu_seconds)
        entry.collapse.already_huge += len(applied.adopted)
        self.collapse.already_huge += len(applied.adopted)
        self.demotions += len(applied.demotions)
        self.demoted_bytes += sum(r.bytes_done for r in applied.demotions)
        if applied.commit is not None:
            entry.schemes_changed = applied.commit.error is None
            self.scheme_errors += applied.commit.error is not None
        self.actions.extend({"t_s": round(t_s, 3), **rec} for rec in applied.action_records())

    def summary_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "target_pid": self.target_pid,
            "command": self.command,
            "kernel": self.kernel,
            "thp_mode": self.thp_mode,
            "stopped_by": self.stopped_by,
            "exit_code": self.exit_code,
            "wall_s": round(self.wall_s, 3),
            "target_cpu_s": _round(self.target_cpu_s),
            "agent_cpu_s": _round(self.agent_cpu_s),
            "monitoring_cpu_s": _round(monitoring_cpu_s(self)),
            "monitoring_cpu_by_stage": self.monitoring_cpu_by_stage,
            "kdamond_cpu_s": _round(self.kdamond_cpu_s),
            "kdamond_pid": self.kdamond_pid,
            "source": self.source,
            "snapshots": self.snapshots,
            "empty_snapshots": self.empty_snapshots,
            "unsteady_readings": self.unsteady_readings,
            "pagemap_reads": self.pagemap_reads,
            "snapshot_errors": self.snapshot_errors,
            "scheme_errors": self.scheme_errors,
            "promotions": self.collapse.ok,
            "promoted_bytes": self.collapse.bytes,
            "collapse": self.collapse.to_dict(),
            "recollapse": self.recollapse.to_dict(),
            "demotions": self.demotions,
            "demoted_bytes": self.demoted_bytes,
            "peak_anon_huge_bytes": self.peak_huge_bytes,
            "final_anon_huge_bytes": self.final_huge_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "final_rss_bytes": self.final_rss_bytes,
            "peak_pte_bytes": self.peak_pte_bytes,
            "final_pte_bytes": self.final_pte_bytes,
            "minor_faults": self.minflt,
            "major_faults": self.majflt,
            "hot_bytes": self.hot_bytes,
            "monitored_share": _round(self.monitored_share),
            "hot_huge_bytes": self.hot_huge_bytes,
            "hot_coverage": _round(self.coverage, 4),
            "damos": self.damos,
            **({"extra": self.extra} if self.extra else {}),
            **({"notes": self.notes} if self.notes else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": REPORT_VERSION,
            "options": self.options,
            "summary": self.summary_dict(),
            "timeline": [e.to_dict() for e in self.timeline],
            "actions": self.actions,
        }


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def fmt_seconds(s: float | None) -> str:
    return "n/a" if s is None else f"{s:.2f} s"


def fmt_pct(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{100 * ratio:.1f} %"


def monitoring_cpu_s(r: RunReport) -> float | None:
    """The agent's CPU less the kernel's copies inside MADV_COLLAPSE, which are the collapses'
    cost, not the monitoring's."""
    if r.agent_cpu_s is None:
        return None
    return max(0.0, r.agent_cpu_s - r.collapse.cpu_seconds - r.recollapse.cpu_seconds)


def _agent_cpu(r: RunReport) -> str:
    mon = monitoring_cpu_s(r)
    if mon is None or not r.wall_s:
        return fmt_seconds(r.agent_cpu_s)
    return (f"{fmt_seconds(r.agent_cpu_s)}: monitoring {fmt_seconds(mon)} "
            f"({fmt_pct(mon / r.wall_s)} of a core), collapses "
            f"{fmt_seconds(r.collapse.cpu_seconds + r.recollapse.cpu_seconds)}")


# What MADV_COLLAPSE's errno means (madvise_collapse_errno, mm/khugepaged.c), for the summary;
# UNMAPPED is actuate's, not the kernel's.
COLLAPSE_ERRNO_MEANING = {
    "ENOMEM": "no free 2 MiB page: memory fragmented or short",
    "EAGAIN": "pages busy for a moment",
    "EBUSY": "memory cgroup charge failed",
    "EINVAL": "range not eligible, or its pages were migrating",
    "UNMAPPED": "the target unmapped the range first (a free, or its exit)",
    "ESRCH": "the target exited",
}


def format_collapse_errors(errors: dict[str, int]) -> str:
    """'ENOMEM x2 (no free 2 MiB page: ...), EAGAIN x1 (...)', or 'none'."""
    return ", ".join(f"{k} x{v}" + (f" ({COLLAPSE_ERRNO_MEANING[k]})"
                                    if k in COLLAPSE_ERRNO_MEANING else "")
                     for k, v in sorted(errors.items())) or "none"


def format_table(r: RunReport) -> str:
    """The human summary printed at exit."""
    failures = format_collapse_errors(r.collapse.errors)
    target = f"pid {r.target_pid}" + (f": {' '.join(r.command)}" if r.command else "")
    stopped = r.stopped_by + (f" (exit code {r.exit_code})" if r.exit_code is not None else "")
    snaps = f"{r.snapshots}" + (f", {r.empty_snapshots} empty" if r.empty_snapshots else "") + (
        f", {r.snapshot_errors} failed reads" if r.snapshot_errors else "") + (
        f"; {r.unsteady_readings} readings of hot 2 MiB ranges withheld while they were "
        "faulted in" if r.unsteady_readings else "")
    c = r.collapse
    rows = [
        ("target", target),
        ("kernel, THP mode", f"{r.kernel}, {r.thp_mode}"),
        ("access source", describe_source(r.source)),
        ("stopped by", stopped),
        ("wall time", fmt_seconds(r.wall_s)),
        ("target CPU time", fmt_seconds(r.target_cpu_s)),
        ("agent CPU time", _agent_cpu(r)),
        *([("monitoring CPU by stage", stagecpu.describe(r.monitoring_cpu_by_stage, r.wall_s))]
          if r.monitoring_cpu_by_stage else []),
        ("kdamond CPU time", fmt_seconds(r.kdamond_cpu_s)),
        ("snapshots", snaps),
        ("promotions", f"{c.ok} ({fmt_bytes(c.bytes)}) in {fmt_seconds(c.seconds)}"
         + (f"; {c.already_huge} chosen ranges were huge already" if c.already_huge else "")),
        ("failed collapses", f"{c.tried - c.ok}: {failures}"),
        *([("re-collapsed after marks", f"{r.recollapse.ok} of {r.recollapse.tried} (PMDs a "
            "MADV_HUGEPAGE mark split)")] if r.recollapse.tried else []),
        ("demotions", f"{r.demotions} ({fmt_bytes(r.demoted_bytes)})"),
        ("AnonHugePages peak/final", _pair(r.peak_huge_bytes, r.final_huge_bytes)),
        ("RSS peak/final", _pair(r.peak_rss_bytes, r.final_rss_bytes)),
        ("page tables peak/final", _pair(r.peak_pte_bytes, r.final_pte_bytes)),
        ("minor/major faults", f"{_n(r.minflt)} / {_n(r.majflt)}"),
        ("hot set (last seen)", fmt_bytes(r.hot_bytes)),
        ("hot-set coverage", f"{fmt_pct(r.coverage)} of hot bytes on huge pages"),
        *([("memory watched", f"{fmt_pct(r.monitored_share)} of the target's resident pages "
            "lie in the physical memory the kdamond monitors; the rest is invisible")]
          if r.monitored_share is not None else []),
    ]
    rows += _extra_rows(r.extra)
    width = max(len(k) for k, _ in rows)
    lines = ["damon-hp summary"] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines)


def describe_source(src: dict[str, Any]) -> str:
    """'passive: kdamond 0 (pid 77, paddr, not ours), sample 500 ms, aggregation 5 s, event
    stream' -- one line naming where the access data comes from."""
    if not src:
        return "n/a"
    parts = [f"{src.get('name')}: {src.get('kdamond') or 'no kdamond'}"]
    if src.get("sample_us") and src.get("aggr_us"):
        parts.append(f"sample {src['sample_us'] / 1000:g} ms, "
                     f"aggregation {src['aggr_us'] / 1000:g} ms")
    if src.get("reader"):
        parts.append(str(src["reader"]))
    return ", ".join(parts)


def _extra_rows(extra: dict[str, Any]) -> list[tuple[str, str]]:
    """Rows for --perf (one per event; n/a with the reason, never 0) and --trace."""
    rows = []
    perf = extra.get("perf")
    if isinstance(perf, dict):
        unavailable = perf.get("unavailable") or {}
        for event, value in (perf.get("events") or {}).items():
            shown = f"n/a ({unavailable.get(event) or 'not counted'})" if value is None else (
                f"{value:,}" if isinstance(value, int) else str(value))
            rows.append((f"perf {event}", shown))
    for key, value in sorted(extra.items()):
        if key != "perf":
            rows.append((key, _flat(value)))
    return rows


def _pair(a: int | None, b: int | None) -> str:
    return f"{fmt_bytes(a)} / {fmt_bytes(b)}"


def _n(x: int | None) -> str:
    return "n/a" if x is None else f"{x:,}"


def _flat(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_flat(v)}" for k, v in value.items())
    return str(value)


def format_progress(r: RunReport) -> str:
    """One status line for stderr during long runs."""
    e = r.timeline[-1] if r.timeline else None
    if e is None:
        return f"damon-hp: pid {r.target_pid}: waiting for the first DAMON snapshot"
    cov = None if not e.hot_bytes or e.hot_huge_bytes is None else e.hot_huge_bytes / e.hot_bytes
    return (
        f"damon-hp: {e.t_s:7.1f} s pid {r.target_pid}: {e.nr_regions} regions, "
        f"hot {fmt_bytes(e.hot_bytes)} ({fmt_pct(cov)} huge), "
        f"AnonHugePages {fmt_bytes(e.huge_bytes)}, "
        f"promoted {r.collapse.ok} ({fmt_bytes(r.collapse.bytes)}), demoted {r.demotions}"
        + (f"; only {fmt_pct(r.monitored_share)} of its memory is watched by the kdamond"
           if r.monitored_share is not None and r.monitored_share < 0.9 else "")
    )


def write_json(r: RunReport, path: str | os.PathLike[str]) -> None:
    """Write the report atomically, so a reader never sees half a file; a path that is not a
    regular file (/dev/stdout, a FIFO, /dev/full) is written in place, never replaced."""
    p = Path(path)
    text = json.dumps(r.to_dict(), indent=1) + "\n"
    if p.exists() and not p.is_file():
        with open(p, "w") as f:
            f.write(text)
        return
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
