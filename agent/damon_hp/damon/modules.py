"""kdamonds that DAMON sysfs does not list: the kernel's own DAMON modules, read-only.

DAMON_STAT (6.17+, on from boot where CONFIG_DAMON_STAT_ENABLED_DEFAULT=y, as in Debian's 7.2
and 7.3), DAMON_RECLAIM and DAMON_LRU_SORT each run a paddr kdamond of their own. It is not a
directory under /sys/kernel/mm/damon/admin: sysfs reports `nr_kdamonds` 0 beside it. What tells
it is there is the module's parameters (/sys/module/damon_<name>/parameters/{enabled,
kdamond_pid}) and, for any other in-kernel DAMON user, a `kdamond.N` kernel thread in /proc
whose pid is none of sysfs's.

These modules start their context with damon_start(..., exclusive=true) (mm/damon/stat.c,
reclaim.c, lru_sort.c via modules-common): while one runs, the kernel refuses to start ANY
other DAMON context, a sysfs kdamond included (damon_start() returns -EBUSY, which the sysfs
`state` write passes on). That is not a lock that frees up: the start fails until the module
is disabled. Their events still come through the damon:damon_aggregated tracepoint from their
kdamond thread, so the passive source can read them without writing anything.

Intervals: all three auto-tune or may auto-tune their sampling interval (DAMON_STAT always:
aiming 4 % observed accesses, sample 5 ms..10 s; RECLAIM and LRU_SORT when
`autotune_monitoring_intervals` is Y). The kernel keeps the aggregation interval a fixed number
of samples while it tunes (kdamond_tune_intervals: aggr = sample * aggr_samples), so the
ratio known at start stays right and `damon:damon_monitor_intervals_tune` (6.17+), emitted by
the kdamond with the new sample_us, gives every later value (events.py follows it).
DAMON_STAT's current aggregation interval is also its `aggr_interval_us` parameter (refreshed
at most every 5 s; 0 until its first refresh); its ratio is its build-time 100 ms / 5 ms = 20.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SYS_MODULE = Path("/sys/module")
PROC = Path("/proc")

# name under /sys/module -> what the kernel and its documentation call it
MODULES = {"damon_stat": "DAMON_STAT", "damon_reclaim": "DAMON_RECLAIM",
           "damon_lru_sort": "DAMON_LRU_SORT"}

# mm/damon/stat.c damon_stat_build_ctx(): sample 5 ms, aggregation 100 ms, then auto-tuned
# with the ratio kept.
DAMON_STAT_AGGR_SAMPLES = 20
DAMON_STAT_START_SAMPLE_US = 5_000


@dataclass(frozen=True)
class ModuleKdamond:
    """A running kdamond of a DAMON module (or of an unknown in-kernel DAMON user)."""

    module: str  # damon_stat, damon_reclaim, damon_lru_sort, or "" when unknown
    pid: int
    sample_us: int | None  # current sampling interval, when known
    aggr_us: int | None  # current aggregation interval, when known
    autotuned: bool  # the module tunes its intervals while it runs
    ops: str = "paddr"  # every DAMON module monitors physical memory

    @property
    def label(self) -> str:
        """DAMON_STAT, DAMON_RECLAIM, DAMON_LRU_SORT, or 'an in-kernel DAMON user'."""
        return MODULES.get(self.module, "an in-kernel DAMON user")

    @property
    def aggr_samples(self) -> int | None:
        if self.sample_us and self.aggr_us:
            return max(1, round(self.aggr_us / self.sample_us))
        return None

    def describe(self) -> str:
        iv = ""
        if self.sample_us and self.aggr_us:
            iv = f", sample {self.sample_us / 1000:g} ms, aggregation {self.aggr_us / 1000:g} ms"
            if self.autotuned:
                iv += " (auto-tuned)"
        return f"{self.label}'s kdamond (pid {self.pid}, {self.ops}{iv}; not in DAMON sysfs)"

    def exclusive_message(self) -> str:
        """Why no kdamond of damon-hp's can start beside this one."""
        how = (f"echo N > {SYS_MODULE}/{self.module}/parameters/enabled" if self.module
               else "stop that kernel DAMON user")
        return (f"{self.label} runs an exclusive DAMON context ({self.describe()}): while it "
                "runs the kernel refuses to start any other kdamond (EBUSY); this is not a "
                f"lock that frees up. Read it passively (--source passive), or stop it ({how}) "
                "if nothing on this machine needs it")

    def to_dict(self) -> dict:
        return {"module": self.module, "label": self.label, "pid": self.pid,
                "sample_us": self.sample_us, "aggr_us": self.aggr_us,
                "autotuned": self.autotuned, "ops": self.ops}


def _param(sys_module: Path, module: str, name: str) -> str | None:
    try:
        return (sys_module / module / "parameters" / name).read_text().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def is_kdamond_thread(pid: int, proc: Path = PROC) -> bool:
    """Whether `pid` is a kdamond kernel thread (comm `kdamond.N`)."""
    try:
        return (proc / str(pid) / "comm").read_text().startswith("kdamond.")
    except OSError:
        return False


def kdamond_threads(proc: Path = PROC) -> list[int]:
    """Pids of every kdamond kernel thread (kthreadd's children named kdamond.N)."""
    out = []
    for d in proc.iterdir():
        if d.name.isdigit() and is_kdamond_thread(int(d.name), proc):
            out.append(int(d.name))
    return sorted(out)


def _module_intervals(sys_module: Path, module: str) -> tuple[int | None, int | None, bool]:
    """(sample_us, aggr_us, autotuned) of a module as its parameters say now."""
    if module == "damon_stat":
        aggr = _int(_param(sys_module, module, "aggr_interval_us"))
        if not aggr:  # not refreshed yet (its first 5 s): the build-time start values
            return (DAMON_STAT_START_SAMPLE_US,
                    DAMON_STAT_START_SAMPLE_US * DAMON_STAT_AGGR_SAMPLES, True)
        return max(1, aggr // DAMON_STAT_AGGR_SAMPLES), aggr, True
    sample = _int(_param(sys_module, module, "sample_interval"))
    aggr = _int(_param(sys_module, module, "aggr_interval"))
    tuned = _param(sys_module, module, "autotune_monitoring_intervals") == "Y"
    return sample, aggr, tuned


def module_kdamonds(sys_module: Path = SYS_MODULE, proc: Path = PROC) -> list[ModuleKdamond]:
    """The running kdamonds of DAMON_STAT, DAMON_RECLAIM and DAMON_LRU_SORT. Never writes."""
    out = []
    for module in MODULES:
        if _param(sys_module, module, "enabled") != "Y":
            continue
        pid = _int(_param(sys_module, module, "kdamond_pid"))
        if not pid or pid <= 0 or not is_kdamond_thread(pid, proc):
            continue
        sample, aggr, tuned = _module_intervals(sys_module, module)
        out.append(ModuleKdamond(module, pid, sample, aggr, tuned))
    return out


def unlisted_kdamonds(sysfs_pids: set[int], sys_module: Path = SYS_MODULE,
                      proc: Path = PROC) -> list[ModuleKdamond]:
    """Every running kdamond sysfs does not list: the modules' (with what they tell), then
    any other kdamond thread (intervals unknown)."""
    mods = [m for m in module_kdamonds(sys_module, proc) if m.pid not in sysfs_pids]
    known = sysfs_pids | {m.pid for m in mods}
    others = [ModuleKdamond("", pid, None, None, False) for pid in kdamond_threads(proc)
              if pid not in known]
    return mods + others


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return is_kdamond_thread(pid)
