"""Run the cells of an experiment, one process tree at a time, resumably.

One cell: set the arm's THP mode, make the run's cgroup (with memory.max for `insufficient`),
spawn the launcher (wrapped by the arm: `damon-hp run -- ...`), learn the workload's pid,
attach the arm, sample the workload until its pidfd says it exited, collect its exit status,
resource usage and cgroup counters, and write one JSON result. Interrupted or not, the cell's
ExitStack kills the process tree, stops what the arm started and removes the cgroup.

Resumption: a cell whose result file exists (in the output directory or in a `previous` one) is
not run again, unless its status is "error" (the runner could not run it at all).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from damon_hp import perf, procfs
from damon_hp.damon import kdamond
from damon_hp.damon.status import running_kdamond_pids as kdamond_pids
from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.experiment import arms, launch, workloads
from damon_hp.experiment.apps import preflight
from damon_hp.experiment.cellkind import CellKind
from damon_hp.experiment.context import ERROR, Context, group_key, is_done
from damon_hp.experiment.environment import in_vm, pmu_available
from damon_hp.experiment.interrupts import deferred_interrupts, sigterm_as_interrupt
from damon_hp.experiment.measure import (
    Sampler,
    cpu_times,
    reaped_child_usage,
    steal_fraction,
    usage_delta,
)
from damon_hp.experiment.memory import RunCgroup, ZramSwap, active_swap_bytes
from damon_hp.experiment.proctree import children, exe_of, terminate, wait4
from damon_hp.experiment.progress import Progress
from damon_hp.experiment.results import (
    FAILED,
    OK,
    OOM,
    TIMEOUT,
    RunResult,
    save_run,
    write_json_atomic,
)
from damon_hp.experiment.spec import (
    ALWAYS,
    BASELINE,
    GROUND_TRUTH_PROGRAMS,
    Cell,
    Experiment,
    expand,
)

LAUNCHER = Path(__file__).resolve().parent / "launch.py"
START_TIMEOUT_S = 300.0  # agent start-up under TCG can take a while
AGENT_EXIT_TIMEOUT_S = 120.0


def check_runnable(exp: Experiment, cells: list[Cell], vm: bool) -> None:
    """Every reason the experiment cannot run here, before anything starts."""
    problems = []
    for w in {c.workload.name: c.workload for c in cells if c.workload.app}.values():
        try:
            preflight(w.app or "", dict(w.params))
        except EnvironmentProblem as e:
            problems.append(f"{w.name}: {e}")
    for name in sorted({c.arm for c in cells}):
        try:
            arms.make(name).check(vm)
        except EnvironmentProblem as e:
            problems.append(str(e))
    if not vm and any(c.memory == "insufficient" for c in cells):
        problems.append("the insufficient-memory condition needs a cgroup and swap of its own; "
                        'it runs only in the test VM (where = "vm")')
    missing = workloads.check_built({workloads.program_for(c.workload, c.arm) for c in cells
                                     if not c.workload.app})
    if missing:
        problems.append(f"workloads not built: {', '.join(missing)}; run `make workloads`")
    if problems:
        raise EnvironmentProblem("cannot run this experiment here:\n  " + "\n  ".join(problems))


def insufficient_limit(ctx: Context, cell: Cell) -> int | None:
    """memory.max for an insufficient cell: a fraction of thp-always's median peak, fixed once."""
    key = group_key(cell)
    if key in ctx.limits:
        return ctx.limits[key]
    peaks = []
    for r in ctx.finished().values():
        if (r.arm == ALWAYS and r.memory == "sufficient" and r.status == OK
                and r.workload == cell.workload.name and r.threads == cell.threads):
            v = r.cgroup_peak_bytes or r.peak_rss_bytes
            if v:
                peaks.append(v)
    if not peaks:
        return None
    limit = int(statistics.median(peaks) * ctx.exp.insufficient.fraction_of_always_peak)
    limit = max(limit // 4096 * 4096, 4096)
    ctx.limits[key] = limit
    write_json_atomic(ctx.out / "limits.json", ctx.limits)
    return limit


def _wait_mark(mark: Path, proc: subprocess.Popen[bytes], key: str,
               deadline: float) -> dict[str, Any]:
    while True:
        if mark.exists():
            try:
                data = json.loads(mark.read_text())
                if key in data:
                    return data
            except json.JSONDecodeError:
                pass  # written by rename, so only a race with a stale file; read again
        if proc.poll() is not None:
            raise DamonHpError(
                f"{Path(proc.args[0]).name} exited with {proc.returncode} before the "  # type: ignore[index]
                "workload started; see its stderr.txt"
            )
        if time.monotonic() > deadline:
            raise DamonHpError("the workload did not start within "
                               f"{START_TIMEOUT_S:.0f} s of spawning")
        time.sleep(0.02)


def _follow_agent_child(proc: subprocess.Popen[bytes], program: str, cg: RunCgroup | None,
                        deadline: float, notes: list[str]) -> tuple[int, float]:
    """Find the agent's child (held before exec while the agent sets DAMON up), move it into
    the run's cgroup, and return its pid and the time its exec of `program` was seen.

    Polled every 10 ms: the exec time is known to about that much, and the child is normally
    moved during the hold (seconds under emulation), so the cgroup sees everything the workload
    does. If it had exec'd already, that is noted: its first allocations escaped the cgroup.
    """
    target = os.path.realpath(shutil.which(program) or program)
    agent_exe = exe_of(proc.pid)
    child: int | None = None
    while True:
        if proc.poll() is not None:
            raise DamonHpError(
                f"{Path(str(proc.args[0])).name} exited with {proc.returncode} before the "  # type: ignore[index]
                "workload started; see its stderr.txt"
            )
        if child is None:
            # The held child is a fork of the agent (same executable) until its exec; any
            # other helper the agent might start (perf, hpstat) is not the workload.
            for kid in children(proc.pid):
                exe = exe_of(kid)
                if exe not in (agent_exe, target):
                    continue
                child = kid
                if cg:
                    (cg.path / "cgroup.procs").write_text(str(child))
                if exe_of(child) == target:
                    notes.append("the agent's child had exec'd before it was moved into the "
                                 "run's cgroup: its first allocations are not in the cgroup's "
                                 "counters, and its start time is late")
                    return child, time.monotonic()
                break
        else:
            exe = exe_of(child)
            if exe == target:
                return child, time.monotonic()
            if exe is None:
                raise DamonHpError(f"the agent's child {child} vanished before running "
                                   f"{program}")
        if time.monotonic() > deadline:
            raise DamonHpError("the agent did not start the workload within "
                               f"{START_TIMEOUT_S:.0f} s")
        time.sleep(0.01)


def stop_leftover_kdamonds(before: set[int], notes: list[str]) -> None:
    """VM only: a kdamond that appeared during the run and still runs after it was left by the
    arm (an agent that crashed); stop it so the next run starts clean."""
    if not in_vm():
        return
    for name, pid in kdamond_pids().items():
        if pid in before:
            continue
        try:
            kdamond.stop_unowned_in_vm(name)
            notes.append(f"kdamond {name} (pid {pid}) was left running by the arm; the "
                         "runner stopped it")
        except (OSError, DamonHpError) as e:
            notes.append(f"kdamond {name} (pid {pid}) was left running and could not be "
                         f"stopped: {e}")


def _start_perf(pid: int, notes: list[str]) -> perf.PerfSession | None:
    try:
        return perf.PerfSession.start(pid)
    except DamonHpError as e:
        notes.append(f"perf: {e}")
        return None


def _read_perf(session: perf.PerfSession, result: RunResult, notes: list[str]) -> None:
    """TLB misses from perf; an event the PMU could not count stays None (never 0)."""
    try:
        counts = session.stop()
    except DamonHpError as e:
        notes.append(f"perf: {e}")
        return
    for field_name, event in (("dtlb_load_misses", "dTLB-load-misses"),
                              ("dtlb_store_misses", "dTLB-store-misses"),
                              ("itlb_load_misses", "iTLB-load-misses")):
        value = counts.value(event)
        setattr(result, field_name, None if value is None else int(value))


def cmd_program(cmd: workloads.Command) -> str:
    return Path(cmd.argv[0]).name


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def run_cell(ctx: Context, cell: Cell) -> RunResult:
    exp, vm = ctx.exp, ctx.vm
    kind = _kind_of(cell)
    options = exp.options(cell.arm)
    rundir = ctx.out / "runs" / cell.id
    if rundir.exists():
        shutil.rmtree(rundir)  # a partial run of an interrupted earlier attempt
    rundir.mkdir(parents=True)
    state = arms.RunState(rundir, options)
    result = RunResult(
        cell_id=cell.id, workload=cell.workload.name,
        program=workloads.program_for(cell.workload, cell.arm), input=cell.workload.input,
        threads=cell.threads, arm=cell.arm, memory=cell.memory, rep=cell.rep,
        where="vm" if vm else "host", mechanism=kind.mechanism(cell, vm, options),
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), notes=state.notes,
    )
    try:
        kind.execute(ctx, cell, state, result)
    except (DamonHpError, OSError) as e:
        result.status = ERROR
        state.notes.append(str(e))
    return result


def _kind_of(cell: Cell) -> CellKind:
    if cell.workload.app:
        # imported on use: the app layer (servers, clients, their packages' checks) is needed
        # only by experiments that run apps
        from damon_hp.experiment.apps.cell import APP

        return APP
    return PROGRAM


def _execute(ctx: Context, cell: Cell, state: arms.RunState, result: RunResult) -> None:
    """Run a program of workloads/ to completion under its arm (the PROGRAM kind)."""
    arm = arms.make(cell.arm)
    vm, rundir = ctx.vm, state.rundir
    cmd = workloads.resolve(cell.workload, cell.threads, cell.arm, rundir / "work")
    memory_max = None
    if cell.memory == "insufficient":
        memory_max = insufficient_limit(ctx, cell)
        if memory_max is None:
            raise DamonHpError(f"no ok thp-always run with sufficient memory for "
                               f"{group_key(cell)}: the memory limit cannot be derived")
        result.memory_max_bytes = memory_max

    with contextlib.ExitStack() as stack:
        mode = arm.thp_mode(vm, state.options)
        if mode:
            arms.set_global_thp(mode)
        cg = None
        if vm:
            cg = RunCgroup.create(cell.id, memory_max)
            stack.callback(cg.remove)
        mark = rundir / "mark.json"
        flags = arm.launcher_flags(vm)
        env = dict(os.environ, **arm.env(vm), **workloads.ground_truth_env(cmd_program(cmd)))
        foreign = set(kdamond_pids().values())
        stack.callback(stop_leftover_kdamonds, foreign, state.notes)
        stack.callback(arm.cleanup, state)
        # A pipe, not a FIFO: the run directory may be on 9p (VM), where FIFOs do not work.
        hold_r, hold_w = os.pipe() if arm.needs_hold else (-1, -1)
        if hold_w >= 0:
            stack.callback(_close_quietly, hold_w)
        wrapped = arm.wraps
        if wrapped:
            # The agent forks and execs the workload itself. No launcher in between: a second
            # exec would leave the agent watching the launcher's address space through the
            # /proc files it opened after the first one. The runner moves the agent's held
            # child into the cgroup and notices its exec instead (see _follow_agent_child).
            argv = arm.wrap(list(cmd.argv), state)
            preexec = None
        elif not arm.needs_hold:
            # Nothing in between: the last steps run in the forked child (no launcher start-up).
            argv = list(cmd.argv)
            preexec = functools.partial(launch.prepare, str(mark),
                                        str(cg.path) if cg else None, None,
                                        "--thp-disable" in flags)
        else:
            launcher = [sys.executable, "-I", "-S", str(LAUNCHER), "--mark", str(mark),
                        "--cwd", str(cmd.cwd), "--hold", str(hold_r), *flags]
            if cg:
                launcher += ["--cgroup", str(cg.path)]
            if cmd.stdin:
                launcher += ["--stdin", str(cmd.stdin)]
            argv = [*launcher, "--", *cmd.argv]
            preexec = None
        (rundir / "command.json").write_text(json.dumps({"argv": argv, "cwd": str(cmd.cwd)}))
        with deferred_interrupts(), contextlib.ExitStack() as files:
            out = files.enter_context(open(rundir / "stdout.txt", "wb"))
            err = files.enter_context(open(rundir / "stderr.txt", "wb"))
            stdin: Any = subprocess.DEVNULL
            if cmd.stdin and not arm.needs_hold:
                stdin = files.enter_context(open(cmd.stdin, "rb"))
            try:
                proc = subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=err,
                                        cwd=cmd.cwd, env=env, start_new_session=True,
                                        pass_fds=(hold_r,) if hold_r >= 0 else (),
                                        preexec_fn=preexec)
            except subprocess.SubprocessError as e:
                raise DamonHpError(f"could not start {argv[0]}: {e}") from None
            finally:
                if hold_r >= 0:
                    os.close(hold_r)
            stack.callback(terminate, proc, 30.0 if wrapped else 1.0)

        start_deadline = time.monotonic() + START_TIMEOUT_S
        if wrapped:
            pid, t0 = _follow_agent_child(proc, cmd.argv[0], cg, start_deadline, state.notes)
            info: dict[str, Any] = {}
        else:
            if arm.needs_hold:
                held = _wait_mark(mark, proc, "pid", start_deadline)
                arm.attach(int(held["pid"]), state)
                os.write(hold_w, b"g")
            info = _wait_mark(mark, proc, "t0", start_deadline)
            pid, t0 = int(info["pid"]), float(info["t0"])
        session = _start_perf(pid, state.notes) if ctx.tlb else None
        if session is not None:
            stack.callback(session.__exit__, None, None, None)
        sampler = Sampler(pid, t0, agent_pid=proc.pid if wrapped else None,
                          foreign_kdamonds=foreign)
        cpu_before = cpu_times()
        timed_out = _watch(ctx, cell, arm, state, sampler, rundir / "stdout.txt")
        t_end = time.monotonic()
        result.steal_frac = steal_fraction(cpu_before, cpu_times())
        child_usage = reaped_child_usage(proc.pid) if wrapped and cg is None else None

        reaped = wait4(proc, AGENT_EXIT_TIMEOUT_S if wrapped else 10.0)
        if reaped is None:
            state.notes.append("the agent did not exit after the workload; terminated")
            terminate(proc, 10.0)
            code, ru = proc.returncode, None
        else:
            code, ru = reaped
        arm.finish(state)
        stats = cg.stats() if cg else None
        if session is not None:
            _read_perf(session, result, state.notes)

    result.exit_code = code
    result.wall_s = t_end - t0
    summary = sampler.summary()
    for k, v in summary.items():
        if getattr(result, k) is None:
            setattr(result, k, v)
    for k, v in state.metrics.items():
        setattr(result, k, v)
    result.samples = sampler.samples
    if stats is not None:
        pre = usage_delta(info, "joined_cgroup", "before_exec")
        result.accounting = "cgroup"
        result.user_s = None if stats.user_s is None else max(0.0, stats.user_s - pre["utime"])
        result.sys_s = None if stats.sys_s is None else max(0.0, stats.sys_s - pre["stime"])
        result.minflt = None if stats.minflt is None else max(0, stats.minflt - int(pre["minflt"]))
        result.majflt = None if stats.majflt is None else max(0, stats.majflt - int(pre["majflt"]))
        result.cgroup_peak_bytes = stats.peak_bytes
        result.oom_kills = stats.oom_kills
        if stats.swap_peak_bytes is not None:
            result.swap_peak_bytes = max(stats.swap_peak_bytes, result.swap_peak_bytes or 0)
    elif ru is not None and not wrapped:
        pre = usage_delta(info, "none", "before_exec")
        result.accounting = "wait4"
        result.user_s = max(0.0, ru.ru_utime - pre["utime"])
        result.sys_s = max(0.0, ru.ru_stime - pre["stime"])
        result.minflt = max(0, ru.ru_minflt - int(pre["minflt"]))
        result.majflt = max(0, ru.ru_majflt - int(pre["majflt"]))
    elif child_usage is not None:
        result.accounting = "agent's reaped child"
        result.user_s, result.sys_s = child_usage.user_s, child_usage.sys_s
        result.minflt, result.majflt = child_usage.minflt, child_usage.majflt
    elif wrapped and stats is None:
        state.notes.append("the workload's CPU time could not be read: the agent exited before "
                           "its counters of the reaped workload were read")
    stdout_text = (rundir / "stdout.txt").read_text(errors="replace")
    result.ns_per_op = workloads.figure_of_merit(stdout_text)
    result.ops = workloads.operations(stdout_text)
    phase = workloads.measured_phase(stdout_text)
    if phase is not None:
        result.phase_s, result.phase_cpu_s = phase.seconds, phase.cpu_s
        result.late_from_s = phase.late_from_s
        result.late_ns_per_op, result.late_cpu_ns_per_op = (
            phase.late_ns_per_op, phase.late_cpu_ns_per_op)
    if timed_out:
        result.status = TIMEOUT
    elif result.oom_kills:
        result.status = OOM
    elif code != 0:
        result.status = FAILED
        tail = (rundir / "stderr.txt").read_text(errors="replace").strip().splitlines()[-3:]
        state.notes.append(f"exit code {code}: " + " / ".join(tail))
    else:
        result.status = OK


PROGRAM = CellKind("program",
                   lambda cell, vm, options: arms.make(cell.arm).mechanism(vm, options),
                   _execute)


def _watch(ctx: Context, cell: Cell, arm: arms.Arm, state: arms.RunState,
           sampler: Sampler, stdout_path: Path) -> bool:
    """Sample until the workload exits; True when it had to be killed at the timeout."""
    interval = ctx.exp.sample_interval_s
    deadline = sampler.t0 + ctx.exp.timeout_s
    wants_truth = cell.workload.program in GROUND_TRUTH_PROGRAMS
    try:
        pidfd = os.pidfd_open(sampler.pid)
    except ProcessLookupError:
        return False  # already gone: nothing to sample
    try:
        while True:
            now = time.monotonic()
            sampler.sample(now)
            if wants_truth and sampler.hot is None:
                ranges = workloads.hot_ranges(
                    stdout_path.read_text(errors="replace")
                    + stdout_path.with_name("stderr.txt").read_text(errors="replace"))
                if ranges:
                    sampler.set_hot(ranges, now)
                    sampler.sample(time.monotonic())
                    arm.on_hot_ranges(sampler.pid, sampler.t0, ranges, state)
            ready, _, _ = select.select([pidfd], [], [], interval)
            if ready:
                return False
            if time.monotonic() > deadline:
                state.notes.append(f"killed after the {ctx.exp.timeout_s:.0f} s timeout")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(sampler.pid, signal.SIGKILL)
                select.select([pidfd], [], [], 10.0)
                return True
    finally:
        os.close(pidfd)


def warm_up(ctx: Context, cell: Cell) -> None:
    """Run a workload once, unmeasured, before its first measured run: the first exec of a
    binary (and its input files) pays for page-cache misses, which in the VM (files over 9p,
    emulated CPU) made first runs several times slower than the rest."""
    rundir = ctx.out / "runs" / f".warmup-{cell.workload.name}_t{cell.threads}"
    shutil.rmtree(rundir, ignore_errors=True)
    cmd = workloads.resolve(cell.workload, cell.threads, BASELINE, rundir)
    stdin = open(cmd.stdin, "rb") if cmd.stdin else subprocess.DEVNULL  # noqa: SIM115
    proc = None
    try:
        with deferred_interrupts():
            proc = subprocess.Popen(cmd.argv, cwd=cmd.cwd, stdin=stdin,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
        proc.wait(timeout=ctx.exp.timeout_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if stdin is not subprocess.DEVNULL:
            stdin.close()
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(rundir, ignore_errors=True)


@dataclass
class Outcome:
    planned: int
    ran: int
    interrupted: bool
    elapsed_s: float
    errors: list[str] = field(default_factory=list)


def run_experiment(exp: Experiment, out: Path, previous: list[Path] | None = None,
                   stream: Any = None) -> Outcome:
    """Run every unfinished cell of `exp`, writing results under `out`."""
    vm = in_vm()
    cells, _ = expand(exp)
    check_runnable(exp, cells, vm)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(exp, out, list(previous or []), vm, tlb=pmu_available())
    for d in [*ctx.previous, out]:
        p = d / "limits.json"
        if p.exists():
            ctx.limits.update({k: int(v) for k, v in json.loads(p.read_text()).items()})
    todo = [c for c in cells if not is_done(ctx, c)]
    progress = Progress(todo, len(cells) - len(todo), stream)
    ctx.progress = progress
    started = time.monotonic()
    outcome = Outcome(len(cells), 0, False, 0.0)
    if not todo:
        progress.message(f"all {len(cells)} runs of {exp.name} are finished already")
        return outcome
    with sigterm_as_interrupt(), contextlib.ExitStack() as stack:
        stack.enter_context(ctx.resources)
        if vm:
            original = procfs.thp_mode()
            if original in ("always", "madvise", "never"):
                stack.callback(arms.set_global_thp, original)
            if arms.pause_damon_stat_in_vm():
                # Debian's 7.2+ boots DAMON_STAT: its exclusive kdamond would keep damo and
                # damon-hp's own kdamonds from starting, and read as a foreign kdamond.
                stack.callback(arms.resume_damon_stat_in_vm)
                progress.message("DAMON_STAT paused for the experiment (test VM); turned "
                                 "back on at the end")
            if (any(c.memory == "insufficient" for c in todo)
                    and exp.insufficient.swap == "zram" and active_swap_bytes() == 0):
                swap = ZramSwap.setup(exp.insufficient.swap_bytes)
                stack.callback(swap.teardown)
                progress.message(f"swap: zram {exp.insufficient.swap_bytes / 2**20:.0f} MiB "
                                 "for the insufficient-memory runs")
        warmed: set[tuple[str, int]] = set()
        try:
            for cell in todo:
                key = (cell.workload.name, cell.threads)
                if exp.warmup and key not in warmed and not cell.workload.app:
                    progress.message(f"warm-up run of {cell.workload.name}, {cell.threads} "
                                     "thread(s) (not measured)")
                    warm_up(ctx, cell)
                    warmed.add(key)
                progress.start(cell)
                result = run_cell(ctx, cell)
                save_run(out, result)
                outcome.ran += 1
                if result.status == ERROR:
                    outcome.errors.append(f"{cell.id}: {'; '.join(result.notes)}")
                    progress.message(f"{cell.id}: could not run: {'; '.join(result.notes)}")
                progress.finish(cell, result.status)
        except KeyboardInterrupt:
            outcome.interrupted = True
            progress.message("interrupted: cleaning up (processes, cgroups, kdamonds); "
                             "finished runs are kept, run the same command again to resume")
    outcome.elapsed_s = time.monotonic() - started
    if not outcome.interrupted:
        progress.close()
    return outcome
