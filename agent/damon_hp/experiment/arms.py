"""How each arm is applied to one run, inside the VM and (for some) on the host.

Inside the test VM (DAMON_HP_IN_VM=1) the thp-* arms set the global THP mode. On the host the
global THP settings are never touched: thp-never becomes prctl(PR_SET_THP_DISABLE) on the
workload, thp-madvise runs only when the host already is in madvise mode, thp-always becomes
the LD_PRELOAD shim workloads/bin/libthp-always.so (every private anonymous mmap of the program
madvised MADV_HUGEPAGE) plus glibc's malloc tunable (malloc's own heap and arenas), damon-hp
runs with whatever access source works here (on a host whose DAMON is taken by a foreign paddr
kdamond: passive, reading that kdamond's events, writing nothing to DAMON), and damos-ethp
refuses (it needs a DAMON of its own). Each arm says how it was applied (`mechanism`); the
report shows it.

An arm's life in one run: `check` (before the experiment), `thp_mode` (set before the
workload starts), `wrap` (the command to spawn), `attach` (the workload's pid is known and it is
held before exec), `on_hot_ranges` (the benchmark printed its hot range), `finish` (the workload
exited), `cleanup` (always, also on Ctrl-C).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from damon_hp import procfs
from damon_hp.damon import kdamond
from damon_hp.damon.status import running_kdamond_pids as kdamond_pids
from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.experiment.spec import ArmOptions
from damon_hp.ranges import AddrRange, huge_starts
from damon_hp.vmguard import in_vm

THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
VENV_BIN = Path(sys.executable).parent
# The host's per-process THP always (workloads/preload/thp-always.c, built by make workloads).
THP_ALWAYS_SHIM = Path(__file__).resolve().parents[3] / "workloads" / "bin" / "libthp-always.so"
MALLOC_HUGETLB = "glibc.malloc.hugetlb=1"

# DAMON's example "ethp" scheme (DAMON evaluation documents): MADV_HUGEPAGE on regions of any
# size with >= 5% access frequency; MADV_NOHUGEPAGE on regions >= 2 MiB not accessed for >= 7 s.
ETHP_DAMO_ARGS = [
    "--damos_action", "hugepage",
    "--damos_sz_region", "min", "max",
    "--damos_access_rate", "5%", "max",
    "--damos_age", "min", "max",
    "--damos_action", "nohugepage",
    "--damos_sz_region", "2MiB", "max",
    "--damos_access_rate", "min", "min",
    "--damos_age", "7s", "max",
]  # fmt: skip

# Upstream's own answer (Linux 7.2+): the DAMOS `collapse` action (MADV_COLLAPSE done by the
# kdamond) on the workload's virtual memory, for regions of 2 MiB and more accessed at 5 % or
# more (the ethp rule's hot threshold), with a space quota so that one aggregation cannot copy
# unbounded memory: 100 MiB per second (our choice; DAMON_RECLAIM's documented example quota is
# of that order). Nothing demotes: collapse has no inverse action.
COLLAPSE_DAMO_ARGS = [
    "--damos_action", "collapse",
    "--damos_sz_region", "2MiB", "max",
    "--damos_access_rate", "5%", "max",
    "--damos_age", "min", "max",
    "--damos_quota_space", "100MiB",
    "--damos_quota_interval", "1000",
]  # fmt: skip

DAMON_STAT_ENABLED = Path("/sys/module/damon_stat/parameters/enabled")


def pause_damon_stat_in_vm() -> bool:
    """Test VM only: stop DAMON_STAT (7.2+ as Debian boots it), whose exclusive context keeps
    every arm that drives a kdamond of its own (damo, damon-hp's vaddr source) from starting.
    True when it was running and is now off (the caller turns it back on)."""
    if not in_vm():
        raise EnvironmentProblem("DAMON_STAT is paused only in the test VM")
    try:
        if DAMON_STAT_ENABLED.read_text().strip() != "Y":
            return False
    except OSError:
        return False
    DAMON_STAT_ENABLED.write_text("N")
    return True


def resume_damon_stat_in_vm() -> None:
    if in_vm():
        DAMON_STAT_ENABLED.write_text("Y")


def set_global_thp(mode: str) -> None:
    """Write the system THP mode: refused outside the test VM, whatever the caller wants."""
    if not in_vm():
        raise EnvironmentProblem(
            "refusing to change the global THP mode (/sys/kernel/mm/transparent_hugepage/"
            "enabled) outside the test VM (DAMON_HP_IN_VM is not 1); run the experiment with "
            'where = "vm", or on the host only with its host arms'
        )
    if procfs.thp_mode(str(THP_ENABLED)) != mode:
        THP_ENABLED.write_text(mode)


def tool(name: str) -> str:
    path = VENV_BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        raise EnvironmentProblem(f"{name} not found next to {sys.executable} or on PATH; "
                                 "run `make setup`")
    return found


@dataclass
class RunState:
    """What an arm learns during one run and hands back to the runner."""

    rundir: Path
    options: ArmOptions
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    agent_pid: int | None = None


class Arm:
    name = ""
    needs_hold = False  # the workload waits before exec until `attach` has run
    wraps = False  # `wrap` puts a program (an agent) between the runner and the workload
    uses_damon = False
    vm_thp = "never"  # global THP mode inside the VM

    def check(self, vm: bool) -> None:
        """Raise EnvironmentProblem when this arm cannot run here."""

    def thp_mode(self, vm: bool, options: ArmOptions) -> str | None:
        """The global THP mode to set before the run (None: leave it)."""
        return (options.thp or self.vm_thp) if vm else None

    def mechanism(self, vm: bool, options: ArmOptions) -> str:
        return f"system THP mode {self.thp_mode(vm, options)} (VM)" if vm else "host"

    def launcher_flags(self, vm: bool) -> list[str]:
        return []

    def env(self, vm: bool) -> dict[str, str]:
        return {}

    def wrap(self, argv: list[str], state: RunState) -> list[str]:
        return argv

    def attach(self, pid: int, state: RunState) -> None:
        pass

    def on_hot_ranges(self, pid: int, t0: float, ranges: list[AddrRange],
                      state: RunState) -> None:
        pass

    def finish(self, state: RunState) -> None:
        pass

    def cleanup(self, state: RunState) -> None:
        pass


class ThpNever(Arm):
    name = "thp-never"
    vm_thp = "never"

    def mechanism(self, vm: bool, options: ArmOptions) -> str:
        if vm:
            return "system THP mode never (VM)"
        return "prctl(PR_SET_THP_DISABLE) on the workload (host; global THP untouched)"

    def launcher_flags(self, vm: bool) -> list[str]:
        return [] if vm else ["--thp-disable"]


class ThpAlways(Arm):
    name = "thp-always"
    vm_thp = "always"

    def check(self, vm: bool) -> None:
        if vm:
            return
        if procfs.thp_mode() not in ("madvise", "always"):
            raise EnvironmentProblem(
                f"thp-always on the host needs THP mode madvise or always, the host has "
                f"{procfs.thp_mode()}; run it in the VM (where = \"vm\")"
            )
        if not THP_ALWAYS_SHIM.exists():
            raise EnvironmentProblem(
                f"thp-always on the host needs {THP_ALWAYS_SHIM} (the per-process THP-always "
                "LD_PRELOAD shim); run `make -C workloads`"
            )

    def mechanism(self, vm: bool, options: ArmOptions) -> str:
        if vm:
            return "system THP mode always (VM)"
        return (f"LD_PRELOAD={THP_ALWAYS_SHIM.name} (every private anonymous mmap >= 2 MiB "
                f"madvised MADV_HUGEPAGE) + GLIBC_TUNABLES={MALLOC_HUGETLB} (malloc's heap and "
                "arenas) under the host's THP mode madvise (host; global THP untouched)")

    def env(self, vm: bool) -> dict[str, str]:
        return {} if vm else thp_always_env()


def thp_always_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that makes one process (and its children) THP-always on a host in THP
    mode madvise: the shim first in LD_PRELOAD, the malloc tunable added to GLIBC_TUNABLES."""
    import os

    base = os.environ if base is None else base
    preload = " ".join(x for x in (str(THP_ALWAYS_SHIM), base.get("LD_PRELOAD", "")) if x)
    tunables = ":".join(x for x in (base.get("GLIBC_TUNABLES", ""), MALLOC_HUGETLB) if x)
    return {"LD_PRELOAD": preload, "GLIBC_TUNABLES": tunables}


class ThpMadvise(Arm):
    name = "thp-madvise"
    vm_thp = "madvise"

    def check(self, vm: bool) -> None:
        if not vm and procfs.thp_mode() != "madvise":
            raise EnvironmentProblem(
                f"thp-madvise on the host needs the host's THP mode to be madvise already (it is "
                f"{procfs.thp_mode()}; the global mode is never changed on the host); run it in "
                'the VM (where = "vm")'
            )

    def mechanism(self, vm: bool, options: ArmOptions) -> str:
        return ("system THP mode madvise (VM)" if vm
                else "the host's own THP mode madvise (host; untouched)")


def _check_damon_free(arm: str) -> None:
    """In the VM DAMON is ours. On the host an arm that drives DAMON itself refuses."""
    if in_vm():
        return
    raise EnvironmentProblem(
        f"{arm} needs a DAMON of its own, and not here: it runs only in the test VM. Run the "
        'experiment in the test VM (where = "vm")'
    )


def host_access_source() -> str:
    """The access source `damon-hp run --source auto` would take here (what `damon-hp doctor`
    says), or EnvironmentProblem with every source's reason. Read-only: nothing is written to
    DAMON or tracefs."""
    from damon_hp import damon, doctor

    status = damon.probe()
    checks = doctor.check_sources(status, doctor.read_tracefs(), {})
    verdict = checks[-1]
    if verdict.status != doctor.OK:
        lines = "; ".join(f"{c.name}: {c.detail}" for c in checks[:-1])
        raise EnvironmentProblem(f"no DAMON access source works here ({lines})")
    return verdict.detail.removeprefix("--source auto takes ")


class DamosEthp(Arm):
    name = "damos-ethp"
    needs_hold = True
    uses_damon = True
    vm_thp = "madvise"
    damo_args = ETHP_DAMO_ARGS
    scheme_text = "the ethp schemes"

    def __init__(self) -> None:
        self.started = False
        self.mine: dict[str, int] = {}

    def check(self, vm: bool) -> None:
        # VM only: `damo` leaves its configuration in sysfs, which only the VM may clean up.
        _check_damon_free(self.name)
        tool("damo")

    def mechanism(self, vm: bool, options: ArmOptions) -> str:
        return (f"damo start with {self.scheme_text} on the workload's pid (held before exec), "
                f"system THP mode {self.thp_mode(vm, options)} (VM); its kdamond turned off "
                "after the workload exits")

    def _damo(self, args: list[str]) -> tuple[int, str, float]:
        """Run damo; its exit code, output and CPU time (damo is this arm's user-space half,
        so its CPU time is the arm's agent time)."""
        import resource

        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run([tool("damo"), *args], capture_output=True, text=True, timeout=300,
                           check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        return r.returncode, (r.stdout or "") + (r.stderr or ""), cpu

    def attach(self, pid: int, state: RunState) -> None:
        foreign = kdamond_pids()
        if foreign:
            raise EnvironmentProblem(
                f"kdamond(s) {sorted(foreign)} are already running; damos-ethp cannot tell "
                "damo's kdamond from theirs, so it refuses to run next to one it did not start"
            )
        code, out, cpu = self._damo(["start", *self.damo_args, str(pid)])
        state.metrics["agent_cpu_s"] = cpu
        (state.rundir / "damo-start.txt").write_text(out)
        if code != 0:
            raise DamonHpError(f"damo start failed (exit {code}): {out.strip()[-500:]}")
        self.started = True
        self.mine = kdamond_pids()
        if not self.mine:
            raise DamonHpError(f"damo start exited 0 but no kdamond runs: {out.strip()[-300:]}")

    def finish(self, state: RunState) -> None:
        self._stop(state)

    def cleanup(self, state: RunState) -> None:
        self._stop(state)

    def _stop(self, state: RunState) -> None:
        """Turn off the kdamond damo started (what `damo stop` does, without its stopping of
        every kdamond and without a second damo start-up), then drop its sysfs configuration:
        damon-hp rightly refuses to wipe a configuration it did not make."""
        if not self.started:
            return
        self.started = False
        for index in self.mine:
            try:
                kdamond.stop_unowned_in_vm(index)
            except (OSError, DamonHpError) as e:
                state.notes.append(f"could not stop kdamond {index}: {e}")
        if kdamond_pids():
            code, out, cpu = self._damo(["stop"])
            state.metrics["agent_cpu_s"] = (state.metrics.get("agent_cpu_s") or 0.0) + cpu
            if kdamond_pids():
                state.notes.append(f"damo stop failed: {out.strip()[-200:]}")
                return
        if in_vm():
            kdamond.clear_all_in_vm()


class DamosCollapse(DamosEthp):
    """Upstream's DAMOS collapse scheme through damo (7.2+; refused by older kernels' DAMOS)."""

    name = "damos-collapse"
    damo_args = COLLAPSE_DAMO_ARGS
    scheme_text = ("a DAMOS collapse scheme (regions >= 2 MiB at >= 5 % access, quota "
                   "100 MiB/s)")

    def check(self, vm: bool) -> None:
        super().check(vm)
        from damon_hp.damon.status import kernel_version

        if kernel_version() < (7, 2):
            raise EnvironmentProblem(
                f"damos-collapse needs the DAMOS collapse action (Linux 7.2+); this kernel is "
                f"{'.'.join(map(str, kernel_version()))}: boot the main test kernel (7.3)")


class DamonHp(Arm):
    name = "damon-hp"
    wraps = True
    uses_damon = True
    vm_thp = "madvise"

    def check(self, vm: bool) -> None:
        if not vm:
            try:
                host_access_source()
            except EnvironmentProblem as e:
                raise EnvironmentProblem(f"{self.name} cannot run on this host: {e}. Run the "
                                         'experiment in the test VM (where = "vm")') from None
        tool("damon-hp")

    def mechanism(self, vm: bool, options: ArmOptions) -> str:
        extra = f" {' '.join(options.agent_args)}" if options.agent_args else " (defaults)"
        if not vm:
            try:
                source = f"source {host_access_source()}"
            except EnvironmentProblem:
                source = "no access source"
            return (f"damon-hp run{extra}, {source}, the host's own THP mode "
                    f"{procfs.thp_mode()} (untouched)")
        return f"damon-hp run{extra}, system THP mode {self.thp_mode(vm, options)} (VM)"

    def wrap(self, argv: list[str], state: RunState) -> list[str]:
        # The workload's own argv, nothing in between (see runner._follow_agent_child).
        out = state.rundir / "agent.json"
        return [tool("damon-hp"), "run", "--json", str(out), *state.options.agent_args,
                "--", *argv]

    def finish(self, state: RunState) -> None:
        path = state.rundir / "agent.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            state.notes.append("the agent wrote no --json output")
            return
        except json.JSONDecodeError as e:
            state.notes.append(f"agent JSON unreadable: {e}")
            return
        state.metrics.update(agent_metrics(data))


def _number(d: Any, *keys: str) -> float | None:
    for k in keys:
        if isinstance(d, dict) and isinstance(d.get(k), int | float):
            return float(d[k])
    return None


def agent_metrics(data: dict[str, Any]) -> dict[str, Any]:
    """What the runner takes from `damon-hp run --json`: the agent's and kdamond's CPU time,
    how soon its hot set was huge, and how much of the target a physical source could see.

    Tolerant of layout (flat or under "summary"): a missing figure stays None.
    """
    summary = data.get("summary", data) if isinstance(data, dict) else {}
    out: dict[str, Any] = {}
    agent = _number(summary, "agent_cpu_s")
    kdamond = _number(summary, "kdamond_cpu_s")
    if agent is not None:
        out["agent_cpu_s"] = agent
    if kdamond is not None:
        out["kdamond_cpu_s"] = kdamond
    timeline = data.get("timeline") if isinstance(data, dict) else None
    covered = agent_hot_huge_s(timeline)
    if covered is not None:
        out["agent_hot_huge_s"] = covered
    shares = [e["monitored_share"] for e in timeline or []
              if isinstance(e, dict) and isinstance(e.get("monitored_share"), int | float)]
    if shares:
        out["watched_share_min"] = min(shares)
    return out


def agent_hot_huge_s(timeline: Any, threshold: float = 0.9) -> float | None:
    """Seconds from the first snapshot in which the agent saw a hot set until >= 90% of the
    hot set it saw was mapped by huge pages (the agent's own view, for workloads without
    ground truth)."""
    if not isinstance(timeline, list):
        return None
    first = None
    for e in timeline:
        if not isinstance(e, dict):
            continue
        hot, huge, t = e.get("hot_bytes"), e.get("hot_huge_bytes"), e.get("t_s")
        if not isinstance(hot, int | float) or not isinstance(t, int | float) or hot <= 0:
            continue
        if first is None:
            first = float(t)
        if isinstance(huge, int | float) and huge >= threshold * hot:
            return float(t) - first
    return None


class DamonHpCompact(DamonHp):
    name = "damon-hp-compact"


@dataclass
class CollapseOutcome:
    bytes_done: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cpu_s: float = 0.0
    done_at_s: float | None = None


ORACLE_ATTEMPTS = 12
ORACLE_RETRY_S = 0.25


class Oracle(Arm):
    """Collapse exactly the benchmark's printed hot range with process_madvise(MADV_COLLAPSE)."""

    name = "oracle"
    vm_thp = "never"

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.outcome = CollapseOutcome()

    def mechanism(self, vm: bool, options: ArmOptions) -> str:
        where = f"system THP mode {self.thp_mode(vm, options)} (VM)" if vm else \
            "host; global THP untouched"
        return f"process_madvise(MADV_COLLAPSE) of the printed hot range, {where}"

    def on_hot_ranges(self, pid: int, t0: float, ranges: list[AddrRange],
                      state: RunState) -> None:
        self.thread = threading.Thread(target=self._collapse, args=(pid, t0, ranges),
                                       daemon=True)
        self.thread.start()

    def _collapse(self, pid: int, t0: float, ranges: list[AddrRange]) -> None:
        from damon_hp import actuate, procfs

        starts = [a for r in ranges for a in huge_starts(r)]
        try:
            target = actuate.Target.open(pid)
        except DamonHpError as e:
            self.outcome.errors[str(e)] = 1
            return
        with target, procfs.ProcessFiles(pid) as files:
            t, c = time.monotonic(), time.thread_time()
            pending = starts
            for attempt in range(ORACLE_ATTEMPTS):
                results = actuate.collapse(target, pending, files.maps_cover)
                pending = []
                last = attempt == ORACLE_ATTEMPTS - 1
                for r in results:
                    self.outcome.bytes_done += r.bytes_done
                    if r.error:
                        if r.error != actuate.UNMAPPED:  # gone: nothing to try again
                            pending.append(r.start)
                        if last or r.error == actuate.UNMAPPED:
                            self.outcome.errors[r.error] = self.outcome.errors.get(r.error, 0) + 1
                if not pending or target.exited():
                    break
                # EAGAIN is transient, and memory the program has not touched yet (no resident
                # page in a 2 MiB area) can be collapsed once it has: try again soon, since a
                # short benchmark may be over within a second or two.
                time.sleep(ORACLE_RETRY_S)
            self.outcome.seconds = time.monotonic() - t
            self.outcome.cpu_s = time.thread_time() - c
            self.outcome.done_at_s = time.monotonic() - t0

    def finish(self, state: RunState) -> None:
        if self.thread is None:
            state.notes.append("oracle: the benchmark never printed its hot range")
            return
        self.thread.join(timeout=60)
        o = self.outcome
        # The collapse runs in the runner's thread and is charged to it: that is the oracle's
        # whole cost, so it is the oracle's "agent" CPU time.
        state.metrics["agent_cpu_s"] = o.cpu_s
        state.notes.append(
            f"oracle collapsed {o.bytes_done / 2**20:.0f} MiB in {o.seconds:.2f} s"
            + (f", errors {o.errors}" if o.errors else "")
        )


class Everywhere(Arm):
    """App workloads only: applied by experiment/apps/cell.py after the server's warm-up."""

    name = "everywhere"

    def check(self, vm: bool) -> None:
        if vm:
            raise EnvironmentProblem("everywhere is an arm of app workloads, which run on the "
                                     'host (where = "host")')


ARM_CLASSES: dict[str, type[Arm]] = {
    cls.name: cls
    for cls in (ThpNever, ThpAlways, ThpMadvise, DamosEthp, DamosCollapse, DamonHp,
                DamonHpCompact, Oracle, Everywhere)
}


def make(name: str) -> Arm:
    return ARM_CLASSES[name]()
