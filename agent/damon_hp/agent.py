"""One agent: one target, one access source, one policy state.

Each snapshot goes once through: snapshot -> observe -> decide -> act -> report.

    source.snapshot()        DAMON's view (damon/sources.py)
    pipeline.observe()       the target's virtual picture, first touch marked (pipeline.py)
    pipeline.decide()        pure policy: what to promote and demote (policy/)
    pipeline.act()           the only change to the target's memory (actuate.py), learnt from
    report.record_applied()  totals, timeline and action log (report.py)

The agent owns what it opens (the access source with its kdamond or tracefs instance, the
status record) and `close()` undoes it in reverse, whatever ended the loop. `lifecycle.run_agent`
is the one place that calls start, loop and close, for `run`, `attach` and the daemon.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

from damon_hp import actuate, procfs, report, stagecpu, status_records
from damon_hp.damon import KdamondStopped, ownership, revmap
from damon_hp.damon.events import EventStreamLost
from damon_hp.damon.model import IntervalsGoal, Recording, Snapshot
from damon_hp.damon.sources import AccessSource, MonitorSettings, open_source
from damon_hp.errors import DamonHpError
from damon_hp.options import AUTOTUNE_MAX_SAMPLE_US, AUTOTUNE_MIN_SAMPLE_US, AgentOptions
from damon_hp.pipeline import ProcessPipeline, params_for_source
from damon_hp.ranges import AddrRange, overlap_bytes
from damon_hp.signals import StopSignals

# Slow-changing readings are refreshed on these periods, not every snapshot: on the emulated
# test VM every /proc or sysfs open costs milliseconds the target and kdamond need more.
STATUS_EVERY_S = 2.0
THP_MODE_EVERY_S = 5.0
CPU_EVERY_S = 2.0

# Why an agent stopped while its target lives on: the target turned THP off for itself
# (prctl(PR_SET_THP_DISABLE)); the kernel refuses every collapse of its memory.
THP_DISABLED = "THP disabled by the target"


def _cpu_self_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class Agent:
    """One target, one access source, one policy state."""

    def __init__(self, target: actuate.Target, opts: AgentOptions, rep: report.RunReport,
                 stop: StopSignals) -> None:
        self.target = target
        self.files = procfs.ProcessFiles(target.pid)
        self.opts = opts
        self.report = rep
        self.stop = stop
        self.source: AccessSource | None = None
        self.pipeline: ProcessPipeline | None = None
        self.perf: Any = None  # perf.PerfSession while --perf counts
        self.hpstat: Any = None  # hpstat.HpStat while --trace counts
        self.params = opts.params
        self.recorded: list[Snapshot] = []
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        self.first_stat: procfs.Stat | None = None
        self.last_stat: procfs.Stat | None = None
        self._next_progress = self.started_at + opts.progress_every_s
        self._next_status = 0.0
        self._next_thp = 0.0
        self._next_cpu = 0.0
        self.thp_mode = procfs.thp_mode()

    # -- lifetime ----------------------------------------------------------------------------

    def start(self) -> None:
        m = self.opts.monitor
        goal = (
            IntervalsGoal(access_bp=400, aggrs=3,
                          min_sample_us=min(m.intervals.sample_us, AUTOTUNE_MIN_SAMPLE_US),
                          max_sample_us=max(m.intervals.sample_us, AUTOTUNE_MAX_SAMPLE_US))
            if m.autotune
            else None
        )
        settings = MonitorSettings(m.intervals, m.min_nr_regions, m.max_nr_regions, goal,
                                   m.pause_damon_stat)
        # open_source checks everything (ops, busy DAMON, stale kdamonds of dead agents)
        # before it writes; no separate pre-check, whose probe costs seconds in the test VM.
        self.source = open_source(m.source, self.target.pid, settings)
        info = self.source.info()
        self.report.source = info
        self.report.kdamond_pid = self.source.kdamond_pid
        owned = self.source.owned
        self.params = params_for_source(self.params, physical=self.source.physical,
                                        can_demote=owned is not None and not self.opts.dry_run)
        if self.source.physical:
            self.report.notes.append(
                f"{self.source.name} source: promotion needs {self.params.promote_min_accesses:g}"
                f" sampled accesses at {self.params.promote_rate_pct:g} % of DAMON's samples "
                "(physical regions mix frames of hot and cold pages, of every process)")
        if owned is not None and owned.autotuned:
            self.report.notes.append("DAMON interval auto-tuning is on (intervals_goal)")
        damos_collapse = actuate.use_damos_collapse(self.opts.collapse_with, owned)
        if damos_collapse:
            self.report.notes.append("promotions through the DAMOS collapse action")
        actuator = actuate.Actuator(self.target, self.files, owned, dry_run=self.opts.dry_run,
                                    damos_collapse=damos_collapse)
        self.pipeline = ProcessPipeline(self.target, self.files, self.params, actuator,
                                        physical=self.source.physical)
        if not self.opts.quiet:
            print(f"damon-hp: access source {report.describe_source(info)} ({info['reason']})",
                  file=sys.stderr, flush=True)
            for limit in info["limits"]:
                print(f"damon-hp:   limit: {limit}", file=sys.stderr, flush=True)
        try:
            self.first_stat = self.files.stat()
        except procfs.ProcessGone:
            pass
        self._start_measurements()
        status_records.remove_stale_statuses()
        self._write_status()

    def _start_measurements(self) -> None:
        """--perf / --trace: extra measurements of the target; a failure to start is a note."""
        if self.opts.perf:
            from damon_hp import perf  # imported only when asked: perf is not the agent's job

            try:
                self.perf = perf.PerfSession.start(self.target.pid)
            except DamonHpError as e:
                self._warn(f"--perf not counting: {e}")
        if self.opts.trace:
            from damon_hp import hpstat

            try:
                self.hpstat = hpstat.HpStat.start(pid=self.target.pid)
            except DamonHpError as e:
                self._warn(f"--trace not counting: {e}")

    def _stop_measurements(self) -> None:
        if self.perf is not None:
            try:
                self.report.extra["perf"] = self.perf.stop().to_json()
            except DamonHpError as e:
                self._warn(f"--perf: {e}")
            self.perf = None
        if self.hpstat is not None:
            try:
                summary = self.hpstat.stop()
                self.report.extra["trace"] = summary.total.headline()
                self.report.extra["trace_unavailable"] = list(summary.unavailable)
            except DamonHpError as e:
                self._warn(f"--trace: {e}")
            self.hpstat = None

    def _warn(self, text: str) -> None:
        print(f"damon-hp: {text}", file=sys.stderr, flush=True)
        self.report.notes.append(text)

    def close(self) -> None:
        """Close the source (our kdamond, our tracefs instance) and our records; idempotent."""
        try:
            self.last_stat = self.files.stat()  # a zombie's stat is still readable
        except (procfs.ProcessGone, OSError):
            pass
        try:
            self._stop_measurements()
        except Exception as e:  # never let a measurement keep our kdamond running
            self.report.notes.append(f"stopping measurements failed: {e}")
        try:
            if self.source is not None:
                self._read_kdamond_cpu()
                if self.pipeline is not None:
                    self.pipeline.actuator.fold_scheme_stats()
                    self.report.damos = self.pipeline.actuator.damos_totals
                self.source.close()
                self._settle_damos_collapses()
        finally:
            self.source = None
            self.files.close()
            status_records.remove_status()

    def _settle_damos_collapses(self) -> None:
        """Count the DAMOS collapses our kdamond applied after the last snapshot: it is
        stopped now, so what is huge among the pending ranges is final."""
        if self.pipeline is None or not self.report.timeline:
            return
        try:
            applied = self.pipeline.settle()
        except (procfs.ProcessGone, OSError, DamonHpError) as e:
            self.report.notes.append(f"DAMOS collapses after the last snapshot not counted: {e}")
            return
        if applied.damos_collapses:
            self.report.record_applied(applied, time.monotonic() - self.started_at,
                                       self.report.timeline[-1])

    # -- loop --------------------------------------------------------------------------------

    def loop(self, keep_going: Callable[[], bool] = lambda: True) -> str:
        """Run until the target exits, a stop signal arrives or `keep_going()` is False.

        Returns why it stopped: "target exit", a signal name, "kdamond stopped", "event
        stream lost" (someone changed our tracefs instance: said on stderr, not retried), or
        THP_DISABLED (the target disabled THP for itself: no collapse can succeed; looked at
        before every snapshot, since a program may do it any time after its start).
        """
        assert self.source is not None
        while True:
            if self.stop.signum is not None:
                return self.stop.name or "signal"
            if self.target.exited() or not keep_going():
                return "target exit"
            try:
                status = self.files.status()
            except procfs.ProcessGone:
                return "target exit"
            if procfs.thp_disabled_by_process(status):
                return THP_DISABLED
            # Peaks between snapshots too: a physical source may withhold every snapshot of a
            # short command (it faults its memory in), which left peak RSS unknown.
            self.report.observe_memory(None, status.vm_rss, status.vm_pte, final=False)
            try:
                assert self.pipeline is not None
                with self.pipeline.cpu.stage(stagecpu.EVENTS):
                    snap = self.source.snapshot()
            except KdamondStopped:
                return "target exit" if self.target.exited(0.5) else "kdamond stopped"
            except EventStreamLost as e:
                self._warn(str(e).removeprefix("damon-hp: "))
                return "event stream lost"
            except DamonHpError as e:
                if self.target.exited(0.1):
                    return "target exit"
                # A torn read; the next aggregation will be whole. Wait for it rather than
                # spin on a kdamond that keeps refusing.
                self.report.snapshot_errors += 1
                if str(e) not in self.report.notes and len(self.report.notes) < 20:
                    self.report.notes.append(f"snapshot failed (retried): {e}")
                time.sleep(self.report.source.get("aggr_us", 1_000_000) / 1e6)
                continue
            if snap is None:
                self._tick()
                continue
            try:
                self.step(snap)
            except (procfs.ProcessGone, revmap.ProcessGone):
                return "target exit"

    def step(self, snap: Snapshot) -> None:
        """Everything done with one snapshot: observe, decide, act, record, report."""
        assert self.pipeline is not None
        rep = self.report
        rep.snapshots += 1
        if not snap.regions:
            rep.empty_snapshots += 1
        obs = self.pipeline.observe(snap)
        if self.opts.record_path:
            # The policy's input, so a replay sees what it saw: virtual regions (reverse-mapped
            # for physical sources) with the first-touch ranges marked.
            self.recorded.append(obs.snapshot)
        now = time.monotonic()
        if now >= self._next_thp:
            self.thp_mode = procfs.thp_mode()
            self._next_thp = now + THP_MODE_EVERY_S
        rep.thp_mode = self.thp_mode
        decision = self.pipeline.decide(obs, self.thp_mode)
        applied = self.pipeline.act(decision, snap.taken_at_s)
        rep.monitored_share = obs.monitored_share
        rep.unsteady_readings = self.pipeline.unsteady_readings
        frames = self.pipeline.frames
        if frames is not None:
            rep.pagemap_reads = {"ranges_read": frames.ranges_read,
                                 "ranges_reused": frames.ranges_reused,
                                 "windows_read": frames.windows_read,
                                 "windows_verified": frames.windows_verified,
                                 "scans_skipped": frames.scans_skipped,
                                 "scans_spared": frames.scans_spared,
                                 "scans_narrowed": frames.scans_narrowed}
        status = obs.status
        entry = report.TimelineEntry(
            t_s=snap.taken_at_s - self.started_at,
            monotonic_s=snap.taken_at_s,
            nr_regions=len(obs.snapshot.regions),
            hot_bytes=decision.hot_bytes,
            hot_huge_bytes=None,
            huge_bytes=None,
            rss_bytes=status.vm_rss,
            promoted_bytes=self.pipeline.state.promoted_bytes,
            demoted=len(decision.demote),
            held_by_budget=decision.held_by_budget,
            held_by_rate=decision.held_by_rate,
            held_by_residency=decision.held_by_residency,
            planned=len(decision.promote),
        )
        entry.monitored_share = obs.monitored_share
        entry.source_regions = len(snap.regions)
        if frames is not None:
            entry.frame_extents = frames.extent_count
        entry.unsteady = decision.unsteady
        rep.record_applied(applied, time.monotonic() - self.started_at, entry)
        with self.pipeline.cpu.stage(stagecpu.MEASURE):
            self._measure(entry, decision.hot_regions, obs.mappings, applied)
        rep.monitoring_cpu_by_stage = self.pipeline.cpu.to_dict()
        entry.stage_cpu_s = round(sum(rep.monitoring_cpu_by_stage.values()), 4)
        entry.stage_cpu_by_stage_s = dict(rep.monitoring_cpu_by_stage)
        rep.observe_hot(entry.hot_bytes, entry.hot_huge_bytes)
        rep.observe_memory(entry.huge_bytes, status.vm_rss, status.vm_pte)
        rep.timeline.append(entry)
        if now >= self._next_cpu:
            self.last_stat = self.files.stat()
            self._read_kdamond_cpu()
            self._next_cpu = now + CPU_EVERY_S
        self._tick()

    def _measure(self, entry: report.TimelineEntry, hot: tuple[AddrRange, ...],
                 mappings: list[AddrRange], applied: actuate.Applied) -> None:
        """What the target holds after this snapshot's actions."""
        # One PAGEMAP_SCAN of the private anonymous mappings for both numbers: anonymous huge
        # pages live only there, so their PMD-mapped bytes are smaps_rollup's AnonHugePages,
        # whose read walked every page with its rmap counts (~30 ms per 4 GiB target on the
        # CI host, the agent's largest cost per snapshot after the reverse map). After a
        # snapshot that did nothing, the frame reader's own scan of this aggregation answers.
        known = (self.pipeline.huge_as_read(applied, mappings)
                 if self.pipeline is not None else None)
        try:
            huge = known if known is not None else self.files.huge_regions_in(mappings)
        except procfs.PagemapScanUnsupported:
            entry.huge_bytes = self.files.rollup().get("AnonHugePages")
            entry.hot_huge_bytes = None if hot else 0
        else:
            entry.huge_bytes = sum(r.size for r in huge)
            entry.hot_huge_bytes = overlap_bytes(hot, huge)
        if self.files.stat().exiting:
            # Measured while exit was unmapping the target: its huge pages read as gone, which
            # says nothing about the agent. The previous entry stays the final word.
            raise procfs.ProcessGone(f"pid {self.target.pid} is exiting")

    # -- bookkeeping -------------------------------------------------------------------------

    def _read_kdamond_cpu(self) -> None:
        # A passive source's kdamond is not ours: its CPU time is its owner's cost.
        if self.source is None or self.source.name == "passive" or not self.source.kdamond_pid:
            return
        try:
            self.report.kdamond_cpu_s = procfs.read_stat(self.source.kdamond_pid).cpu_s
        except (procfs.ProcessGone, OSError):
            pass

    def _tick(self) -> None:
        now = time.monotonic()
        if not self.opts.quiet and self.opts.progress_every_s > 0 and now >= self._next_progress:
            print(report.format_progress(self.report), file=sys.stderr, flush=True)
            self._next_progress = now + self.opts.progress_every_s
        if now >= self._next_status:
            self._write_status()
            self._next_status = now + STATUS_EVERY_S

    def _write_status(self) -> None:
        r = self.report
        try:
            status_records.write_status({
                "agent_pid": os.getpid(),
                "agent_start_ticks": ownership.process_start_ticks(os.getpid()),
                "mode": r.mode,
                "target_pid": self.target.pid,
                "command": r.command,
                "since": self.started_wall,
                "source": r.source,
                "kdamond_pid": r.kdamond_pid,
                "snapshots": r.snapshots,
                "promotions": r.collapse.ok,
                "collapses_tried": r.collapse.tried,
                "collapse_errors": dict(r.collapse.errors),
                "promoted_bytes": (self.pipeline.state.promoted_bytes
                                   if self.pipeline is not None else 0),
                "collapsed_bytes": r.collapse.bytes,
                "demotions": r.demotions,
                "anon_huge_bytes": r.final_huge_bytes,
                "hot_bytes": r.hot_bytes,
                "updated": time.time(),
            })
        except OSError:
            pass  # status is a convenience; never let it stop the agent

    def finish_report(self) -> None:
        """Fill the totals that are read once at the end."""
        r = self.report
        r.wall_s = time.monotonic() - self.started_at
        r.agent_cpu_s = _cpu_self_s()
        if r.target_cpu_s is None and self.first_stat and self.last_stat:
            r.target_cpu_s = self.last_stat.cpu_s - self.first_stat.cpu_s
            r.minflt = self.last_stat.minflt - self.first_stat.minflt
            r.majflt = self.last_stat.majflt - self.first_stat.majflt
            r.notes.append("target CPU time and faults count from attach to the last snapshot")

    def save_recording(self) -> None:
        if not self.opts.record_path:
            return
        rec = Recording(
            kernel=os.uname().release,
            command="damon-hp " + " ".join(sys.argv[1:]),
            snapshots=tuple(self.recorded),
            note=f"recorded by damon-hp {self.report.mode} on pid {self.target.pid} "
                 f"(source {self.report.source.get('name')})",
        )
        rec.save(self.opts.record_path)
