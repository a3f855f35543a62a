"""The agent loop: DAMON snapshot -> policy -> actions -> record, until the target exits or a stop.

`run_agent` is the one entry point for `run` and `attach`. It owns the lifetime of everything it
starts, in this order, and undoes it in reverse in a `finally`, whatever ends the loop (target
exit, SIGINT/SIGTERM/SIGHUP, an error in the agent itself):

    kdamond (our own, vaddr, on the target)  ->  status record (for `damon-hp status`)

A kdamond left behind by a SIGKILLed agent is stopped by the DAMON layer at the next start
(`sysfs.reclaim_stale`), only when its ownership record proves it ours.

Data flows one way: the snapshot goes to the pure `policy.decide`, its decision to `actuate`,
the outcomes back into the policy state, and everything into the `RunReport`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from damon_hp import actuate, policy, procfs, report
from damon_hp.damon import ownership, sysfs
from damon_hp.damon.model import Intervals, IntervalsGoal, Recording, Scheme, Snapshot
from damon_hp.errors import DamonHpError, EnvironmentProblem

MIB = 1 << 20
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Slow-changing readings are refreshed on these periods, not every snapshot: on the emulated
# test VM every /proc or sysfs open costs milliseconds the target and kdamond need more.
STATUS_EVERY_S = 2.0
THP_MODE_EVERY_S = 5.0
CPU_EVERY_S = 2.0

# --------------------------------------------------------------------------------------------
# options


# Monitoring defaults. DAMON samples one 4 KiB page per region per sampling interval and calls
# the region accessed when that page's accessed bit was set since the previous sample. A large
# buffer read at random -- the memory huge pages help most -- touches any one 4 KiB page rarely:
# a 256 MiB buffer at 1 M reads/s shows ~5 % at DAMON's 5 ms default but ~20 % at 20 ms, where
# it stands clearly apart from idle memory (0 %). DAMON's own interval auto-tuning (6.15+)
# lengthens the interval for the same reason. 20 samples per aggregation keep 5 % steps of
# access frequency; a snapshot every 0.4 s is plenty for decisions that cost a 2 MiB copy each.
SAMPLE_US = 20_000
AGGR_US = 400_000
# DAMON re-reads the target's mappings this often; its 60 s default would leave memory mapped
# after start (everything a program allocates after exec) unwatched for up to a minute.
UPDATE_US = 1_000_000
# Auto-tuning (6.15+) may move the sampling interval within these bounds (aggregation follows).
AUTOTUNE_MIN_SAMPLE_US = 5_000
AUTOTUNE_MAX_SAMPLE_US = 100_000


@dataclass(frozen=True)
class MonitorOptions:
    """How DAMON watches the target (see the defaults above for the reasons)."""

    intervals: Intervals = field(
        default_factory=lambda: Intervals(SAMPLE_US, AGGR_US, UPDATE_US)
    )
    min_nr_regions: int = 10
    max_nr_regions: int = 1000
    autotune: bool = True


@dataclass(frozen=True)
class AgentOptions:
    monitor: MonitorOptions = field(default_factory=MonitorOptions)
    params: policy.PolicyParams = field(default_factory=policy.PolicyParams)
    json_path: str | None = None
    record_path: str | None = None
    quiet: bool = False
    progress_every_s: float = 10.0
    dry_run: bool = False
    perf: bool = False
    trace: bool = False

    def to_dict(self) -> dict[str, Any]:
        m = self.monitor
        return {
            "sample_us": m.intervals.sample_us,
            "aggr_us": m.intervals.aggr_us,
            "update_us": m.intervals.update_us,
            "min_nr_regions": m.min_nr_regions,
            "max_nr_regions": m.max_nr_regions,
            "autotune": m.autotune,
            "policy": asdict(self.params),
            "dry_run": self.dry_run,
        }


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'256M' -> bytes (K, M, G, T are 1024-based; a bare number is bytes)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: use a number with an optional K, M, G or T suffix (256M)"
        )
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def parse_budget(text: str) -> tuple[int | None, float | None]:
    """--max-huge: '512M' -> (bytes, None); '25%' -> (None, 25.0)."""
    if text.strip().endswith("%"):
        try:
            pct = float(text.strip()[:-1])
        except ValueError:
            pct = -1.0
        if not 0 <= pct <= 100:
            raise argparse.ArgumentTypeError(f"{text!r}: a percentage of RSS must be 0..100%")
        return None, pct
    return parse_size(text), None


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return v


def _non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative number")
    return v


def add_options(parser: argparse.ArgumentParser) -> None:
    """Monitoring, policy and output options shared by `run` and `attach`."""
    d = policy.PolicyParams()
    mon = parser.add_argument_group(
        "monitoring (DAMON)",
        "DAMON samples one page per region every sampling interval and reports per region how "
        "many samples saw an access, once per aggregation interval.",
    )
    mon.add_argument("--sample-us", type=_positive_int, default=SAMPLE_US, metavar="US",
                     help=f"sampling interval (default {SAMPLE_US}: DAMON's 5000 sees a randomly "
                     "read buffer as barely accessed, since one 4 KiB page is rarely touched "
                     "within 5 ms)")
    mon.add_argument("--aggr-us", type=_positive_int, default=AGGR_US, metavar="US",
                     help=f"aggregation interval = one snapshot (default {AGGR_US}: 20 samples "
                     "per snapshot, so 5%% steps of access frequency)")
    mon.add_argument("--update-us", type=_positive_int, default=UPDATE_US, metavar="US",
                     help="how often DAMON re-reads the target's mappings (default 1000000; "
                     "DAMON's 60 s default would leave memory mapped after start unwatched "
                     "for up to a minute)")
    mon.add_argument("--min-regions", type=_positive_int, default=10, metavar="N",
                     help="minimum number of DAMON regions (default 10)")
    mon.add_argument("--max-regions", type=_positive_int, default=1000, metavar="N",
                     help="maximum number of DAMON regions (default 1000: 2 MiB resolution "
                     "over 2 GiB, with DAMON's ~1%% overhead)")
    mon.add_argument("--no-autotune", dest="autotune", action="store_false",
                     help="do not let DAMON tune the intervals (Linux 6.15+ intervals_goal; "
                     "by default on where the kernel has it, aiming at 4%% of samples seeing "
                     "an access with sampling between 5 and 100 ms)")
    pol = parser.add_argument_group(
        "policy", "A region is hot at --hot-pct access frequency and --min-age-s age; its "
        "fully covered 2 MiB ranges are collapsed after --promote-after hot snapshots over "
        "--promote-after-s seconds, and marked MADV_NOHUGEPAGE after --demote-after cold "
        "seconds.")
    pol.add_argument("--hot-pct", type=float, default=d.hot_access_pct, metavar="PCT",
                     help=f"access frequency that makes a region hot (default {d.hot_access_pct})")
    pol.add_argument("--min-age-s", type=_non_negative_float, default=d.min_hot_age_s,
                     metavar="S", help="age a hot region must have (default 0: hysteresis "
                     "filters noise instead)")
    pol.add_argument("--promote-after", type=_positive_int, default=d.promote_after_snapshots,
                     metavar="N", help="hot snapshots (one miss in a row tolerated) before a "
                     f"range is collapsed (default {d.promote_after_snapshots})")
    pol.add_argument("--promote-after-s", type=_non_negative_float, default=d.promote_after_s,
                     metavar="S", help="... spanning at least this many seconds (default "
                     f"{d.promote_after_s:g}: a sequential pass through memory is not hot memory)")
    pol.add_argument("--demote-after", type=_non_negative_float, default=d.demote_after_s,
                     metavar="S", help="seconds a promoted range must stay cold before it is "
                     f"marked MADV_NOHUGEPAGE (default {d.demote_after_s:g})")
    pol.add_argument("--max-huge", type=parse_budget, default=(None, None),
                     metavar="SIZE|PCT%",
                     help="budget of promoted memory: bytes (512M) or a share of RSS (25%%); "
                     "default: no budget")
    pol.add_argument("--collapse-rate", type=parse_size, default=d.collapse_bytes_per_s,
                     metavar="SIZE", help="bytes per second the agent may collapse "
                     "(default 256M: collapse copies memory and may compact)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", dest="json_path", metavar="FILE",
                     help="write the summary and a per-snapshot timeline as JSON to FILE")
    out.add_argument("--record", dest="record_path", metavar="FILE",
                     help="save every DAMON snapshot to FILE (a fixture for tests/unit)")
    out.add_argument("--perf", action="store_true",
                     help="count the target's TLB misses, faults, cycles with perf stat "
                     "(n/a where there is no PMU)")
    out.add_argument("--trace", action="store_true",
                     help="count huge-page, fault, compaction and TLB-flush events of the "
                     "target with the hpstat BPF tool (make bpf)")
    out.add_argument("--dry-run", action="store_true",
                     help="monitor and decide, but change nothing in the target (with --json, "
                     "the timeline shows what would have been promoted)")
    out.add_argument("-q", "--quiet", action="store_true",
                     help="no progress lines on stderr (the summary is still printed)")
    out.add_argument("--progress-s", type=_non_negative_float, default=10.0, metavar="S",
                     help="seconds between progress lines on stderr (default 10)")


def options_from_args(args: argparse.Namespace) -> AgentOptions:
    max_bytes, max_pct = args.max_huge
    try:
        intervals = Intervals(args.sample_us, args.aggr_us, args.update_us)
        params = policy.PolicyParams(
            hot_access_pct=args.hot_pct,
            min_hot_age_s=args.min_age_s,
            promote_after_snapshots=args.promote_after,
            promote_after_s=args.promote_after_s,
            demote_after_s=args.demote_after,
            max_huge_bytes=max_bytes,
            max_huge_rss_pct=max_pct,
            collapse_bytes_per_s=args.collapse_rate,
        )
    except ValueError as e:
        raise EnvironmentProblem(f"damon-hp: bad option: {e}") from e
    if args.min_regions < 3 or args.min_regions > args.max_regions:
        raise EnvironmentProblem(
            f"damon-hp: bad option: need 3 <= --min-regions ({args.min_regions}) <= "
            f"--max-regions ({args.max_regions})"
        )
    return AgentOptions(
        monitor=MonitorOptions(intervals, args.min_regions, args.max_regions, args.autotune),
        params=params,
        json_path=args.json_path,
        record_path=args.record_path,
        quiet=args.quiet,
        progress_every_s=args.progress_s,
        dry_run=args.dry_run,
        perf=getattr(args, "perf", False),
        trace=getattr(args, "trace", False),
    )


# --------------------------------------------------------------------------------------------
# environment checks


def require_root(command: str) -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            f"damon-hp {command}: needs root: DAMON's sysfs interface and process_madvise on "
            "another process need CAP_SYS_ADMIN. Run it with sudo."
        )


def vm_hint(argv: list[str]) -> str:
    inner = " ".join(["damon-hp", *argv]).replace("'", "")
    return f"To use a real DAMON, run it in the test VM: make vm-run CMD='.venv/bin/{inner}'"


def with_vm_hint(e: EnvironmentProblem, argv: list[str]) -> EnvironmentProblem:
    """Add where a usable DAMON is to a refusal that is about this system's DAMON."""
    text = str(e)
    if "DAMON" in text or "kdamond" in text:
        return EnvironmentProblem(f"{text}\n{vm_hint(argv)}")
    return e


# --------------------------------------------------------------------------------------------
# status records, read by `damon-hp status`


def status_path(agent_pid: int | None = None) -> Path:
    return ownership.run_dir() / f"agent-{agent_pid or os.getpid()}.json"


def write_status(rec: dict[str, Any]) -> None:
    path = status_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec) + "\n")
    os.replace(tmp, path)


def remove_status() -> None:
    try:
        status_path().unlink()
    except FileNotFoundError:
        pass


def remove_stale_statuses() -> None:
    """Drop the status records of agents that died without cleaning up (e.g. SIGKILL)."""
    for rec in read_statuses():
        if not rec["alive"]:
            try:
                Path(rec["path"]).unlink()
            except OSError:
                pass


def read_statuses() -> list[dict[str, Any]]:
    """Every agent status record, each with `alive` telling whether its agent still runs."""
    out = []
    for p in sorted(ownership.run_dir().glob("agent-*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        rec["alive"] = (
            ownership.process_start_ticks(int(rec.get("agent_pid", 0)))
            == rec.get("agent_start_ticks")
        )
        rec["path"] = str(p)
        out.append(rec)
    return out


# --------------------------------------------------------------------------------------------
# signals


class StopSignals:
    """Turns SIGINT/SIGTERM/SIGHUP into a flag the loop checks, so cleanup always runs."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: object) -> None:
        self.signum = self.signum or signum

    def install(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    @property
    def name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name


# --------------------------------------------------------------------------------------------
# the loop


def _cpu_self_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class Agent:
    """One target, one kdamond, one policy state."""

    def __init__(
        self,
        target: actuate.Target,
        opts: AgentOptions,
        rep: report.RunReport,
        stop: StopSignals,
    ) -> None:
        self.target = target
        self.files = procfs.ProcessFiles(target.pid)
        self.opts = opts
        self.report = rep
        self.stop = stop
        self.kd: sysfs.OwnedKdamond | None = None
        self.perf: Any = None  # perf.PerfSession while --perf counts
        self.hpstat: Any = None  # hpstat.HpStat while --trace counts
        self.state = policy.PolicyState()
        self.schemes: tuple[Scheme, ...] = ()
        self.damos_collapse = False
        self.pending_damos: dict[int, float] = {}
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
        # start_vaddr checks everything (vaddr, busy DAMON, stale kdamonds of dead agents) before
        # it writes; no separate pre-check, whose DAMON probe costs seconds in the test VM.
        try:
            self.kd = sysfs.start_vaddr(
                self.target.pid, m.intervals, m.min_nr_regions, m.max_nr_regions, (), goal
            )
        except EnvironmentProblem as e:
            raise with_vm_hint(e, sys.argv[1:]) from None
        self.report.kdamond_pid = self.kd.kdamond_pid
        if self.kd.autotuned:
            self.report.notes.append("DAMON interval auto-tuning is on (intervals_goal)")
        try:
            self.damos_collapse = self.kd.supports_action("collapse")
        except DamonHpError:
            self.damos_collapse = False
        if self.damos_collapse:
            self.report.notes.append("promotions through the DAMOS collapse action")
        try:
            self.first_stat = self.files.stat()
        except procfs.ProcessGone:
            pass
        self._start_measurements()
        remove_stale_statuses()
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
        """Stop our kdamond and remove our records; safe to call more than once."""
        try:
            self.last_stat = self.files.stat()  # a zombie's stat is still readable
        except (procfs.ProcessGone, OSError):
            pass
        try:
            self._stop_measurements()
        except Exception as e:  # never let a measurement keep our kdamond running
            self.report.notes.append(f"stopping measurements failed: {e}")
        try:
            if self.kd is not None:
                self._read_kdamond_cpu()
                if self.kd.is_running():
                    self._fold_scheme_stats()
                self.kd.stop()
        finally:
            self.kd = None
            self.files.close()
            remove_status()

    # -- loop --------------------------------------------------------------------------------

    def loop(self, keep_going: Callable[[], bool] = lambda: True) -> str:
        """Run until the target exits, a stop signal arrives or `keep_going()` is False.

        Returns why it stopped: "target exit", a signal name, or "kdamond stopped".
        """
        assert self.kd is not None
        while True:
            if self.stop.signum is not None:
                return self.stop.name or "signal"
            if self.target.exited() or not keep_going():
                return "target exit"
            try:
                snap = self.kd.snapshot()
            except sysfs.KdamondStopped:
                return "target exit" if self.target.exited(0.5) else "kdamond stopped"
            except DamonHpError as e:
                if not self.kd.is_running():
                    return "target exit" if self.target.exited(0.5) else "kdamond stopped"
                # A torn read; the next aggregation will be whole. Wait for it rather than
                # spin on a kdamond that keeps refusing.
                self.report.snapshot_errors += 1
                if str(e) not in self.report.notes and len(self.report.notes) < 20:
                    self.report.notes.append(f"snapshot failed (retried): {e}")
                time.sleep(self.opts.monitor.intervals.aggr_us / 1e6)
                continue
            try:
                self.step(snap)
            except procfs.ProcessGone:
                return "target exit"

    def step(self, snap: Snapshot) -> None:
        """Everything done with one snapshot."""
        rep = self.report
        if self.opts.record_path:
            self.recorded.append(snap)
        rep.snapshots += 1
        if not snap.regions:
            rep.empty_snapshots += 1
        maps = self.files.maps()
        status = self.files.status()
        now = time.monotonic()
        if now >= self._next_thp:
            self.thp_mode = procfs.thp_mode()
            self._next_thp = now + THP_MODE_EVERY_S
        mode = rep.thp_mode = self.thp_mode
        mappings = [policy.Span(m.start, m.end) for m in maps if m.anonymous_private]

        outcomes_damos = self._check_damos_collapses(snap.taken_at_s)
        if outcomes_damos:
            self.state = policy.record_outcomes(
                self.state, outcomes_damos, self.opts.params, time.monotonic()
            )
        decision, self.state = policy.decide(
            snap, self.state, self.opts.params,
            rss_bytes=status.vm_rss, mappings=mappings, thp_mode=mode,
        )
        entry = report.TimelineEntry(
            t_s=snap.taken_at_s - self.started_at,
            monotonic_s=snap.taken_at_s,
            nr_regions=len(snap.regions),
            hot_bytes=decision.hot_bytes,
            hot_huge_bytes=None,
            huge_bytes=None,
            rss_bytes=status.vm_rss,
            promoted_bytes=0,
            demoted=len(decision.demote),
            held_by_budget=decision.held_by_budget,
            held_by_rate=decision.held_by_rate,
            planned=len(decision.promote),
        )
        if decision.promote and not self.opts.dry_run:
            if self.damos_collapse:
                for start in decision.promote:
                    self.pending_damos[start] = snap.taken_at_s
            else:
                self._collapse(decision.promote, entry)
        for start in () if self.opts.dry_run else decision.demote:
            rep.demotions += 1
            rep.demoted_bytes += policy.HUGE_PAGE_BYTES
            rep.actions.append({
                "t_s": round(time.monotonic() - self.started_at, 3), "action": "nohugepage",
                "start": start, "end": start + policy.HUGE_PAGE_BYTES,
                # Applied by the kdamond once the scheme below is committed: no time to measure.
                "bytes": policy.HUGE_PAGE_BYTES, "error": None, "seconds": None,
            })
        if not self.opts.dry_run:
            entry.schemes_changed = self._apply_schemes(decision)
        entry.promoted_bytes = self.state.promoted_bytes

        # What the target holds now, after this snapshot's actions.
        entry.huge_bytes = self.files.rollup().get("AnonHugePages")
        if decision.hot_regions:
            try:
                entry.hot_huge_bytes = self.files.huge_bytes_in(
                    [(s.start, s.end) for s in decision.hot_regions]
                )
            except procfs.PagemapScanUnsupported:
                entry.hot_huge_bytes = None
        else:
            entry.hot_huge_bytes = 0
        if self.files.stat().exiting:
            # Measured while exit was unmapping the target: its huge pages read as gone, which
            # says nothing about the agent. The previous entry stays the final word.
            raise procfs.ProcessGone(f"pid {self.target.pid} is exiting")
        rep.hot_bytes = entry.hot_bytes
        rep.hot_huge_bytes = entry.hot_huge_bytes
        rep.observe_memory(entry.huge_bytes, status.vm_rss, status.vm_pte)
        rep.timeline.append(entry)
        if now >= self._next_cpu:
            self.last_stat = self.files.stat()
            self._read_kdamond_cpu()
            self._next_cpu = now + CPU_EVERY_S
        self._tick()

    # -- actions -----------------------------------------------------------------------------

    def _collapse(self, starts: tuple[int, ...], entry: report.TimelineEntry) -> None:
        # Ranges the kernel already maps with a huge page (THP `always` faults, khugepaged)
        # are adopted as promoted without a collapse call: nothing to copy, nothing to count.
        already = self._already_huge(starts)
        if already:
            entry.collapse.already_huge += len(already)
            self.report.collapse.already_huge += len(already)
            self.state = policy.record_outcomes(
                self.state, {s: None for s in already}, self.opts.params, time.monotonic()
            )
            starts = tuple(s for s in starts if s not in already)
        results = actuate.collapse(self.target, starts)
        now = time.monotonic()
        for r in results:
            entry.collapse.add(r.error is None, r.bytes_done, r.error, r.seconds)
            self.report.collapse.add(r.error is None, r.bytes_done, r.error, r.seconds)
            self.report.actions.append({"t_s": round(now - self.started_at, 3), **r.to_dict()})
        self.state = policy.record_outcomes(
            self.state, {r.start: r.error for r in results}, self.opts.params, now
        )

    def _already_huge(self, starts: tuple[int, ...]) -> set[int]:
        spans = policy.coalesce(starts)
        try:
            huge = self.files.huge_regions_in([(sp.start, sp.end) for sp in spans])
        except procfs.PagemapScanUnsupported:
            return set()
        return {
            s for s in starts
            if any(lo <= s and s + policy.HUGE_PAGE_BYTES <= hi for lo, hi in huge)
        }

    def _check_damos_collapses(self, now_s: float) -> dict[int, str | None]:
        """DAMOS collapse (7.2+) is applied by the kdamond: a snapshot later, see what took.

        Untested here: no kernel with the collapse action was available (6.12 VM, 6.18 host).
        """
        ready = [s for s, t in self.pending_damos.items() if t < now_s]
        if not ready:
            return {}
        outcomes: dict[int, str | None] = {}
        for start in ready:
            del self.pending_damos[start]
            huge = self.files.huge_bytes_in([(start, start + policy.HUGE_PAGE_BYTES)])
            ok = huge == policy.HUGE_PAGE_BYTES
            outcomes[start] = None if ok else "NOT_COLLAPSED"
            self.report.collapse.add(ok, policy.HUGE_PAGE_BYTES if ok else 0,
                                     None if ok else "NOT_COLLAPSED", 0.0)
            self.report.actions.append({
                "t_s": round(time.monotonic() - self.started_at, 3), "action": "damos_collapse",
                "start": start, "end": start + policy.HUGE_PAGE_BYTES,
                "bytes": policy.HUGE_PAGE_BYTES if ok else 0,
                "error": outcomes[start], "seconds": None,
            })
        return outcomes

    def _apply_schemes(self, decision: policy.Decision) -> bool:
        schemes = actuate.mark_schemes(decision.hugepage_marks, decision.nohugepage_marks)
        if self.pending_damos:
            scheme = actuate.collapse_scheme(policy.coalesce(self.pending_damos))
            if scheme is not None:
                schemes.append(scheme)
        wanted = tuple(schemes)
        if wanted == self.schemes or self.kd is None:
            return False
        self._fold_scheme_stats()  # a commit restarts the kernel's counters
        t0 = time.monotonic()
        error = None
        try:
            self.kd.set_schemes(wanted)
        except sysfs.KdamondStopped:
            raise
        except DamonHpError as e:
            # DAMON sysfs answers EBUSY while another reader holds its lock; the marks are
            # retried at the next snapshot, since self.schemes still differs from them.
            error = str(e)
            self.report.scheme_errors += 1
        self.report.actions.append({
            "t_s": round(t0 - self.started_at, 3), "action": "damos_schemes",
            "schemes": {sc.action: sum(a.size for a in sc.addr_filters) for sc in wanted},
            "error": error, "seconds": round(time.monotonic() - t0, 6),
        })
        if error is not None:
            return False
        self.schemes = wanted
        return True

    def _fold_scheme_stats(self) -> None:
        """Add what the kdamond did with our current schemes to the report's DAMOS totals."""
        if not self.schemes or self.kd is None:
            return
        try:
            stats = self.kd.scheme_stats()
        except DamonHpError:
            return
        for scheme, st in zip(self.schemes, stats, strict=False):
            total = self.report.damos.setdefault(scheme.action, {"nr_applied": 0,
                                                                 "sz_applied": 0})
            total["nr_applied"] += st.nr_applied
            total["sz_applied"] += st.sz_applied

    # -- bookkeeping -------------------------------------------------------------------------

    def _read_kdamond_cpu(self) -> None:
        pid = self.kd.kdamond_pid if self.kd else None
        if not pid:
            return
        try:
            self.report.kdamond_cpu_s = procfs.read_stat(pid).cpu_s
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
            write_status({
                "agent_pid": os.getpid(),
                "agent_start_ticks": ownership.process_start_ticks(os.getpid()),
                "mode": r.mode,
                "target_pid": self.target.pid,
                "command": r.command,
                "since": self.started_wall,
                "kdamond_index": self.kd.index if self.kd else None,
                "kdamond_pid": self.kd.kdamond_pid if self.kd else None,
                "snapshots": r.snapshots,
                "promotions": r.collapse.ok,
                "promoted_bytes": self.state.promoted_bytes,
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
            note=f"recorded by damon-hp {self.report.mode} on pid {self.target.pid}",
        )
        rec.save(self.opts.record_path)


def emit_report(agent: Agent, opts: AgentOptions) -> None:
    """Summary table on stderr (stdout belongs to the target in `run`), JSON file if asked."""
    agent.finish_report()
    if opts.json_path:
        try:
            report.write_json(agent.report, opts.json_path)
        except OSError as e:
            print(f"damon-hp: cannot write {opts.json_path}: {e.strerror}", file=sys.stderr)
    try:
        agent.save_recording()
    except OSError as e:
        print(f"damon-hp: cannot write {opts.record_path}: {e.strerror}", file=sys.stderr)
    print(report.format_table(agent.report), file=sys.stderr, flush=True)
