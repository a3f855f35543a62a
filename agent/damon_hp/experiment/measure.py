"""Per-run measurements: periodic samples of the workload's memory (smaps_rollup, status,
exact huge-page bytes of its ground-truth hot range), CPU time of the agent and of the kdamonds
that appeared during the run, and the reductions of those samples (peak, time-weighted mean,
time until the hot set was huge-page backed).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from damon_hp import procfs
from damon_hp.damon.status import running_kdamond_pids as kdamond_pids
from damon_hp.ranges import AddrRange, covered, huge_capable_bytes

HOT_HUGE_THRESHOLD = 0.9


def _all_mapped(maps: list[procfs.Vma], ranges: list[AddrRange]) -> bool:
    """Whether every byte of `ranges` lies in some mapping."""
    return covered(ranges, (m.range for m in maps))


def time_weighted_mean(samples: list[dict[str, Any]], key: str) -> float | None:
    """Mean of a sampled value, each sample holding until the next (sample-and-hold).

    The last sample has no successor and so no weight; with one sample, that sample's value.
    """
    pts = [(s["t"], s[key]) for s in samples if s.get(key) is not None]
    if not pts:
        return None
    if len(pts) == 1:
        return float(pts[0][1])
    area = sum(v * (t2 - t1) for (t1, v), (t2, _) in zip(pts, pts[1:], strict=False))
    span = pts[-1][0] - pts[0][0]
    if span <= 0:
        return float(pts[-1][1])
    return area / span


def peak(samples: list[dict[str, Any]], key: str) -> int | None:
    vals = [s[key] for s in samples if s.get(key) is not None]
    return max(vals) if vals else None


def first_time_at_least(samples: list[dict[str, Any]], key: str, threshold: float) -> float | None:
    for s in samples:
        v = s.get(key)
        if v is not None and v >= threshold:
            return float(s["t"])
    return None


def cpu_seconds(pid: int) -> float | None:
    try:
        return procfs.read_stat(pid).cpu_s
    except (procfs.ProcessGone, OSError, ValueError):
        return None


@dataclass
class Sampler:
    """Samples one workload process; `t` of a sample is seconds since the workload's exec."""

    pid: int
    t0: float
    agent_pid: int | None = None
    foreign_kdamonds: set[int] = field(default_factory=set)
    hot: list[AddrRange] | None = None
    hot_seen_s: float | None = None  # when the benchmark's hot range was first seen
    samples: list[dict[str, Any]] = field(default_factory=list)
    agent_cpu_s: float | None = None
    kdamond_cpu_s: dict[int, float] = field(default_factory=dict)
    hot_exact: bool = True

    def sample(self, now: float) -> None:
        s: dict[str, Any] = {"t": round(now - self.t0, 4)}
        try:
            roll = procfs.smaps_rollup(self.pid)
            st = procfs.read_status(self.pid)
        except (procfs.ProcessGone, OSError):
            return
        s["rss"] = roll.get("Rss")
        s["anon_huge"] = roll.get("AnonHugePages")
        s["swap"] = roll.get("Swap")
        s["pte"] = st.vm_pte
        s["hwm"] = st.vm_hwm
        if self.hot:
            s["hot_huge"] = self._hot_huge()
        self.samples.append(s)
        if self.agent_pid:
            cpu = cpu_seconds(self.agent_pid)
            if cpu is not None:
                self.agent_cpu_s = cpu
        for pid in kdamond_pids().values():
            if pid in self.foreign_kdamonds:
                continue
            cpu = cpu_seconds(pid)
            if cpu is not None:
                self.kdamond_cpu_s[pid] = max(cpu, self.kdamond_cpu_s.get(pid, 0.0))

    def _hot_huge(self) -> float | None:
        assert self.hot is not None
        capable = huge_capable_bytes(self.hot)
        if capable == 0:
            return None
        try:
            try:
                huge = procfs.huge_bytes_in(self.pid, self.hot)
            except procfs.PagemapScanUnsupported:
                # Per-VMA counters: exact only because the benchmarks map their hot range alone.
                self.hot_exact = False
                huge = procfs.smaps_in_ranges(procfs.read_smaps(self.pid),
                                              self.hot).anon_huge_bytes
            # A benchmark unmaps its buffers before it exits (hotcold does, after printing its
            # result): a scan then reads 0 huge bytes of memory that no longer exists, and as
            # the run's last sample it would become the final word. Checked after the scan,
            # so an unmap during it is caught too (seen: a 1.0 run ending on 0.0).
            if not _all_mapped(procfs.read_maps(self.pid), self.hot):
                return None
        except (procfs.ProcessGone, OSError):
            return None
        return min(1.0, huge / capable)

    def set_hot(self, ranges: list[AddrRange], now: float) -> None:
        self.hot = ranges
        self.hot_seen_s = now - self.t0

    def _time_to_hot_huge(self) -> float | None:
        """Seconds from the start of the hot phase (the benchmark printed its hot range, after
        touching its memory) until >= 90% of the hot range was huge-page backed."""
        if not self.hot or self.hot_seen_s is None:
            return None
        t = first_time_at_least(self.samples, "hot_huge", HOT_HUGE_THRESHOLD)
        return None if t is None else max(0.0, t - self.hot_seen_s)

    def summary(self) -> dict[str, Any]:
        s = self.samples
        hot_final = next((x["hot_huge"] for x in reversed(s) if x.get("hot_huge") is not None),
                         None)
        return {
            "peak_rss_bytes": peak(s, "hwm"),
            "mean_rss_bytes": time_weighted_mean(s, "rss"),
            "anon_huge_peak_bytes": peak(s, "anon_huge"),
            "anon_huge_mean_bytes": time_weighted_mean(s, "anon_huge"),
            "pte_peak_bytes": peak(s, "pte"),
            "swap_peak_bytes": peak(s, "swap"),
            "time_to_hot_huge_s": self._time_to_hot_huge(),
            "hot_huge_fraction_final": hot_final,
            "agent_cpu_s": self.agent_cpu_s,
            "kdamond_cpu_s": sum(self.kdamond_cpu_s.values()) if self.kdamond_cpu_s else None,
        }


def cpu_times() -> list[int] | None:
    """The machine-wide `cpu` line of /proc/stat (ticks: user nice system idle iowait irq
    softirq steal ...), or None."""
    try:
        with open("/proc/stat") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    return [int(x) for x in first[1:]]


def steal_fraction(before: list[int] | None, after: list[int] | None) -> float | None:
    """Share of all CPU time in [before, after] that the hypervisor stole (steal / total)."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    # guest and guest_nice (fields 9, 10) are already counted in user and nice
    total = sum(after[:8]) - sum(before[:8])
    if total <= 0:
        return None
    return max(0.0, (after[7] - before[7]) / total)


@dataclass(frozen=True)
class ChildUsage:
    user_s: float
    sys_s: float
    minflt: int
    majflt: int


def reaped_child_usage(agent_pid: int, timeout_s: float = 30.0) -> ChildUsage | None:
    """The workload's own CPU time and faults, read from its parent's /proc/PID/stat (cutime,
    cstime, cminflt, cmajflt) once the agent has reaped it: on the host there is no cgroup to
    count the workload alone, and the agent's wait4 rusage adds the agent's own. None when the
    agent is gone (reaped) before it could be read. The wait is long: an agent busy with a
    snapshot on a loaded host reaps its child late (5 s was too short once, 2026-11-25), and it
    ends as soon as the agent has reaped it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            text = Path(f"/proc/{agent_pid}/stat").read_text()
        except OSError:
            return None
        f = text[text.rindex(")") + 2 :].split()
        cminflt, cmajflt, cutime, cstime = int(f[8]), int(f[10]), int(f[13]), int(f[14])
        if cminflt or cutime or cstime:
            tick = os.sysconf("SC_CLK_TCK")
            return ChildUsage(cutime / tick, cstime / tick, cminflt, cmajflt)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)


def usage_delta(mark: dict[str, Any], a: str, b: str) -> dict[str, float]:
    x, y = mark.get(a) or {}, mark.get(b) or {}
    return {k: float(y.get(k, 0)) - float(x.get(k, 0)) for k in ("utime", "stime", "minflt",
                                                                 "majflt")}
