"""The only code that reads or writes /sys/kernel/mm/damon/admin.

Two halves:
- `probe()` reads, never writes: what DAMON offers and which kdamonds exist, whose they are,
  and whether damon-hp could add one now. `damon-hp doctor` uses only this half.
- `start_vaddr()` creates and starts a kdamond for one process and returns an `OwnedKdamond`,
  the only handle through which a kdamond is changed or stopped. It refuses, before writing
  anything, while a kdamond that damon-hp did not start is running: `nr_kdamonds` cannot change
  then (EBUSY), and that kdamond is somebody else's to keep.

Sysfs facts this relies on (checked on Linux 6.12 and 6.18):
- Writing a count file (`nr_kdamonds`, `nr_contexts`, `nr_targets`, `nr_schemes`,
  `nr_filters`) removes every directory under it and creates fresh ones with defaults.
- A new scheme's access pattern is [0, 0] for size, nr_accesses and age: it matches nothing
  until all six bounds are written.
- Keywords written to `kdamonds/N/state`: on, off, commit (re-read all inputs of a running
  kdamond), update_schemes_stats, update_schemes_tried_regions (fills
  `schemes/M/tried_regions/` with the regions the scheme matched, after the next apply),
  update_schemes_tried_bytes (only `tried_regions/total_bytes`), clear_schemes_tried_regions,
  and update_tuned_intervals (6.15+).
"""

from __future__ import annotations

import errno
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DamonHpError, EnvironmentProblem
from . import ownership
from .model import (
    ULONG_MAX,
    AccessPattern,
    AddrRange,
    Intervals,
    IntervalsGoal,
    Region,
    Scheme,
    SchemeStats,
    Snapshot,
)

ADMIN = Path("/sys/kernel/mm/damon/admin")

# The scheme damon-hp puts first in every context it owns: action `stat` (count only, change
# nothing) over every region, so that its tried_regions are a full snapshot of the target.
SNAPSHOT_SCHEME = Scheme(action="stat", pattern=AccessPattern())

OWNER_DAMON_HP = "damon-hp"  # started by a live damon-hp agent
OWNER_STALE = "damon-hp (agent gone)"  # started by damon-hp; its agent died without stopping it
OWNER_FOREIGN = "foreign"  # anything damon-hp cannot prove it started
OWNER_NONE = "none"  # an idle kdamond directory with no context configured


class KdamondStopped(DamonHpError):
    """Our kdamond is no longer running (its target exited, or someone turned it off)."""


# --------------------------------------------------------------------------------------------
# low-level file access


# DAMON sysfs guards `state`, `pid` and the `nr_*` files with a mutex it only try-locks,
# answering EBUSY when it is held. A running kdamond takes that mutex briefly at every
# aggregation, and holds it for the whole of a tried-regions update, so EBUSY is usually
# transient: retry for a while before calling it a failure.
EBUSY_RETRY_S = 3.0


def _retry_ebusy(op):
    delay, waited = 0.005, 0.0
    while True:
        try:
            return op()
        except OSError as e:
            if e.errno != errno.EBUSY or waited >= EBUSY_RETRY_S:
                raise
        time.sleep(delay)
        waited += delay
        delay = min(delay * 2, 0.1)


def _read(path: Path) -> str:
    return _retry_ebusy(lambda: path.read_text().strip())


def _read_int(path: Path, default: int | None = None) -> int | None:
    try:
        return int(_read(path))
    except (OSError, ValueError):
        return default


def _numbered_dirs(path: Path) -> list[Path]:
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return [path / n for n in sorted((n for n in names if n.isdigit()), key=int)]


def _write(path: Path, value: object) -> None:
    """Write one sysfs file; a refusal becomes an error that says which file and value."""
    text = str(value)

    def write() -> None:
        with open(path, "w") as f:
            f.write(text)

    try:
        _retry_ebusy(write)
    except OSError as e:
        hint = ""
        if e.errno in (errno.EACCES, errno.EPERM):
            hint = " (DAMON sysfs needs root)"
        elif e.errno == errno.EBUSY:
            hint = (f" (still busy after {EBUSY_RETRY_S:g} s: a kdamond is running, or another "
                    "DAMON sysfs command is in progress)")
        elif e.errno == errno.EROFS:
            hint = " (sysfs is mounted read-only here)"
        raise DamonHpError(
            f"damon-hp: writing {text!r} to {path} failed: {os.strerror(e.errno or 0)}{hint}"
        ) from e


# --------------------------------------------------------------------------------------------
# read-only view


@dataclass(frozen=True)
class KdamondInfo:
    """One kdamond directory as found in sysfs, and whose it is."""

    index: int
    state: str  # "on", "off", or "?" when unreadable
    pid: int | None  # the kdamond thread's pid while it runs
    ops: tuple[str, ...]  # operations set of each context
    target_pids: tuple[int, ...]  # pid_target of each target (0 for paddr)
    owner: str  # one of the OWNER_* values
    agent_pid: int | None = None  # the damon-hp agent that started it, when known

    @property
    def running(self) -> bool:
        return self.state == "on"

    @property
    def configured(self) -> bool:
        return bool(self.ops)

    def describe(self) -> str:
        ops = ",".join(self.ops) or "none"
        pid = f"pid {self.pid}" if self.pid else "not running"
        return f"kdamond {self.index} ({pid}, ops {ops})"

    def to_dict(self) -> dict:
        return {"index": self.index, "state": self.state, "pid": self.pid,
                "ops": list(self.ops), "target_pids": list(self.target_pids),
                "owner": self.owner, "agent_pid": self.agent_pid}

    @classmethod
    def from_dict(cls, d: dict) -> KdamondInfo:
        return cls(int(d["index"]), str(d["state"]), d.get("pid"), tuple(d["ops"]),
                   tuple(int(p) for p in d["target_pids"]), str(d["owner"]),
                   d.get("agent_pid"))


@dataclass(frozen=True)
class DamonStatus:
    """What DAMON sysfs looks like now, read without writing anything."""

    sysfs_present: bool
    readable: bool
    error: str | None
    avail_ops: tuple[str, ...]  # operations sets this kernel offers
    avail_ops_source: str  # "avail_operations", "kernel config", "kallsyms" or "unknown"
    kdamonds: tuple[KdamondInfo, ...]
    features: dict[str, bool] = field(default_factory=dict)  # see _detect_features
    features_source: str = "unknown"  # "sysfs" or "kernel version"

    @property
    def running(self) -> tuple[KdamondInfo, ...]:
        return tuple(k for k in self.kdamonds if k.running)

    @property
    def foreign_running(self) -> tuple[KdamondInfo, ...]:
        return tuple(k for k in self.running if k.owner == OWNER_FOREIGN)

    @property
    def can_add_kdamond(self) -> bool:
        """Whether `nr_kdamonds` can change now: only while no kdamond at all runs."""
        return self.sysfs_present and self.readable and not self.running

    def to_dict(self) -> dict:
        return {
            "sysfs_present": self.sysfs_present, "readable": self.readable, "error": self.error,
            "avail_ops": list(self.avail_ops), "avail_ops_source": self.avail_ops_source,
            "kdamonds": [k.to_dict() for k in self.kdamonds],
            "can_add_kdamond": self.can_add_kdamond,
            "features": dict(self.features), "features_source": self.features_source,
        }

    @classmethod
    def from_dict(cls, d: dict) -> DamonStatus:
        return cls(bool(d["sysfs_present"]), bool(d["readable"]), d.get("error"),
                   tuple(d["avail_ops"]), str(d["avail_ops_source"]),
                   tuple(KdamondInfo.from_dict(k) for k in d["kdamonds"]),
                   dict(d.get("features", {})), str(d.get("features_source", "unknown")))


def kernel_release() -> str:
    return os.uname().release


def kernel_version(release: str | None = None) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release or kernel_release())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# Feature -> (first kernel with it, path relative to a scheme or context dir that proves it).
FEATURES: dict[str, tuple[tuple[int, int], str]] = {
    "tried_regions": ((6, 2), "schemes/0/tried_regions"),
    "tried_bytes": ((6, 6), "schemes/0/tried_regions/total_bytes"),
    "apply_interval": ((6, 7), "schemes/0/apply_interval_us"),
    "filter_allow": ((6, 14), None),  # only visible inside a filter dir
    "core_filters": ((6, 15), "schemes/0/core_filters"),
    "intervals_goal": ((6, 15), "monitoring_attrs/intervals/intervals_goal"),
    "collapse_action": ((7, 2), None),  # not visible in sysfs: probe by writing an action
}


def _detect_features(ctx: Path | None, release: str) -> tuple[dict[str, bool], str]:
    ver = kernel_version(release)
    by_version = {name: ver >= since for name, (since, _) in FEATURES.items()}
    if ctx is None or not (ctx / "schemes/0").is_dir():
        return by_version, "kernel version"
    found = dict(by_version)
    for name, (_, rel) in FEATURES.items():
        if rel is not None:
            found[name] = (ctx / rel).exists()
    return found, "sysfs"


def _ops_from_kallsyms() -> tuple[str, ...]:
    """Operations sets inferred from kernel symbols, for when no kdamond dir can be read."""
    found = set()
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                if " damon_va_" in line:
                    found.add("vaddr")
                elif " damon_pa_" in line:
                    found.add("paddr")
                if len(found) == 2:
                    break
    except OSError:
        return ()
    return tuple(sorted(found))


def _ops_from_kconfig() -> tuple[str, ...] | None:
    # Imported here: kconfig is the doctor's module and the agent need not load it.
    from .. import kconfig

    cfg = kconfig.read_running_config()
    if cfg is None:
        return None
    ops = []
    if cfg.options.get("CONFIG_DAMON_VADDR") in ("y", "m"):
        ops += ["vaddr", "fvaddr"]
    if cfg.options.get("CONFIG_DAMON_PADDR") in ("y", "m"):
        ops.append("paddr")
    return tuple(ops)


def _owner_of(index: int, state: str, pid: int | None, ops: tuple[str, ...],
              target_pids: tuple[int, ...],
              records: dict[int, ownership.OwnerRecord]) -> tuple[str, int | None]:
    rec = records.get(index)
    if state == "on":
        if rec is not None and rec.proves(index, pid, target_pids):
            return (OWNER_DAMON_HP if rec.agent_alive() else OWNER_STALE), rec.agent_pid
        return OWNER_FOREIGN, None
    if not ops:
        return OWNER_NONE, None
    if rec is not None and rec.this_boot() and rec.target_pid in target_pids:
        return (OWNER_DAMON_HP if rec.agent_alive() else OWNER_STALE), rec.agent_pid
    return OWNER_FOREIGN, None


def _read_kdamond(kd: Path, records: dict[int, ownership.OwnerRecord]) -> KdamondInfo:
    index = int(kd.name)
    try:
        state = _read(kd / "state")
    except OSError:
        state = "?"
    pid = _read_int(kd / "pid")
    pid = pid if pid and pid > 0 else None
    ops, targets = [], []
    for ctx in _numbered_dirs(kd / "contexts"):
        try:
            ops.append(_read(ctx / "operations"))
        except OSError:
            ops.append("?")
        for t in _numbered_dirs(ctx / "targets"):
            targets.append(_read_int(t / "pid_target", 0) or 0)
    owner, agent = _owner_of(index, state, pid, tuple(ops), tuple(targets), records)
    return KdamondInfo(index, state, pid, tuple(ops), tuple(targets), owner, agent)


def probe(admin: Path = ADMIN, run_dir: Path | None = None) -> DamonStatus:
    """Read DAMON's sysfs state. Never writes, so it is safe on any machine."""
    release = kernel_release()
    if not admin.is_dir():
        feats, src = _detect_features(None, release)
        return DamonStatus(False, False, f"{admin} does not exist", (), "unknown", (), feats, src)
    try:
        kd_dirs = _numbered_dirs(admin / "kdamonds")
        _read(admin / "kdamonds/nr_kdamonds")
    except OSError as e:
        feats, src = _detect_features(None, release)
        return DamonStatus(True, False, f"cannot read {admin}: {e.strerror}", (), "unknown", (),
                           feats, src)
    records = ownership.read_records(run_dir)
    kdamonds = tuple(_read_kdamond(kd, records) for kd in kd_dirs)

    avail: tuple[str, ...] = ()
    source = "unknown"
    first_ctx = None
    for kd in kd_dirs:
        for ctx in _numbered_dirs(kd / "contexts"):
            first_ctx = first_ctx or ctx
            try:
                avail = tuple(_read(ctx / "avail_operations").split())
                source = "avail_operations"
            except OSError:
                continue
            break
        if avail:
            break
    if not avail:
        from_cfg = _ops_from_kconfig()
        if from_cfg is not None:
            avail, source = from_cfg, "kernel config"
        else:
            avail = _ops_from_kallsyms()
            source = "kallsyms" if avail else "unknown"
    feats, fsrc = _detect_features(first_ctx, release)
    return DamonStatus(True, True, None, avail, source, kdamonds, feats, fsrc)


# --------------------------------------------------------------------------------------------
# deciding where a new kdamond may go (pure)


@dataclass(frozen=True)
class StartPlan:
    """Where damon-hp will put its kdamond: reuse idle dir `index`, or create dirs first."""

    index: int
    set_nr_kdamonds: int | None  # write this to nr_kdamonds first, or None to reuse in place


def busy_message(k: KdamondInfo) -> str:
    return (f"DAMON sysfs is busy: {k.describe()} was not started by damon-hp and must keep "
            "running; damon-hp cannot add a kdamond while it runs (nr_kdamonds is locked)")


def plan_start(status: DamonStatus) -> StartPlan:
    """Decide where to start a vaddr kdamond, or raise EnvironmentProblem saying why not.

    Every reason that applies is named (a kernel may both lack vaddr and be busy).
    """
    if not status.sysfs_present:
        raise EnvironmentProblem(
            "damon-hp: DAMON sysfs (/sys/kernel/mm/damon/admin) is missing: this kernel lacks "
            "CONFIG_DAMON_SYSFS. See `damon-hp doctor` and kernel-config/README.md.")
    if not status.readable:
        raise EnvironmentProblem(f"damon-hp: {status.error}; run damon-hp as root.")
    problems = []
    if status.avail_ops and "vaddr" not in status.avail_ops:
        problems.append(
            f"this kernel's DAMON offers only {', '.join(status.avail_ops)}; damon-hp needs "
            "the vaddr operations set (CONFIG_DAMON_VADDR)")
    try:
        plan = plan_placement(status)
    except EnvironmentProblem as e:
        problems.append(str(e).removeprefix("damon-hp: "))
        plan = None
    if problems or plan is None:
        raise EnvironmentProblem("damon-hp: " + "; and ".join(problems) +
                                 ". Real DAMON for damon-hp runs in the test VM: make vm-shell")
    return plan


def plan_placement(status: DamonStatus) -> StartPlan:
    """Where a new kdamond can go given the kdamonds that exist (pure; ignores ops support).

    Raises EnvironmentProblem when a kdamond runs (nr_kdamonds is locked then), or when only
    configured dirs of others exist (adding one would wipe them).
    """
    for k in status.running:
        if k.owner == OWNER_FOREIGN:
            raise EnvironmentProblem("damon-hp: " + busy_message(k))
        if k.owner == OWNER_DAMON_HP:
            raise EnvironmentProblem(
                f"damon-hp: {k.describe()} belongs to the damon-hp agent pid {k.agent_pid}, "
                "which is still running; DAMON cannot add a kdamond while it runs. "
                "Stop that agent first (see `damon-hp status`)")
        raise EnvironmentProblem(
            f"damon-hp: {k.describe()} was left by a damon-hp agent that died "
            f"(pid {k.agent_pid}) and is still running; damon-hp stops it when it starts "
            f"(or: echo off > {ADMIN}/kdamonds/{k.index}/state)")
    # Idle dirs that are empty or left by a dead agent can be reused in place; an idle dir of
    # a live agent is not (that agent will clean it up when it notices its target exited).
    reusable = [k for k in status.kdamonds if k.owner in (OWNER_NONE, OWNER_STALE)]
    if reusable:
        return StartPlan(reusable[0].index, None)
    if not status.kdamonds:
        return StartPlan(0, 1)
    for k in status.kdamonds:
        if k.owner == OWNER_DAMON_HP:
            raise EnvironmentProblem(
                f"damon-hp: {k.describe()} is configured by the damon-hp agent pid "
                f"{k.agent_pid}, which is still running; wait for it to exit")
    foreign = ", ".join(k.describe() for k in status.kdamonds)
    raise EnvironmentProblem(
        f"damon-hp: DAMON sysfs holds kdamonds configured by someone else ({foreign}); "
        "adding one would wipe their configuration. If nobody needs them: "
        f"echo 0 > {ADMIN}/kdamonds/nr_kdamonds")


# --------------------------------------------------------------------------------------------
# writing: only through a kdamond we start


def _allow_ranges_as_reject_gaps(ranges: tuple[AddrRange, ...]) -> list[AddrRange]:
    """The complement of the union of `ranges` within [0, ULONG_MAX).

    DAMOS address filters before Linux 6.14 can only reject (and, after 6.14, memory that
    matches no filter is allowed when the last filter rejects). Rejecting every gap between the
    wanted ranges therefore limits a scheme to their union on every kernel.
    """
    gaps, pos = [], 0
    for r in sorted(ranges, key=lambda r: r.start):
        if r.start > pos:
            gaps.append(AddrRange(pos, r.start))
        pos = max(pos, r.end)
    if pos < ULONG_MAX:
        gaps.append(AddrRange(pos, ULONG_MAX))
    return gaps


def _write_scheme(sdir: Path, s: Scheme, sample_us: int) -> None:
    _write(sdir / "action", s.action)
    p = s.pattern
    # Every bound, min and max: a new scheme starts at [0, 0] and would match nothing.
    for name, lo, hi in (("sz", p.min_size_bytes, p.max_size_bytes),
                         ("nr_accesses", p.min_nr_accesses, p.max_nr_accesses),
                         ("age", p.min_age, p.max_age)):
        _write(sdir / f"access_pattern/{name}/min", lo)
        _write(sdir / f"access_pattern/{name}/max", hi)
    _write(sdir / "quotas/bytes", s.quota_bytes)
    _write(sdir / "quotas/ms", s.quota_ms)
    _write(sdir / "quotas/reset_interval_ms", s.quota_reset_interval_ms)
    apply_us = s.apply_interval_us
    if s.addr_filters and apply_us == 0:
        # DAMON splits a region at an address-filter boundary while applying a scheme, and
        # the part after the split is skipped for the rest of that pass; the next aggregation
        # merges the parts again. Applied once per aggregation, a filter range that starts
        # inside a uniformly accessed region is therefore never reached (seen on 6.12: 0 bytes
        # tried, every pass). Applied every sampling interval, the split survives until the
        # next pass, which then reaches the range.
        apply_us = sample_us
    if (sdir / "apply_interval_us").exists():
        _write(sdir / "apply_interval_us", apply_us)
    elif s.apply_interval_us:
        raise EnvironmentProblem(
            "damon-hp: this kernel has no per-scheme apply interval (Linux 6.7+); "
            "leave apply_interval_us at 0")
    if s.addr_filters:
        # Address filters are handled by DAMON's core; since 6.15 they live in core_filters.
        fdir = sdir / ("core_filters" if (sdir / "core_filters").is_dir() else "filters")
        gaps = _allow_ranges_as_reject_gaps(s.addr_filters)
        _write(fdir / "nr_filters", len(gaps))
        for i, g in enumerate(gaps):
            f = fdir / str(i)
            _write(f / "type", "addr")
            _write(f / "addr_start", g.start)
            _write(f / "addr_end", g.end)
            _write(f / "matching", "Y")
            if (f / "allow").exists():
                _write(f / "allow", "N")


class OwnedKdamond:
    """A kdamond damon-hp started: the only handle that changes or stops one.

    Scheme 0 is always the snapshot scheme (action `stat` over everything); the caller's schemes
    follow it, so `scheme_stats()[i]` is the caller's `schemes[i]`.
    """

    def __init__(self, index: int, target_pid: int, intervals: Intervals,
                 schemes: tuple[Scheme, ...], autotuned: bool, record_dir: Path | None,
                 admin: Path = ADMIN) -> None:
        self.index = index
        self.target_pid = target_pid
        self.intervals = intervals
        self.schemes = schemes
        self.autotuned = autotuned
        self.kdamond_pid: int | None = None
        self.record: ownership.OwnerRecord | None = None
        self._record_dir = record_dir
        self._admin = admin
        self.dir = admin / "kdamonds" / str(index)
        self.ctx = self.dir / "contexts/0"

    # -- state ---------------------------------------------------------------------------

    def _live_pid(self) -> int | None:
        try:
            state = _read(self.dir / "state")
        except OSError:
            return None
        pid = _read_int(self.dir / "pid", -1)
        return pid if state == "on" and pid and pid > 0 else None

    def is_running(self) -> bool:
        """True while the kdamond we started still runs (False once the target has exited)."""
        return self.kdamond_pid is not None and self._live_pid() == self.kdamond_pid

    def _require_running(self) -> None:
        if not self.is_running():
            raise KdamondStopped(
                f"damon-hp: kdamond {self.index} (pid {self.kdamond_pid}) is no longer running; "
                f"target pid {self.target_pid} has probably exited")

    def _state(self, keyword: str) -> None:
        self._require_running()
        _write(self.dir / "state", keyword)

    @property
    def features(self) -> dict[str, bool]:
        return _detect_features(self.ctx, kernel_release())[0]

    # -- reading -------------------------------------------------------------------------

    def _current_intervals(self) -> tuple[int, int]:
        if self.autotuned:
            # Auto-tuning moves the intervals; sysfs shows the tuned ones only when asked.
            self._state("update_tuned_intervals")
            iv = self.ctx / "monitoring_attrs/intervals"
            return (_read_int(iv / "sample_us", self.intervals.sample_us) or 1,
                    _read_int(iv / "aggr_us", self.intervals.aggr_us) or 1)
        return self.intervals.sample_us, self.intervals.aggr_us

    # How often to ask again when DAMON answers a tried-regions update with nothing. Linux
    # 6.7..6.13 end the update after two apply intervals of wall time even if the kdamond has
    # not made a pass yet; a slow machine (our TCG VM, ~25x slower) then reads zero regions,
    # which is never a real answer for a live vaddr target (DAMON keeps >= min_nr_regions).
    UPDATE_ATTEMPTS = 8

    def _update_tried(self, keyword: str) -> None:
        """Ask for fresh tried regions/bytes until the snapshot scheme reports some."""
        total = self.ctx / "schemes/0/tried_regions/total_bytes"
        for _ in range(self.UPDATE_ATTEMPTS):
            self._state(keyword)
            if keyword == "update_schemes_tried_regions":
                if _numbered_dirs(self.ctx / "schemes/0/tried_regions"):
                    return
            elif (_read_int(total, 0) or 0) > 0:
                return
        self._require_running()
        raise DamonHpError(
            f"damon-hp: DAMON returned no regions for pid {self.target_pid} in "
            f"{self.UPDATE_ATTEMPTS} tries: kdamond {self.index} is too slow to finish an "
            f"aggregation ({self.intervals.aggr_us} us) in time; use a longer --aggr-us")

    def snapshot(self) -> Snapshot:
        """Every region of the target as DAMON last aggregated it (blocks about one aggr_us).

        Raises KdamondStopped once the kdamond has stopped (e.g. the target exited).
        """
        sample_us, aggr_us = self._current_intervals()
        tried = self.ctx / "schemes/0/tried_regions"
        for _ in range(self.UPDATE_ATTEMPTS):
            self._update_tried("update_schemes_tried_regions")
            taken = time.monotonic()
            regions = []
            try:
                for rdir in _numbered_dirs(tried):
                    regions.append(Region(int(_read(rdir / "start")), int(_read(rdir / "end")),
                                          int(_read(rdir / "nr_accesses")),
                                          int(_read(rdir / "age"))))
                total = _read_int(tried / "total_bytes")
            except (OSError, ValueError):
                continue  # the kernel replaced the dirs while we read them: ask again
            if total is not None and total != sum(r.end - r.start for r in regions):
                continue  # torn read: a snapshot is returned whole or not at all
            regions.sort(key=lambda r: r.start)
            return Snapshot(taken, self.target_pid, sample_us, aggr_us, tuple(regions))
        self._require_running()
        raise DamonHpError(f"damon-hp: could not read a consistent snapshot of kdamond "
                           f"{self.index} in {self.UPDATE_ATTEMPTS} tries")

    def tried_bytes(self, scheme: int = 0) -> int:
        """Bytes of the regions scheme `scheme` (0 = snapshot scheme) matched at its last apply.

        Cheaper than `snapshot()`: the kernel fills one file instead of a directory per region.
        Raises EnvironmentProblem on kernels before 6.6, which lack it.

        Pitfall (Linux 6.7..6.13): the kernel stops waiting for a scheme's tried regions after
        two of its apply intervals of wall time. A scheme added by `set_schemes` runs out of
        phase with the aggregations, so on a slow machine (our TCG VM) a once-per-aggregation
        scheme can read 0 here. Give such a scheme a short `apply_interval_us` (schemes with
        address filters get one automatically) or use `scheme_stats()`.
        """
        if not (self.ctx / "schemes/0/tried_regions/total_bytes").exists():
            raise EnvironmentProblem("damon-hp: tried_regions/total_bytes needs Linux 6.6+")
        self._update_tried("update_schemes_tried_bytes")
        return _read_int(self.ctx / f"schemes/{scheme}/tried_regions/total_bytes", 0) or 0

    def scheme_stats(self) -> list[SchemeStats]:
        """Counters of the caller's schemes (not the snapshot scheme), in their order."""
        self._state("update_schemes_stats")
        out = []
        for i in range(1, 1 + len(self.schemes)):
            st = self.ctx / f"schemes/{i}/stats"
            out.append(SchemeStats(*(_read_int(st / n, 0) or 0 for n in
                                     ("nr_tried", "sz_tried", "nr_applied", "sz_applied",
                                      "qt_exceeds"))))
        return out

    # -- changing ------------------------------------------------------------------------

    def supports_action(self, action: str) -> bool:
        """Whether this kernel's DAMOS knows `action` (e.g. "collapse", upstream in 7.2).

        Writes the name into the snapshot scheme's `action` file and puts `stat` back; the
        running kdamond only reads that file on commit, so monitoring is not disturbed.
        """
        f = self.ctx / "schemes/0/action"
        try:
            with open(f, "w") as fh:
                fh.write(action)
        except OSError as e:
            if e.errno == errno.EINVAL:
                return False
            raise DamonHpError(f"damon-hp: probing DAMOS action {action!r} failed: "
                               f"{os.strerror(e.errno or 0)}") from e
        finally:
            _write(f, SNAPSHOT_SCHEME.action)
        return True

    def _write_schemes(self, schemes: tuple[Scheme, ...]) -> None:
        sdir = self.ctx / "schemes"
        _write(sdir / "nr_schemes", 1 + len(schemes))
        for i, s in enumerate((SNAPSHOT_SCHEME, *schemes)):
            _write_scheme(sdir / str(i), s, self.intervals.sample_us)

    def set_schemes(self, schemes: list[Scheme] | tuple[Scheme, ...]) -> None:
        """Replace the caller's schemes on the running kdamond (online `commit`).

        Monitoring continues; DAMOS stats of the replaced schemes start again from zero.
        """
        self._require_running()
        schemes = tuple(schemes)
        self._write_schemes(schemes)
        self._state("commit")
        self.schemes = schemes

    # -- stopping ------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop our kdamond (only if its live pid is still ours) and remove our traces.

        Safe to call twice, and after the kdamond stopped on its own because the target exited.
        """
        live = self._live_pid()
        if live is not None and live == self.kdamond_pid:
            _write(self.dir / "state", "off")
            for _ in range(200):  # the kdamond thread exits asynchronously
                if self._live_pid() is None:
                    break
                time.sleep(0.05)
        if self._live_pid() is None:
            _clear_idle_dir(self._admin, self.index, self.target_pid)
        if self.record is not None:
            ownership.remove_record(self.index, self._record_dir, only=self.record)
            self.record = None
        self.kdamond_pid = None

    def __enter__(self) -> OwnedKdamond:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"OwnedKdamond(index={self.index}, kdamond_pid={self.kdamond_pid}, "
                f"target_pid={self.target_pid})")


def _clear_idle_dir(admin: Path, index: int, target_pid: int) -> None:
    """Leave no configuration behind for an idle kdamond dir we configured.

    When every kdamond dir is idle and ours or empty, all dirs go (nr_kdamonds 0), as before
    damon-hp started. Otherwise only our dir's contexts go; other dirs are not ours to touch.
    """
    kd = admin / "kdamonds" / str(index)
    try:
        if _read(kd / "state") != "off":
            return
        targets = [_read_int(t / "pid_target", 0) for t in
                   _numbered_dirs(kd / "contexts/0/targets")]
    except OSError:
        return
    if targets and targets != [target_pid]:
        return  # someone reconfigured it after our kdamond stopped: theirs now
    others = [d for d in _numbered_dirs(admin / "kdamonds") if d.name != str(index)]
    try:
        others_idle_empty = all(
            _read(d / "state") == "off" and not _numbered_dirs(d / "contexts") for d in others)
    except OSError:
        others_idle_empty = False
    if others_idle_empty:
        _write(admin / "kdamonds/nr_kdamonds", 0)
    else:
        _write(kd / "contexts/nr_contexts", 0)


def start_vaddr(pid: int, intervals: Intervals | None = None, min_nr_regions: int = 10,
                max_nr_regions: int = 1000, schemes: list[Scheme] | tuple[Scheme, ...] = (),
                intervals_goal: IntervalsGoal | None = None, *,
                run_dir: Path | None = None, admin: Path = ADMIN) -> OwnedKdamond:
    """Start a kdamond monitoring process `pid`'s virtual address space, owned by damon-hp.

    Raises EnvironmentProblem (exit 2) when DAMON cannot be used here: no sysfs, no vaddr, not
    root, no such process, or a kdamond damon-hp did not start is running (named in the
    message). `intervals_goal` turns on DAMON's interval auto-tuning where the kernel has it
    (6.15+); elsewhere it is ignored and `OwnedKdamond.autotuned` is False.
    """
    intervals = intervals or Intervals()
    schemes = tuple(schemes)
    if not 3 <= min_nr_regions <= max_nr_regions:
        raise EnvironmentProblem(
            f"damon-hp: need 3 <= min_nr_regions ({min_nr_regions}) <= max_nr_regions "
            f"({max_nr_regions})")
    if ownership.process_start_ticks(pid) is None:
        raise EnvironmentProblem(f"damon-hp: no process with pid {pid}")
    reclaim_stale(run_dir=run_dir, admin=admin)
    status = probe(admin, run_dir)
    plan = plan_start(status)

    if plan.set_nr_kdamonds is not None:
        # Re-read right before the one write that affects every kdamond dir.
        if probe(admin, run_dir).running:
            raise EnvironmentProblem("damon-hp: a kdamond started while damon-hp was "
                                     "preparing its own; try again")
        _write(admin / "kdamonds/nr_kdamonds", plan.set_nr_kdamonds)

    kd = OwnedKdamond(plan.index, pid, intervals, schemes, False, run_dir, admin)
    record = ownership.OwnerRecord.for_this_agent(plan.index, pid)
    # Provisional record first: if we die between `on` and the final record, the next start
    # can still prove (by start time and target) that the kdamond is ours.
    ownership.write_record(record, run_dir)
    turned_on = False
    try:
        _write(kd.dir / "contexts/nr_contexts", 1)
        ctx = kd.ctx
        _write(ctx / "operations", "vaddr")
        iv = ctx / "monitoring_attrs/intervals"
        _write(iv / "sample_us", intervals.sample_us)
        _write(iv / "aggr_us", intervals.aggr_us)
        _write(iv / "update_us", intervals.update_us)
        goal_dir = iv / "intervals_goal"
        if intervals_goal is not None and goal_dir.is_dir():
            _write(goal_dir / "access_bp", intervals_goal.access_bp)
            _write(goal_dir / "aggrs", intervals_goal.aggrs)
            _write(goal_dir / "min_sample_us", intervals_goal.min_sample_us)
            _write(goal_dir / "max_sample_us", intervals_goal.max_sample_us)
            kd.autotuned = True
        nr = ctx / "monitoring_attrs/nr_regions"
        _write(nr / "min", min_nr_regions)
        _write(nr / "max", max_nr_regions)
        _write(ctx / "targets/nr_targets", 1)
        _write(ctx / "targets/0/pid_target", pid)
        kd._write_schemes(schemes)
        _write(kd.dir / "state", "on")
        turned_on = True
        kd.kdamond_pid = _read_int(kd.dir / "pid")
        if not kd.kdamond_pid or kd.kdamond_pid <= 0:
            raise DamonHpError(f"damon-hp: kdamond {plan.index} did not start (pid file says "
                               f"{kd.kdamond_pid})")
    except BaseException:
        # Undo only what we made (e.g. Ctrl-C right after `on`): the kdamond at our index
        # was turned on by this very call, and nr_kdamonds has been locked since.
        try:
            if turned_on and kd._live_pid() is not None:
                _write(kd.dir / "state", "off")
                for _ in range(200):
                    if kd._live_pid() is None:
                        break
                    time.sleep(0.05)
            if kd._live_pid() is None:
                _clear_idle_dir(admin, plan.index, pid)
        finally:
            ownership.remove_record(plan.index, run_dir, only=record)
        raise
    kd.record = ownership.OwnerRecord(**{**record.to_dict(), "kdamond_pid": kd.kdamond_pid})
    ownership.write_record(kd.record, run_dir)
    return kd


def reclaim_stale(run_dir: Path | None = None, admin: Path = ADMIN) -> list[str]:
    """Stop kdamonds left running by damon-hp agents that died; return what was done.

    A kdamond is stopped only when a record proves it ours (same boot, live kdamond pid equal
    to the recorded one) and the agent named in the record is gone. Records that prove
    nothing are deleted; their kdamonds, if any, are left alone.
    """
    done = []
    for index, rec in ownership.read_records(run_dir).items():
        if rec.this_boot() and rec.agent_alive():
            continue
        if rec.this_boot():
            kd = admin / "kdamonds" / str(index)
            try:
                state = _read(kd / "state")
            except OSError:
                state = "absent"
            pid = _read_int(kd / "pid", -1)
            targets = tuple(_read_int(t / "pid_target", 0) or 0
                            for t in _numbered_dirs(kd / "contexts/0/targets"))
            if state == "on" and rec.proves(index, pid, targets):
                _write(kd / "state", "off")
                for _ in range(200):  # the kdamond thread exits asynchronously
                    if _read(kd / "state") == "off":
                        break
                    time.sleep(0.05)
                done.append(f"stopped kdamond {index} (pid {pid}) left running by damon-hp "
                            f"agent pid {rec.agent_pid}, which is gone")
            elif state == "on":
                done.append(f"dropped the record of kdamond {index}: the kdamond running there "
                            f"(pid {pid}) is not the one damon-hp started, so it is left alone")
            if state != "absent":
                try:
                    _clear_idle_dir(admin, index, rec.target_pid)
                except DamonHpError as e:
                    done.append(f"could not clear idle kdamond {index}: {e}")
        ownership.remove_record(index, run_dir, only=rec)
    return done
