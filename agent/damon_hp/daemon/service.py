"""The daemon's loop: one access stream for every managed process.

The stream (config `source`; auto picks the first that works here):
- vaddr: ONE kdamond of ours with one vaddr target per managed process (daemon/vaddr.py),
  its targets committed online as processes come and go; each round has the newest virtual
  snapshot of each target.
- paddr / passive: the machine-wide physical stream (our paddr kdamond, or a foreign one read
  passively); each round has one whole aggregation, reverse-mapped onto every process.

Each round (rounds.py) looks at every managed process, reverse-maps a physical aggregation
onto all of them in one pass, lets each decide, admits the candidates of all under the
budgets, then acts. The per-process pipeline (pipeline.py) is the one `run` and `attach` use:
the reverse map with its frame cache, first-touch withholding, the policy, the actuator. What
the daemon tells (journal lines, status records, the summary, --json) is reporting.py's.

Between rounds: a managed process that exited is let go at once (its pidfd is polled every loop
iteration), /proc is rescanned every `scan_every_s` (new matches are managed, processes no
longer selected let go, and the vaddr kdamond's targets follow), SIGHUP reloads the config (a bad
one is refused with its line, the old one keeps running), SIGTERM/SIGINT stop. Whatever ends
the loop, `close()` removes our tracefs instance, stops our kdamond (vaddr, paddr) and
removes every status record of ours.

A managed process that has turned THP off for itself (prctl PR_SET_THP_DISABLE) is skipped,
not let go: the kernel would refuse every collapse of its memory, so it gets no decision and no
collapse; the journal says so once, its status record and the --json report carry the reason
(`skipped`), and it is managed again as soon as it allows THP (its status is read each round).

What this slice does not do: DAMOS hugepage/nohugepage marks (promotion is by
MADV_COLLAPSE alone, with every source), per-process policy thresholds.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import time
from typing import Any

from damon_hp import actuate, policy, procfs, report, stagecpu, status_records
from damon_hp.daemon import heap, reporting, rounds, selection
from damon_hp.daemon.config import DaemonConfig, load_config
from damon_hp.daemon.managed import Managed
from damon_hp.daemon.reporting import log
from damon_hp.daemon.vaddr import MultiTargetSource
from damon_hp.damon import ownership, placement, sources
from damon_hp.damon.events import EventStreamLost
from damon_hp.damon.model import Snapshot
from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.options import MonitorOptions
from damon_hp.pipeline import params_for_source

SCAN = "scan"      # the daemon's stages beside the pipeline's (stagecpu.py): /proc rescans,
STATUS = "status"  # and status records, journal summaries, --json
READ_TIMEOUT_S = 0.5  # how long one wait for the stream blocks: signals are seen this soon


def mem_total_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise EnvironmentProblem("damon-hp daemon: /proc/meminfo has no MemTotal")


Source = sources.ReverseMappedSource | MultiTargetSource


def open_source(request: sources.SourceRequest) -> Source:
    """Where DAMON is free with vaddr (auto, vaddr): our one kdamond with a target per process;
    else the machine-wide physical stream: our paddr kdamond where DAMON is free (auto,
    paddr), else a foreign paddr kdamond's events (auto, passive), bound to no process."""
    found = sources.probe_for(request, "damon-hp daemon")
    kind, why, _ = sources.choose_kind(request, found, "asked for in the config")
    m = MonitorOptions()
    mon = sources.MonitorSettings(m.intervals, m.min_nr_regions, m.max_nr_regions, None)
    if kind == "vaddr":
        placement.plan_start(found, "vaddr")  # refused now, not at the first process
        return MultiTargetSource(mon, why, log)
    if kind == "paddr":
        return sources.open_paddr(mon, why)
    return sources.open_passive(request, found, why)


class Service:
    def __init__(self, config: DaemonConfig, json_path: str | None = None) -> None:
        self.config = config
        self.json_path = json_path
        self.source: Source | None = None
        self.managed: dict[int, Managed] = {}
        self.start_ticks: int | None = None  # ours, for status records
        # (pid, start ticks) another agent manages: said once, tried again every scan
        self.refused: set[tuple[int, int]] = set()
        self.scanner = selection.Scanner()
        self.stop_signal: int | None = None
        self.reload_wanted = False
        self.rounds: list[dict[str, Any]] = []
        self.totals = {"rounds": 0, "collapses": 0, "collapsed_bytes": 0, "errors": 0,
                       "held_by_budget": 0, "held_by_rule": 0, "managed_ever": 0}
        self.mem_total = mem_total_bytes()
        self.started = time.monotonic()
        self.params = policy.PolicyParams()
        self._old_handlers: dict[int, Any] = {}
        self.source_info: dict[str, Any] | None = None
        self.start_cpu_s = 0.0  # the daemon's CPU when it began to watch (imports, set-up)
        self.cpu = stagecpu.StageCpu()
        """the daemon's CPU per stage: the shared stream, scans, status records, and the
        pipelines of processes let go (those managed now keep theirs until then)"""
        self.collapse_cpu_s = 0.0

    # -- signals -------------------------------------------------------------------------

    def _on_stop(self, signum: int, frame: object) -> None:
        self.stop_signal = self.stop_signal or signum

    def _on_hup(self, signum: int, frame: object) -> None:
        self.reload_wanted = True

    def install_signals(self) -> None:
        for sig, handler in ((signal.SIGTERM, self._on_stop), (signal.SIGINT, self._on_stop),
                             (signal.SIGHUP, self._on_hup)):
            self._old_handlers[sig] = signal.signal(sig, handler)

    def restore_signals(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    # -- budget --------------------------------------------------------------------------

    @property
    def budget_bytes(self) -> int | None:
        b = self.config.budget
        return None if b is None else b.bytes_of(self.mem_total)

    def rule_budgets(self) -> dict[str, int | None]:
        return {r.name: (None if r.budget is None else r.budget.bytes_of(self.mem_total))
                for r in self.config.include}

    # -- lifetime ------------------------------------------------------------------------

    def start(self) -> None:
        status_records.remove_stale_statuses()
        self.source = open_source(self.config.source)
        info = self.source_info = self.source.info()
        # No DAMOS marks in the daemon (promotion by MADV_COLLAPSE alone): nothing can demote.
        self.params = params_for_source(policy.PolicyParams(), physical=self.source.physical,
                                        can_demote=False)
        log(f"access source {report.describe_source(info)} ({info['reason']})")
        log(f"config {self.config.path}: {len(self.config.include)} rules, "
            f"{len(self.config.exclude)} exclude rules, budget "
            f"{report.fmt_bytes(self.budget_bytes) if self.budget_bytes is not None else 'none'}")
        self.rescan()
        self.start_cpu_s = reporting.own_cpu_s()

    def close(self) -> None:
        """Let go of every process, close the stream (tracefs instance, our kdamond), remove
        our status records; idempotent, never raises for one part failing."""
        for pid in list(self.managed):
            self.release(pid, "daemon stopping", quiet=True)
        src, self.source = self.source, None
        if src is not None:
            try:
                src.close()
            except DamonHpError as e:
                log(f"closing the access source: {e}")
        for path in ownership.run_dir().glob(f"agent-{os.getpid()}-*.json"):
            try:
                path.unlink()
            except OSError:
                pass

    def run(self) -> str:
        """Loop until a stop signal or lost monitoring; returns why it stopped."""
        assert self.source is not None
        next_scan = time.monotonic() + self.config.scan_every_s
        next_summary = time.monotonic() + self.config.summary_every_s
        # Status records change with a round (what a process holds, whether it is skipped) or a
        # reload (its rule); a rescan writes the record of a process it adopts itself. So they
        # are built after those, not on a timer (at 50 processes, building every record every
        # 2 s was 0.4 % of a core, docs/cost.md).
        status_due = True
        last_snapshot = time.monotonic()
        aggr_s = self.source.aggr_us / 1e6
        while self.stop_signal is None:
            if self.reload_wanted:
                self.reload_wanted = False
                self.reload()
                status_due = True
            self.release_exited()
            now = time.monotonic()
            if now >= next_scan:
                with self.cpu.stage(SCAN):
                    self.rescan()
                next_scan = now + self.config.scan_every_s
            try:
                with self.cpu.stage(stagecpu.EVENTS):
                    if isinstance(self.source, MultiTargetSource):
                        virt = self.source.snapshots(READ_TIMEOUT_S)
                        phys = None
                    else:
                        virt, phys = None, self._newest_snapshot()
            except EventStreamLost as e:
                log(str(e).removeprefix("damon-hp: "))
                return "event stream lost"
            now = time.monotonic()
            if phys is not None or virt:
                last_snapshot = now
                rounds.run_round(self, phys, virt)
                # what the round freed goes back to the kernel (~1 ms; heap.py says why)
                heap.release_free_heap()
                status_due = True
            elif now - last_snapshot > 2 * aggr_s + 2 and self._monitoring_lost():
                log(f"{self.source.kdamond_label} stopped: nothing left to read")
                return "kdamond stopped"
            if status_due:
                with self.cpu.stage(STATUS):
                    reporting.write_statuses(self)
                status_due = False
            if now >= next_summary:
                with self.cpu.stage(STATUS):
                    log(reporting.summary(self))
                    reporting.write_json(self)
                next_summary = now + self.config.summary_every_s
        return signal.Signals(self.stop_signal).name

    def _monitoring_lost(self) -> bool:
        assert self.source is not None
        if isinstance(self.source, MultiTargetSource):
            return self.source.stopped_unexpectedly()
        return not self.source.stream.kdamond_alive()

    def _newest_snapshot(self) -> Snapshot | None:
        assert isinstance(self.source, sources.ReverseMappedSource)
        stream = self.source.stream
        snap = stream.next_snapshot(READ_TIMEOUT_S)
        while snap is not None:
            newer = stream.next_snapshot(0)
            if newer is None:
                break
            snap = newer
        return snap

    # -- processes -----------------------------------------------------------------------

    def rescan(self) -> None:
        procs = self.scanner.scan(skip=(os.getpid(),))
        alive = {p.pid: p for p in procs}
        for pid, m in list(self.managed.items()):
            p = alive.get(pid)
            if m.target.exited() or p is None or p.start_ticks != m.info.start_ticks:
                self.release(pid, "exited")
        self.refused &= {(p.pid, p.start_ticks) for p in procs}
        chosen = selection.select(procs, self.config)
        for pid, m in list(self.managed.items()):
            rule = chosen.get(pid)
            if rule is None:
                self.release(pid, "no longer selected by the config")
            else:
                m.rule = rule.name
        for pid, rule in chosen.items():
            if pid not in self.managed:
                self._manage(alive[pid], rule.name)
        if isinstance(self.source, MultiTargetSource):
            try:
                self.source.set_targets(set(self.managed))
            except DamonHpError as e:
                # e.g. a process exited between the scan and the kdamond's start: next scan
                log(f"cannot give the kdamond its targets, trying again at the next scan: "
                    f"{str(e).removeprefix('damon-hp: ')}")

    def release_exited(self) -> None:
        """Let go of every managed process that has exited, at once rather than at the next
        rescan: its status record keeps other agents off its pid and `damon-hp status` lists
        it, so it must not outlive the process by more than about one aggregation, whatever
        `scan_every_s` is. One poll(2) over the pidfds (a pidfd turns readable when its process
        exits, zombie or reaped), each loop iteration, so at least every READ_TIMEOUT_S plus
        a round; poll, not select, for fds past FD_SETSIZE. The vaddr kdamond's targets follow
        at the rescan, as before: one commit per scan rather than one per exit."""
        if not self.managed:
            return
        fds = {m.target.pidfd: pid for pid, m in self.managed.items()}
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(0):
            self.release(fds[fd], "exited")

    def _manage(self, info: selection.ProcessInfo, rule: str) -> None:
        key = (info.pid, info.start_ticks)
        try:
            target = actuate.Target.open(info.pid)
        except EnvironmentProblem:
            return  # gone meanwhile
        assert self.source is not None
        try:
            m = Managed(info, rule, self.params, target, self.source.physical)
        except procfs.ProcessGone:
            target.close()
            return
        try:
            # Huge pages it has already (a daemon killed before us, an agent that let go)
            # count against the budget from the first round, before any of ours is admitted.
            m.huge_bytes = m.files.rollup().get("AnonHugePages")
            status = m.files.status()
        except procfs.ProcessGone:
            m.close()
            return
        try:
            other = status_records.claim_managed(
                reporting.status_record(self, m, self.source.info()),
                status_records.status_path(os.getpid(), m.pid))
        except (OSError, EnvironmentProblem) as e:
            m.close()
            log(f"not managing pid {info.pid} ({info.comm}): cannot write its status record, "
                f"which keeps other agents off it: {e}")
            return
        if other is not None:
            m.close()
            if key not in self.refused:
                self.refused.add(key)
                log(f"not managing pid {info.pid} ({info.comm}): "
                    f"{status_records.describe_agent(other)} manages it already; taking it "
                    "when that agent lets go")
            return
        self.refused.discard(key)
        self.managed[info.pid] = m
        self.totals["managed_ever"] += 1
        log(f"managing pid {info.pid} (rule {rule}): {info.command[:120]}")
        m.skip_if_thp_disabled(status)

    def release(self, pid: int, why: str, quiet: bool = False) -> None:
        """Let go of `pid`: its pipeline's CPU joins ours, its files close, its status record
        goes."""
        m = self.managed.pop(pid)
        self.cpu.merge(m.pipeline.cpu.seconds)
        m.close()
        try:
            status_records.status_path(os.getpid(), pid).unlink()
        except OSError:
            pass
        if not quiet:
            log(f"let go of pid {pid} (rule {m.rule}): {why}; it held "
                f"{report.fmt_bytes(m.state.promoted_bytes)} of damon-hp's huge pages")

    def reload(self) -> None:
        try:
            new = load_config(self.config.path)
        except DamonHpError as e:
            log(f"reload refused, still running the old config: "
                f"{str(e).removeprefix('damon-hp daemon: ')}")
            return
        if new.source != self.config.source:
            log(f"reload: source {new.source} needs a restart; keeping {self.config.source}")
            new = dataclasses.replace(new, source=self.config.source)
        self.config = new
        log(f"reloaded {new.path}: {len(new.include)} rules, {len(new.exclude)} exclude rules, "
            f"budget {report.fmt_bytes(self.budget_bytes) if new.budget else 'none'}")
        self.rescan()
