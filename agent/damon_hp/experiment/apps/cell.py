"""One app run: start the server (thp-never: THP off for it by prctl before exec), load it,
warm it up, apply the arm, let every arm settle the same time, measure each client test, for
Redis churn its keys, and stop everything. The server's memory is sampled all along.

Arms, all per process on the host:
* thp-never: prctl(PR_SET_THP_DISABLE) in the server's forked child before exec;
* everywhere: after the warm-up (and again after the churn's load), every 2 MiB range of every
  private anonymous mapping of the server collapsed with process_madvise(MADV_COLLAPSE): huge
  pages everywhere, the upper bound;
* damon-hp: `damon-hp attach --json` to the server as soon as its process runs (a Redis server
  loading its snapshot already answers, with -LOADING), stopped with SIGINT before the server.

Per measured test: the client's throughput and latency p50/p99/p99.9, the server's CPU time
(utime+stime of all its threads from /proc/PID/stat) over the test per request, the hypervisor
steal over the test (/proc/stat), the server's RSS and AnonHugePages at its end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from damon_hp import actuate, procfs
from damon_hp.damon.status import running_kdamond_pids as kdamond_pids
from damon_hp.errors import DamonHpError
from damon_hp.experiment import arms
from damon_hp.experiment.apps import APP_CLASSES, params_of, skew
from damon_hp.experiment.cellkind import CellKind
from damon_hp.experiment.interrupts import deferred_interrupts
from damon_hp.experiment.measure import Sampler, cpu_times, steal_fraction
from damon_hp.experiment.spec import Cell
from damon_hp.ranges import huge_starts

if TYPE_CHECKING:
    from damon_hp.experiment.context import Context
    from damon_hp.experiment.results import RunResult

AGENT_STOP_S = 60.0
RECORD = "agent-record.json"


def mechanism(arm: str) -> str:
    if arm == "thp-never":
        return "prctl(PR_SET_THP_DISABLE) on the server before exec (host; global THP untouched)"
    if arm == "everywhere":
        return ("process_madvise(MADV_COLLAPSE) of every 2 MiB range of every private anonymous "
                "mapping of the server after its warm-up and after the churn's load (host)")
    return (f"damon-hp attach to the server as soon as its process runs, source "
            f"{_source()}, the host's own THP mode {procfs.thp_mode()} (untouched)")


def _source() -> str:
    try:
        return arms.host_access_source()
    except DamonHpError:
        return "none"


def make_app(cell: Cell) -> Any:
    assert cell.workload.app is not None
    params = params_of(cell.workload.app, dict(cell.workload.params))
    return APP_CLASSES[cell.workload.app](params, cell.threads, cell.rep)


def collapse_everything(pid: int) -> dict[str, Any]:
    """MADV_COLLAPSE of every aligned 2 MiB range of every private anonymous mapping that has a
    resident page. A range without one would fail with EINVAL anyway, and mariadbd reserves
    terabytes of address space it never touches (4.2 million such ranges: 24 s of calls)."""
    t, cpu = time.monotonic(), time.thread_time()
    maps = [m for m in procfs.read_smaps(pid) if m.anonymous_private and m.counter("Rss")]
    candidates = [s for m in maps for s in huge_starts(m.range)]
    resident = procfs.resident_pages_in(pid, candidates)
    starts = [s for s in candidates if resident.get(s)]
    errors: dict[str, int] = {}
    ok = done = 0
    with actuate.Target.open(pid) as target:
        for r in actuate.collapse(target, starts):
            if r.error:
                errors[r.error] = errors.get(r.error, 0) + 1
            else:
                ok += 1
                done += r.bytes_done
    return {"ranges": len(starts), "unpopulated": len(candidates) - len(starts), "ok": ok,
            "bytes": done, "errors": errors,
            "seconds": round(time.monotonic() - t, 3),
            "cpu_s": round(time.thread_time() - cpu, 3)}


class Background:
    """Samples the server's memory every `interval` seconds in a thread until stopped."""

    def __init__(self, sampler: Sampler, interval: float) -> None:
        self.sampler = sampler
        self.interval = interval
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            with self.lock:
                self.sampler.sample(time.monotonic())
            self.stop_event.wait(self.interval)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)


def memory_now(pid: int) -> dict[str, int | None]:
    roll = procfs.smaps_rollup(pid)
    return {"rss_bytes": roll.get("Rss"), "anon_huge_bytes": roll.get("AnonHugePages")}


def _start_agent(pid: int, state: arms.RunState, stack: contextlib.ExitStack
                 ) -> subprocess.Popen[bytes]:

    # --record: the agent's own snapshots, from which the report reads how skewed the
    # traffic was at huge-page granularity (skew.py)
    argv = [arms.tool("damon-hp"), "attach", "--json", str(state.rundir / "agent.json"),
            "--record", str(state.rundir / RECORD), *state.options.agent_args, str(pid)]
    with deferred_interrupts(), open(state.rundir / "agent.log", "wb") as log:
        agent = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 start_new_session=True)
        stack.callback(_stop_agent, agent)
    return agent


def _stop_agent(agent: subprocess.Popen[bytes]) -> int | None:
    """SIGINT (Ctrl-C: the agent removes its tracefs instance and writes its JSON), then
    SIGKILL of its session if it does not exit."""
    if agent.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            agent.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(AGENT_STOP_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(agent.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        agent.wait(10)
    return agent.returncode


def _steal(before: list[int] | None) -> float | None:

    return steal_fraction(before, cpu_times())


def measure(app: Any, server: Any, test: str, rundir: Path) -> dict[str, Any]:

    before_counters = app.counters()
    cpu0, stat0 = server.cpu_s(), cpu_times()
    client = app.drive(test, rundir)
    cpu = server.cpu_s() - cpu0
    steal = _steal(stat0)
    if not server.alive():
        raise server.died()
    after_counters = app.counters()
    phase: dict[str, Any] = {
        "test": test, "requests": client.requests, "seconds": round(client.seconds, 3),
        "throughput": client.throughput, "p50_ms": client.p50_ms, "p99_ms": client.p99_ms,
        "p999_ms": client.p999_ms, "server_cpu_s": round(cpu, 3),
        "cpu_us_per_request": cpu * 1e6 / client.requests if client.requests else None,
        "steal_frac": steal, **memory_now(server.pid), **client.extra,
    }
    for k, v in after_counters.items():
        phase[k] = v - before_counters.get(k, 0)
    return phase


def execute(ctx: Context, cell: Cell, state: arms.RunState, result: RunResult) -> None:
    """Run one app cell; fills `result` (a RunResult). Errors raise DamonHpError/OSError."""
    app = make_app(cell)
    # absolute: mariadb-install-db and mariadbd fail (exit 1) on a relative data directory,
    # which a relative `experiment run --out DIR` gave
    rundir = state.rundir.resolve()
    arm = cell.arm
    result.app = {"app": app.name, "server": app.server_program}
    with contextlib.ExitStack() as stack:
        datadir = rundir / "data"
        stack.callback(shutil.rmtree, datadir, True)
        result.app.update(app.prepare(datadir, ctx.app_data().resolve()))
        env = dict(os.environ)
        t0 = time.monotonic()
        agents: list[subprocess.Popen[bytes]] = []

        def attach(pid: int) -> None:
            # As soon as the server process runs, before it answers: a Redis server loading its
            # snapshot answers -LOADING, and the writes of that load are where the access source
            # first sees the data set (as it saw the keys arrive through the pipe before).
            agents.append(_start_agent(pid, state, stack))

        server = app.start(datadir, rundir, arm == "thp-never", env, stack,
                           on_spawn=attach if arm == "damon-hp" else None)
        result.app["port"] = server.port
        if getattr(app, "socket_dir", None) is not None:
            result.app["socket_dir"] = str(app.socket_dir)
        result.app["ready_s"] = round(time.monotonic() - t0, 3)
        status = procfs.read_status(server.pid)
        result.app["thp_enabled"] = not status.thp_disabled
        agent = agents[0] if agents else None
        if agent is not None:
            result.app["agent_pid"] = agent.pid  # its tracefs instance is damon-hp-PID-*
        sampler = Sampler(server.pid, t0, agent_pid=agent.pid if agent else None,
                          foreign_kdamonds=set(kdamond_pids().values()))
        bg = Background(sampler, ctx.exp.sample_interval_s)
        bg.start()
        stack.callback(bg.stop)
        marks: dict[str, float] = {}

        def mark(name: str) -> None:
            marks[name] = round(time.monotonic() - t0, 3)

        result.app.update(app.load(rundir))
        mark("loaded")
        app.warm_up(rundir)
        mark("warmed_up")
        if arm == "everywhere":
            result.app["collapse"] = collapse_everything(server.pid)
            mark("collapsed")
        settle = float(getattr(app.p, "settle_s", 0.0))
        if settle:
            time.sleep(settle)
        if agent is not None and agent.poll() is not None:
            raise DamonHpError(f"damon-hp attach exited with {agent.returncode} during the "
                               f"warm-up; see {rundir / 'agent.log'}")
        cpu_stat0 = server.cpu_s()

        stat0 = cpu_times()
        mark("measure_start")
        result.app["t0_monotonic"] = round(t0, 3)  # marks are seconds after it
        for test in app.tests():
            mark(f"{test}_start")
            result.phases.append(measure(app, server, test, rundir))
            mark(f"{test}_end")
        mark("measure_end")
        result.steal_frac = _steal(stat0)
        result.app["measured_server_cpu_s"] = round(server.cpu_s() - cpu_stat0, 3)
        result.app["measured"] = memory_now(server.pid)
        if getattr(app.p, "churn", False):
            result.app["churn"] = app.churn(rundir, cell.rep)
            mark("churned")
            if arm == "everywhere":
                result.app["churn_collapse"] = collapse_everything(server.pid)
            time.sleep(float(app.p.churn_settle_s))
            result.app["after_churn"] = memory_now(server.pid)
            mark("after_churn")
        if agent is not None:
            with bg.lock:
                sampler.sample(time.monotonic())  # the agent's CPU time, last read
            t_stop = time.monotonic()
            code = _stop_agent(agent)
            result.app["agent_exit"] = code
            result.app["agent_stop_s"] = round(time.monotonic() - t_stop, 3)
            arms.DamonHp().finish(state)
            for k, v in state.metrics.items():
                setattr(result, k, v)
            _agent_collapses(state, result)
            result.app["skew"] = skew.of_run(state.rundir / RECORD, t0, marks, app.tests())
        result.app["marks"] = marks
        bg.stop()
        summary = sampler.summary()
        for k, v in summary.items():
            if getattr(result, k, None) is None:
                setattr(result, k, v)
        result.samples = sampler.samples
        result.wall_s = time.monotonic() - t0
        t_stop = time.monotonic()
        server.stop()
        result.exit_code = server.proc.returncode
        result.app["stop_s"] = round(time.monotonic() - t_stop, 3)  # where the run's time goes


def _agent_collapses(state: arms.RunState, result: RunResult) -> None:
    """The agent's collapses (count, bytes, errors, seconds) from its --json summary."""
    import json

    try:
        data = json.loads((state.rundir / "agent.json").read_text())
    except (OSError, ValueError):
        return
    summary = data.get("summary", {}) if isinstance(data, dict) else {}
    c = summary.get("collapse")
    if isinstance(c, dict):
        result.app["collapse"] = {"ranges": c.get("tried"), "ok": c.get("ok"),
                                  "bytes": c.get("bytes"), "errors": c.get("errors"),
                                  "seconds": c.get("seconds"), "cpu_s": c.get("cpu_seconds")}
    source = summary.get("source")
    result.app["agent_source"] = source.get("name") if isinstance(source, dict) else source


# The app kind of cell: what its arm does does not depend on the VM (apps run on the host)
APP = CellKind("app", lambda cell, _vm, _options: mechanism(cell.arm), execute)
