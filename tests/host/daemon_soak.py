"""A soak of damon-hpd through the passive source (issue 26): long-lived matching processes that
stay, short-lived ones started at a steady rate, and what the daemon holds meanwhile. One
implementation, two drivers: tests/host/test_daemon_soak.py (3 minutes, hard asserts) and
experiments/soak-daemon.py (the 30-minute benchmark).

The run: the daemon (own run directory, a config whose one rule selects only hotcold copies in
this soak's temporary folder, a budget smaller than the long-lived hot sets together), the
long-lived processes, then `warmup_s` of churn, a quiet point, `soak_s` more churn, a quiet
point. At a quiet point no short-lived process is left and the daemon has let go of each of
them; what the daemon holds there (open fds, tracefs instances, status records, VmRSS) is
compared between the two quiet points, so that a leak shows as a difference and the number of
processes managed at one moment does not.

Every process runs at nice 19 (through nice(1), no preexec_fn in a threaded program) so that
on two shared cores the daemon, not hotcold's readers, gets the CPU.

Looked at meanwhile:
- every 0.1 s (the churn thread): each child's pidfd (readable once it exited) and its status
  record; "record lag" = the last look at which an exited process's record still existed less
  the first look at which its pidfd was readable (0 when gone by then), so each end is known
  to one look (0.1 s, more when the harness waits for a CPU);
- every 0.5 s (daemon_host.BudgetWatcher): the live children's AnonHugePages together (smaps)
  against the budget. hotcold never madvises, so under THP `madvise`/`never` every huge page
  is the daemon's collapse. Whether any appear is the foreign kdamond's view (on a fragmented
  machine it reads everything idle): the budget check holds either way, and `huge_max` says
  which case it was;
- every `sample_s`: the daemon's fds, instances, records, VmRSS and CPU, kept as samples.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon_host import HOTCOLD, MIB, BudgetWatcher, Daemon, running_kdamonds, status
from leftovers import instances_of, wait_for

LOOK_S = 0.1  # the churn thread's period: the resolution of the record lag
LINGER_S = 30.0  # how long an exited process's record path is still watched
RSS_GROWTH_MAX = 5 * MIB  # issue 26: the daemon's RSS stays flat, growth <= 5 MiB
# How long a status record may outlive its process. The issue asks for one aggregation (5 s
# here). The daemon looks at its pidfds every loop iteration: at least every READ_TIMEOUT_S
# (0.5 s, service.py), or after a round or a rescan; the harness sees each end to one look
# (0.1 s); the rest is room for a loaded 2-core host. Measured 2026-11-25 (commit 49cd57e, load
# average 13): max 0.42 s over 54 exits. A daemon that let go only when a round found the
# process gone (before that commit): median 2.3 s, max 4.96 s over 48 exits, within one
# aggregation but past this bound, so the test catches the exit check gone.
RECORD_LAG_MAX_S = 3.0
QUIET_S = 60.0  # for the last short-lived ones to end and be let go (they live <= 9 s)


def config_text(folder: Path, budget: str, scan_every_s: float) -> str:
    return f"""\
[daemon]
source = "passive"
budget = "{budget}"
scan_every_s = {scan_every_s}
summary_every_s = 60

[[rule]]
name = "soak"
cmdline = "^{folder}/soak-(long|short) "
"""


@dataclass
class Plan:
    folder: Path
    warmup_s: float
    soak_s: float
    long: int = 10
    short_per_minute: float = 100.0
    long_hot: str = "16M"
    long_cold: str = "32M"
    short_hot: str = "8M"
    short_cold: str = "8M"
    short_life_s: tuple[float, float] = (3.0, 9.0)
    budget: str = "64M"
    # Longer than the passive source's 5 s aggregation: the record lag then measures the
    # daemon's own exit check (service.py release_exited), not its rescan.
    scan_every_s: float = 8.0
    sample_s: float = 5.0
    progress_s: float = 30.0
    seed: int = 26


@dataclass
class Child:
    proc: subprocess.Popen
    pidfd: int
    long: bool
    exited_at: float | None = None
    record_seen: bool = False
    last_present: float | None = None  # last look (after exit) at which its record existed

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Quiet:
    """What the daemon holds at a quiet point (only the long-lived processes managed)."""
    t_s: float
    fds: int
    instances: int
    records: int
    rss: int
    cpu_s: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Result:
    plan: Plan
    aggr_s: float = 0.0
    long_pids: list[int] = field(default_factory=list)
    short_started: int = 0
    short_managed: int = 0  # short-lived processes whose status record was seen
    lags: list[float] = field(default_factory=list)
    start: Quiet | None = None
    warm: Quiet | None = None
    end: Quiet | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    budget_bytes: int = 0
    huge_max: int = 0
    budget_looks: int = 0
    budget_broken: list[str] = field(default_factory=list)
    daemon_exit: int | None = None
    left: list[str] = field(default_factory=list)

    def soak_cpu_pct(self) -> float:
        assert self.warm is not None and self.end is not None
        return 100 * (self.end.cpu_s - self.warm.cpu_s) / (self.end.t_s - self.warm.t_s)

    def problems(self) -> list[str]:
        """Every soak condition that broke (empty: it held)."""
        out = []
        w, e = self.warm, self.end
        if w is None or e is None:
            return ["the soak did not reach its last quiet point"]
        if e.rss - w.rss > RSS_GROWTH_MAX:
            out.append(f"VmRSS grew {(e.rss - w.rss) / MIB:.1f} MiB after the warm-up "
                       f"(bound {RSS_GROWTH_MAX / MIB:.0f} MiB)")
        for what in ("fds", "instances", "records"):
            if getattr(e, what) != getattr(w, what):
                out.append(f"{what} {getattr(w, what)} after the warm-up, "
                           f"{getattr(e, what)} at the end")
        if e.records != len(self.long_pids):
            out.append(f"{e.records} records at the end for {len(self.long_pids)} processes")
        bound = min(self.aggr_s, RECORD_LAG_MAX_S)
        late = [x for x in self.lags if x > bound]
        if late:
            out.append(f"{len(late)} records outlived their process by more than {bound:g} s "
                       f"(aggregation {self.aggr_s:g} s), up to {max(late):.1f} s")
        if not self.short_managed:
            out.append("no short-lived process was ever managed: nothing was soaked")
        if self.budget_broken:
            out.append(f"budget exceeded {len(self.budget_broken)} times: "
                       f"{self.budget_broken[0]}")
        if self.daemon_exit != 0:
            out.append(f"damon-hpd exited {self.daemon_exit} after SIGTERM")
        out += self.left
        return out

    def to_json(self) -> dict[str, Any]:
        lags = sorted(self.lags)
        return {
            "plan": {k: (str(v) if isinstance(v, Path) else v)
                     for k, v in self.plan.__dict__.items()},
            "aggr_s": self.aggr_s, "long": len(self.long_pids),
            "short_started": self.short_started, "short_managed": self.short_managed,
            "record_lag_s": {"n": len(lags), "max": lags[-1] if lags else None,
                             "median": statistics.median(lags) if lags else None,
                             "p95": lags[int(0.95 * (len(lags) - 1))] if lags else None},
            "start": self.start and self.start.to_json(), "warm": self.warm and self.warm.to_json(),
            "end": self.end and self.end.to_json(),
            "rss_growth_bytes": (self.end.rss - self.warm.rss
                                 if self.end and self.warm else None),
            "fds_max": max((s["fds"] for s in self.samples), default=None),
            "records_max": max((s["records"] for s in self.samples), default=None),
            "rss_max": max((s["rss"] for s in self.samples), default=None),
            "budget_bytes": self.budget_bytes, "huge_max": self.huge_max,
            "budget_looks": self.budget_looks, "budget_broken": self.budget_broken[:20],
            "daemon_cpu_pct_soak": (round(self.soak_cpu_pct(), 3)
                                    if self.warm and self.end else None),
            "daemon_exit": self.daemon_exit, "left": self.left,
            "samples": self.samples, "problems": self.problems(),
        }


class Soak:
    def __init__(self, plan: Plan, say: Callable[[str], None] = print) -> None:
        self.plan = plan
        self.say = say
        self.res = Result(plan)
        self.rand = random.Random(plan.seed)
        for name in ("soak-long", "soak-short"):
            shutil.copy(HOTCOLD, plan.folder / name)
        self.children: list[Child] = []
        self.lock = threading.Lock()
        self.churning = threading.Event()
        self.halt = threading.Event()
        self.daemon: Daemon | None = None
        self.budget: BudgetWatcher | None = None
        self.t0 = time.monotonic()

    # -- children ------------------------------------------------------------------------

    def _spawn(self, long: bool, hot: str, cold: str, seconds: float) -> Child:
        exe = self.plan.folder / ("soak-long" if long else "soak-short")
        proc = subprocess.Popen(["nice", "-n", "19", str(exe), "--hot", hot, "--cold", cold,
                                 "--seconds", f"{seconds:.1f}"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        child = Child(proc, os.pidfd_open(proc.pid), long)
        with self.lock:
            self.children.append(child)
        assert self.budget is not None
        self.budget.managed.append(proc.pid)
        return child

    def _churn(self) -> None:
        """Start short-lived processes while churning; look at every child's pidfd and record
        every LOOK_S."""
        p = self.plan
        every = 60.0 / p.short_per_minute
        next_start = time.monotonic()
        while not self.halt.wait(LOOK_S):
            now = time.monotonic()
            if self.churning.is_set() and now >= next_start:
                self._spawn(False, p.short_hot, p.short_cold, self.rand.uniform(*p.short_life_s))
                self.res.short_started += 1
                next_start = max(next_start + every, now - every)
            elif not self.churning.is_set():
                next_start = now
            self._look(time.monotonic())

    def _look(self, now: float) -> None:
        assert self.daemon is not None and self.budget is not None
        with self.lock:
            children = list(self.children)
        live = [c for c in children if c.exited_at is None]
        poller = select.poll()
        for c in live:
            poller.register(c.pidfd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(0)}
        for c in children:
            present = self.daemon.record_path(c.pid).exists()
            if c.exited_at is None:
                if c.pidfd in ready:
                    c.exited_at = now
                    self.budget.managed.remove(c.pid)  # before the reap frees the pid
                    c.proc.wait()
                else:
                    c.record_seen |= present
                    continue
            if present:
                c.record_seen = True
                c.last_present = now
            if now - c.exited_at > LINGER_S:
                self._done(c)

    def _done(self, c: Child) -> None:
        assert c.exited_at is not None
        if c.record_seen:
            self.res.lags.append(0.0 if c.last_present is None
                                 else round(c.last_present - c.exited_at, 3))
            if not c.long:
                self.res.short_managed += 1
        os.close(c.pidfd)
        with self.lock:
            self.children.remove(c)

    # -- what the daemon holds -----------------------------------------------------------

    def _records(self) -> int:
        assert self.daemon is not None
        return len(self.daemon.records())

    def _sample(self) -> dict[str, Any]:
        d = self.daemon
        assert d is not None and self.budget is not None
        d.running()
        with self.lock:
            live = sum(c.exited_at is None for c in self.children)
        return {"t_s": round(time.monotonic() - self.t0, 1), "fds": d.fds(),
                "instances": len(instances_of(d.pid)), "records": self._records(),
                "rss": d.rss(), "cpu_s": d.cpu_s(), "live": live,
                "huge_max": self.budget.most}

    def _quiet(self, label: str) -> Quiet:
        """Stop the churn, wait until every short-lived process has ended and been let go,
        then read what the daemon holds (fds: the fewest of 10 looks 0.2 s apart, so that a
        file the daemon has open for a moment while it rescans /proc is not counted)."""
        assert self.daemon is not None
        self.churning.clear()
        long = {c.pid for c in self.children if c.long}

        def settled() -> bool:
            with self.lock:
                short_live = any(c.exited_at is None for c in self.children if not c.long)
            return not short_live and {int(p.stem.rsplit("-", 1)[1])
                                       for p in self.daemon.records()} == long
        wait_for(f"{label}: the short-lived processes to end and be let go", settled, QUIET_S)
        fds = []
        for _ in range(10):
            fds.append(self.daemon.fds())
            time.sleep(0.2)
        q = Quiet(round(time.monotonic() - self.t0, 1), min(fds),
                  len(instances_of(self.daemon.pid)), self._records(), self.daemon.rss(),
                  self.daemon.cpu_s())
        self.say(f"# quiet ({label}) at {q.t_s:.0f} s: {q.fds} fds, {q.instances} instances, "
                 f"{q.records} records, VmRSS {q.rss / MIB:.1f} MiB, CPU {q.cpu_s:.1f} s")
        return q

    def _churn_for(self, seconds: float) -> None:
        self.churning.set()
        end = time.monotonic() + seconds
        next_sample = next_progress = time.monotonic()
        last_cpu, last_t = self.daemon.cpu_s(), time.monotonic()  # type: ignore[union-attr]
        while (now := time.monotonic()) < end:
            if now >= next_sample:
                self.res.samples.append(self._sample())
                next_sample = now + self.plan.sample_s
            if now >= next_progress and self.res.samples:
                s = self.res.samples[-1]
                pct = 100 * (s["cpu_s"] - last_cpu) / max(now - last_t, 1e-9)
                last_cpu, last_t = s["cpu_s"], now
                lags = self.res.lags
                self.say(f"{s['t_s']:7.0f} s: {self.res.short_started} short started, "
                         f"{self.res.short_managed} managed and gone, {s['live']} running; "
                         f"daemon {s['fds']} fds, {s['instances']} instances, "
                         f"{s['records']} records, VmRSS {s['rss'] / MIB:.1f} MiB, "
                         f"CPU {pct:.1f} % of a core; huge max {s['huge_max'] / MIB:.0f} MiB; "
                         f"record lag max {max(lags, default=0):.1f} s")
                next_progress = now + self.plan.progress_s
            time.sleep(min(1.0, max(0.0, end - now)))

    # -- the whole run -------------------------------------------------------------------

    def run(self) -> Result:
        p, res = self.plan, self.res
        cfg = p.folder / "daemon.toml"
        cfg.write_text(config_text(p.folder, p.budget, p.scan_every_s))
        kdamonds_before = running_kdamonds()
        churn = threading.Thread(target=self._churn, daemon=True)
        life = p.warmup_s + p.soak_s + 600  # beyond the run: killed at the end
        try:
            self.daemon = d = Daemon(cfg, p.folder / "run", p.folder / "daemon.err")
            self.say(f"# damon-hpd pid {d.pid}, log {d.log_path}")
            self.budget = BudgetWatcher([], None, 0)
            for _ in range(p.long):
                res.long_pids.append(self._spawn(True, p.long_hot, p.long_cold, life).pid)
            d.wait_managing(set(res.long_pids))
            [rec] = [r for r in status(d.env) if r["target_pid"] == res.long_pids[0]]
            res.aggr_s = rec["source"]["aggr_us"] / 1e6
            res.budget_bytes = self.budget.budget = rec["budget_bytes"]
            self.budget.start()
            churn.start()
            res.start = self._quiet("start")
            self._churn_for(p.warmup_s)
            res.warm = self._quiet("after the warm-up")
            self._churn_for(p.soak_s)
            res.end = self._quiet("end")
            self.halt.set()
            churn.join()
            for c in list(self.children):  # the last ones' records are gone (quiet point)
                if c.exited_at is not None:
                    self._done(c)
            self.budget.halt.set()
            self.budget.join()
            res.daemon_exit = d.terminate()
            if instances_of(d.pid):
                res.left.append(f"tracefs instances left: {instances_of(d.pid)}")
            if list((p.folder / "run").glob("agent-*")):
                res.left.append(f"status records left: {list((p.folder / 'run').iterdir())}")
            if running_kdamonds() != kdamonds_before:
                res.left.append(f"kdamonds {sorted(kdamonds_before)} before, "
                                f"{sorted(running_kdamonds())} after")
        finally:
            self.halt.set()
            if self.budget is not None:
                self.budget.halt.set()
                res.huge_max = self.budget.most
                res.budget_looks = self.budget.looks
                res.budget_broken = list(self.budget.broken)
            if self.daemon is not None:
                self.daemon.kill()
            if churn.is_alive():
                churn.join()
            for c in list(self.children):
                if c.exited_at is None:
                    c.proc.kill()
                    c.proc.wait()
                os.close(c.pidfd)
            self.children.clear()
        return res
