"""Kdamonds damon-hp starts: start, change schemes, read snapshots, stop. Nothing else here.

- `start_vaddr(pid)` creates and starts a kdamond watching one process and returns an
  `OwnedKdamond`, the only handle through which a kdamond is changed or stopped. It refuses,
  before writing anything, while a kdamond damon-hp did not start runs (see placement.py).
- `start_vaddr_multi(pids)` (the daemon) starts one with a vaddr target per pid;
  `OwnedKdamond.set_targets` commits a new target list while it runs (targets.py).
- `reclaim_stale()` stops kdamonds left running by damon-hp agents that died, only when an
  ownership record proves them ours.

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

How a scheme is laid out in sysfs is in schemes.py; every other write to a kdamond of ours is
here, so one module holds a kdamond's whole life (start, snapshots, targets, stop, reclaim
after a crash).
"""

from __future__ import annotations

import errno
import time
from pathlib import Path

from .. import procfs
from ..errors import DamonHpError, EnvironmentProblem
from ..vmguard import require_vm
from . import io, ownership
from .io import ADMIN
from .model import (
    PHYSICAL,
    VIRTUAL,
    AddrRange,
    Intervals,
    IntervalsGoal,
    Region,
    Scheme,
    SchemeStats,
    Snapshot,
)
from .placement import plan_start
from .schemes import SNAPSHOT_SCHEME, write_schemes
from .status import detect_features, kernel_release, probe


class KdamondStopped(DamonHpError):
    """Our kdamond is no longer running (its target exited, or someone turned it off)."""


class OwnedKdamond:
    """A kdamond damon-hp started: the only handle that changes or stops one.

    Scheme 0 is always the snapshot scheme (action `stat` over everything); the caller's schemes
    follow it, so `scheme_stats()[i]` is the caller's `schemes[i]`.
    """

    def __init__(self, index: int, target_pid: int, intervals: Intervals,
                 schemes: tuple[Scheme, ...], autotuned: bool, record_dir: Path | None,
                 admin: Path = ADMIN, ops: str = "vaddr") -> None:
        self.index = index
        self.ops = ops
        self.target_pid = target_pid
        # every target, in the context's order (target_id i is target_pids[i]); paddr: (0,)
        self.target_pids: tuple[int, ...] = (target_pid,)
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

    def live_pid(self) -> int | None:
        try:
            state = io.read(self.dir / "state")
        except OSError:
            return None
        pid = io.read_int(self.dir / "pid", -1)
        return pid if state == "on" and pid and pid > 0 else None

    def is_running(self) -> bool:
        """True while the kdamond we started still runs (False once the target has exited)."""
        return self.kdamond_pid is not None and self.live_pid() == self.kdamond_pid

    def _require_running(self) -> None:
        if not self.is_running():
            raise KdamondStopped(
                f"damon-hp: kdamond {self.index} (pid {self.kdamond_pid}) is no longer running; "
                f"target pid {self.target_pid} has probably exited")

    def _state(self, keyword: str) -> None:
        self._require_running()
        io.write(self.dir / "state", keyword)

    @property
    def features(self) -> dict[str, bool]:
        return detect_features(self.ctx, kernel_release())[0]

    # -- reading -------------------------------------------------------------------------

    def _current_intervals(self) -> tuple[int, int]:
        if self.autotuned:
            # Auto-tuning moves the intervals; sysfs shows the tuned ones only when asked.
            self._state("update_tuned_intervals")
            iv = self.ctx / "monitoring_attrs/intervals"
            return (io.read_int(iv / "sample_us", self.intervals.sample_us) or 1,
                    io.read_int(iv / "aggr_us", self.intervals.aggr_us) or 1)
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
                if io.numbered_dirs(self.ctx / "schemes/0/tried_regions"):
                    return
            elif (io.read_int(total, 0) or 0) > 0:
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
                for rdir in io.numbered_dirs(tried):
                    regions.append(Region(int(io.read(rdir / "start")), int(io.read(rdir / "end")),
                                          int(io.read(rdir / "nr_accesses")),
                                          int(io.read(rdir / "age"))))
                total = io.read_int(tried / "total_bytes")
            except (OSError, ValueError):
                continue  # the kernel replaced the dirs while we read them: ask again
            if total is not None and total != sum(r.end - r.start for r in regions):
                continue  # torn read: a snapshot is returned whole or not at all
            regions.sort(key=lambda r: r.start)
            return Snapshot(taken, self.target_pid, sample_us, aggr_us, tuple(regions),
                            space=PHYSICAL if self.ops == "paddr" else VIRTUAL)
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
        return io.read_int(self.ctx / f"schemes/{scheme}/tried_regions/total_bytes", 0) or 0

    def scheme_stats(self) -> list[SchemeStats]:
        """Counters of the caller's schemes (not the snapshot scheme), in their order."""
        self._state("update_schemes_stats")
        out = []
        for i in range(1, 1 + len(self.schemes)):
            st = self.ctx / f"schemes/{i}/stats"
            out.append(SchemeStats(*(io.read_int(st / n, 0) or 0 for n in
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
            io.write(f, action)
        except DamonHpError as e:
            cause = e.__cause__
            if isinstance(cause, OSError) and cause.errno == errno.EINVAL:
                return False
            raise
        finally:
            io.write(f, SNAPSHOT_SCHEME.action)
        return True

    def set_schemes(self, schemes: list[Scheme] | tuple[Scheme, ...]) -> None:
        """Replace the caller's schemes on the running kdamond (online `commit`).

        Monitoring continues; DAMOS stats of the replaced schemes start again from zero.
        """
        self._require_running()
        schemes = tuple(schemes)
        write_schemes(self.ctx, schemes, self.intervals.sample_us)
        self._state("commit")
        self.schemes = schemes

    def set_targets(self, pids: tuple[int, ...]) -> tuple[float, float]:
        """Replace the running vaddr kdamond's targets (online `commit`); returns the
        CLOCK_MONOTONIC times the commit was written and returned (targets.TargetMap).

        Linux 6.12 applies the list by position and keeps each slot's regions (targets.py).
        A pid that no longer exists when the kdamond applies the commit makes it stop (6.12:
        the failed commit ends the kdamond thread, and the write still returns success; 7.3:
        the write fails with EINVAL and the kdamond runs on, so it is stopped here):
        KdamondStopped is raised then, and the caller starts a new kdamond.
        """
        if not pids:
            raise ValueError("a running kdamond needs at least one target; stop it instead")
        self._require_running()
        if self.record is not None and self.record.target_pid != pids[0]:
            # The record names a target, first: what lets the next start clear this dir once
            # the kdamond has stopped on its own (every target exited) and we are gone.
            rec = ownership.OwnerRecord(**{**self.record.to_dict(), "target_pid": pids[0]})
            ownership.write_record(rec, self._record_dir)
            self.record = rec
        tdir = self.ctx / "targets"
        io.write(tdir / "nr_targets", len(pids))
        for i, pid in enumerate(pids):
            io.write(tdir / f"{i}/pid_target", pid)
        # The dir holds these now, committed or not: stop() clears a dir only while it holds
        # what we wrote (7.3's refused commit leaves them written; seen in the vm tier).
        self.target_pids = pids
        written = time.monotonic()
        try:
            self._state("commit")
        except DamonHpError as e:
            gone = [p for p in pids if not procfs.pid_exists(p)]
            if self.is_running() and gone and isinstance(e.__cause__, OSError) \
                    and e.__cause__.errno == errno.EINVAL:
                # 7.3 refuses such a commit (EINVAL) and runs on with the old targets, where
                # 6.12 stopped: stop it, so that callers see one behaviour on both.
                self.stop()
                raise KdamondStopped(f"damon-hp: kdamond {self.index} refused targets "
                                     f"{list(pids)}: pid(s) {gone} had exited; stopped it") from e
            if self.is_running():
                raise
            raise KdamondStopped(f"damon-hp: kdamond {self.index} stopped when given targets "
                                 f"{list(pids)} (one had exited, probably)") from e
        settled = time.monotonic()
        self.target_pid = pids[0]
        if not self.is_running():
            raise KdamondStopped(f"damon-hp: kdamond {self.index} stopped when given targets "
                                 f"{list(pids)} (one had exited, probably)")
        return written, settled

    # -- stopping ------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop our kdamond (only if its live pid is still ours) and remove our traces.

        Safe to call twice, and after the kdamond stopped on its own because the target exited.
        """
        live = self.live_pid()
        if live is not None and live == self.kdamond_pid:
            io.turn_off(self.dir, lambda: self.live_pid() is not None)
        if self.live_pid() is None:
            _clear_idle_dir(self._admin, self.index, self.target_pids)
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


def _clear_idle_dir(admin: Path, index: int, target_pids: tuple[int, ...]) -> None:
    """Leave no configuration behind for an idle kdamond dir we configured.

    When every kdamond dir is idle and ours or empty, all dirs go (nr_kdamonds 0), as before
    damon-hp started. Otherwise only our dir's contexts go; other dirs are not ours to touch.
    """
    kd = admin / "kdamonds" / str(index)
    try:
        if io.read(kd / "state") != "off":
            return
        targets = [io.read_int(t / "pid_target", 0) for t in
                   io.numbered_dirs(kd / "contexts/0/targets")]
    except OSError:
        return
    if targets and targets != list(target_pids):
        return  # someone reconfigured it after our kdamond stopped: theirs now
    others = [d for d in io.numbered_dirs(admin / "kdamonds") if d.name != str(index)]
    try:
        others_idle_empty = all(
            io.read(d / "state") == "off" and not io.numbered_dirs(d / "contexts") for d in others)
    except OSError:
        others_idle_empty = False
    if others_idle_empty:
        io.write(admin / "kdamonds/nr_kdamonds", 0)
    else:
        io.write(kd / "contexts/nr_contexts", 0)


def system_ram_ranges(iomem: str = "/proc/iomem") -> list[AddrRange]:
    """Every top-level `System RAM` range of /proc/iomem, page-aligned inwards (root sees real
    addresses; others read zeros, which give no range)."""
    out = []
    with open(iomem) as f:
        for line in f:
            if line.startswith(" ") or not line.rstrip().endswith(": System RAM"):
                continue
            lo, _, hi = line.split(" : ")[0].partition("-")
            start = -(-int(lo, 16) // 4096) * 4096
            end = (int(hi, 16) + 1) // 4096 * 4096
            if end > start:
                out.append(AddrRange(start, end))
    return out


def _write_regions(rdir: Path, ranges: list[AddrRange]) -> None:
    # A paddr target with no regions monitors nothing (Linux 6.12 at least: not one
    # damon_aggregated event, tried_regions empty), and DAMON's sysfs has no default for it.
    if not ranges:
        raise EnvironmentProblem("damon-hp: /proc/iomem lists no System RAM (are you root?); "
                                 "a paddr kdamond needs physical ranges to monitor")
    io.write(rdir / "nr_regions", len(ranges))
    for i, r in enumerate(ranges):
        io.write(rdir / f"{i}/start", r.start)
        io.write(rdir / f"{i}/end", r.end)


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
    if ownership.process_start_ticks(pid) is None:
        raise EnvironmentProblem(f"damon-hp: no process with pid {pid}")
    return _start("vaddr", (pid,), intervals or Intervals(), min_nr_regions, max_nr_regions,
                  tuple(schemes), intervals_goal, run_dir, admin)


def start_vaddr_multi(pids: tuple[int, ...], intervals: Intervals | None = None,
                      min_nr_regions: int = 10, max_nr_regions: int = 1000, *,
                      run_dir: Path | None = None, admin: Path = ADMIN) -> OwnedKdamond:
    """One kdamond of ours with one vaddr target per pid (target_id i is pids[i]), for the
    daemon; `OwnedKdamond.set_targets` changes them while it runs. No schemes, no
    auto-tuning (the event stream needs fixed intervals). Raises like `start_vaddr`."""
    if not pids:
        raise ValueError("start_vaddr_multi needs at least one pid")
    for pid in pids:
        if ownership.process_start_ticks(pid) is None:
            raise EnvironmentProblem(f"damon-hp: no process with pid {pid}")
    return _start("vaddr", tuple(pids), intervals or Intervals(), min_nr_regions,
                  max_nr_regions, (), None, run_dir, admin)


def start_paddr(intervals: Intervals | None = None, min_nr_regions: int = 10,
                max_nr_regions: int = 1000, intervals_goal: IntervalsGoal | None = None, *,
                run_dir: Path | None = None, admin: Path = ADMIN) -> OwnedKdamond:
    """Start a kdamond over physical memory (every System RAM range), owned by damon-hp.

    For kernels without vaddr: it watches every process at once, so its snapshots say which
    physical frames are accessed; a reverse map (revmap.py) gives one process's share. It takes
    no schemes: DAMOS actions on paddr act on every process's memory, not one target's.
    """
    return _start("paddr", (0,), intervals or Intervals(), min_nr_regions, max_nr_regions, (),
                  intervals_goal, run_dir, admin)


def _start(ops: str, pids: tuple[int, ...], intervals: Intervals, min_nr_regions: int,
           max_nr_regions: int,
           schemes: tuple[Scheme, ...], intervals_goal: IntervalsGoal | None,
           run_dir: Path | None, admin: Path) -> OwnedKdamond:
    if not 3 <= min_nr_regions <= max_nr_regions:
        raise EnvironmentProblem(
            f"damon-hp: need 3 <= min_nr_regions ({min_nr_regions}) <= max_nr_regions "
            f"({max_nr_regions})")
    reclaim_stale(run_dir=run_dir, admin=admin)
    status = probe(admin, run_dir)
    plan = plan_start(status, ops)

    # What this call changed, so that a failure undoes exactly that and no more: DAMON sysfs
    # that stays busy (EBUSY) can fail the very first write, and a cleanup write then would
    # only wait out the same busy spell again.
    created_dirs = configured = turned_on = False
    pid = pids[0]
    record = ownership.OwnerRecord.for_this_agent(plan.index, pid)
    kd = OwnedKdamond(plan.index, pid, intervals, schemes, False, run_dir, admin, ops)
    kd.target_pids = pids
    try:
        if plan.set_nr_kdamonds is not None:
            # Re-read right before the one write that affects every kdamond dir.
            if probe(admin, run_dir).running:
                raise EnvironmentProblem("damon-hp: a kdamond started while damon-hp was "
                                         "preparing its own; try again")
            io.write(admin / "kdamonds/nr_kdamonds", plan.set_nr_kdamonds)
            created_dirs = True
        # Provisional record first: if we die between `on` and the final record, the next start
        # can still prove (by start time and target) that the kdamond is ours.
        ownership.write_record(record, run_dir)
        io.write(kd.dir / "contexts/nr_contexts", 1)
        configured = True
        ctx = kd.ctx
        io.write(ctx / "operations", ops)
        iv = ctx / "monitoring_attrs/intervals"
        io.write(iv / "sample_us", intervals.sample_us)
        io.write(iv / "aggr_us", intervals.aggr_us)
        io.write(iv / "update_us", intervals.update_us)
        goal_dir = iv / "intervals_goal"
        if intervals_goal is not None and goal_dir.is_dir():
            io.write(goal_dir / "access_bp", intervals_goal.access_bp)
            io.write(goal_dir / "aggrs", intervals_goal.aggrs)
            io.write(goal_dir / "min_sample_us", intervals_goal.min_sample_us)
            io.write(goal_dir / "max_sample_us", intervals_goal.max_sample_us)
            kd.autotuned = True
        nr = ctx / "monitoring_attrs/nr_regions"
        io.write(nr / "min", min_nr_regions)
        io.write(nr / "max", max_nr_regions)
        io.write(ctx / "targets/nr_targets", len(pids))
        if ops != "paddr":
            for i, p in enumerate(pids):
                io.write(ctx / f"targets/{i}/pid_target", p)
        else:
            _write_regions(ctx / "targets/0/regions", system_ram_ranges())
        write_schemes(ctx, schemes, intervals.sample_us)
        io.write(kd.dir / "state", "on")
        turned_on = True
        kd.kdamond_pid = io.read_int(kd.dir / "pid")
        if not kd.kdamond_pid or kd.kdamond_pid <= 0:
            raise DamonHpError(f"damon-hp: kdamond {plan.index} did not start (pid file says "
                               f"{kd.kdamond_pid})")
    except BaseException:
        # Undo only what we made (e.g. Ctrl-C right after `on`): the kdamond at our index
        # was turned on by this very call, and nr_kdamonds has been locked since.
        undone = False
        try:
            if turned_on and kd.live_pid() is not None:
                io.turn_off(kd.dir, lambda: kd.live_pid() is not None)
            if (created_dirs or configured) and kd.live_pid() is None:
                _clear_idle_dir(admin, plan.index, pids)
            undone = True
        finally:
            # A record that outlives a failed undo lets the next start prove the leftover
            # ours, stop it and reuse its dir; without one it would read as someone else's.
            if undone:
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
                state = io.read(kd / "state")
            except OSError:
                state = "absent"
            pid = io.read_int(kd / "pid", -1)
            targets = tuple(io.read_int(t / "pid_target", 0) or 0
                            for t in io.numbered_dirs(kd / "contexts/0/targets"))
            proven = state == "on" and rec.proves(index, pid, targets)
            if proven:
                state_file = kd / "state"
                io.turn_off(kd, lambda f=state_file: io.read(f) != "off")
                done.append(f"stopped kdamond {index} (pid {pid}) left running by damon-hp "
                            f"agent pid {rec.agent_pid}, which is gone")
            elif state == "on":
                done.append(f"dropped the record of kdamond {index}: the kdamond running there "
                            f"(pid {pid}) is not the one damon-hp started, so it is left alone")
            if state != "absent":
                try:
                    # Targets of a daemon's kdamond change while it runs: the proven one's are
                    # the ones read just before stopping it; one that stopped on its own
                    # (every target exited) lists the record's pid (set_targets records one of
                    # the new list before writing it, a survivor of the old where there is one).
                    ours = proven or rec.target_pid in targets
                    _clear_idle_dir(admin, index, targets if ours else (rec.target_pid,))
                except DamonHpError as e:
                    done.append(f"could not clear idle kdamond {index}: {e}")
        ownership.remove_record(index, run_dir, only=rec)
    return done



def stop_unowned_in_vm(index: int, admin: Path = ADMIN) -> bool:
    """Test VM only: turn off kdamond `index` although damon-hp did not start it.

    For the experiment runner, which starts damo's kdamond for the DAMOS-ethp arm (and stops
    one a crashed arm left behind) so that the next run starts from a free DAMON. Returns
    whether the kdamond is off now. Refused outside the VM: there it is someone else's.
    """
    require_vm(f"stop kdamond {index}, which damon-hp did not start,")
    kd = admin / "kdamonds" / str(index)
    if io.read(kd / "state") != "on":
        return True
    return io.turn_off(kd, lambda: io.read(kd / "state") != "off")


def clear_all_in_vm(admin: Path = ADMIN) -> None:
    """Test VM only: remove every idle kdamond dir (nr_kdamonds 0), as after a fresh boot."""
    require_vm("remove DAMON's kdamond directories")
    nr = admin / "kdamonds/nr_kdamonds"
    if nr.exists() and io.read_int(nr, 0) != 0:
        io.write(nr, 0)
