"""The fault matrix, vm tier: faults that need a DAMON of damon-hp's own (a vaddr kdamond).

- PID reuse: the target exits while the agent is frozen and a new process gets its pid; the
  agent, pinned to the old process by a pidfd, stops ("target exit") and touches nothing of
  the new one.
- another tool stops our kdamond, removes its sysfs directory, or reconfigures it mid-run.
- DAMON sysfs busy (EBUSY) because another tool holds its lock: for a few seconds (waited out)
  and for as long as the agent tries (a clear error after the bound, nothing configured).
- collapses refused under memory pressure (a cgroup's memory.max below one more huge page):
  each failure counted, the back-off holds per range, the workload finishes normally.

Each case fails if anything is lost or left behind: a running kdamond, a kdamond thread, an
ownership or status record, a tracefs instance of the agent, a process of its session (and, for
the cases above, a configured kdamond dir of the agent's or the test's cgroup).
The agent SIGKILLed mid-run (its kdamond reclaimed by the next start) is
tests/vm/test_agent.py::test_agent_killed_with_sigkill_is_cleaned_up_by_the_next_start.
`FAULTS_INJECTED` counts the cases that passed (printed, inside the VM, at the module's end).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from collapse_errors import EXIT_ERRORS, exit_cut
from damon_hp import procfs
from damon_hp.policy import PolicyParams
from leftovers import (
    alive,
    instances_of,
    kdamond_threads,
    running_kdamonds,
    session_members,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = str(ROOT / ".venv/bin/damon-hp")
HOTCOLD = str(ROOT / "workloads/bin/hotcold")
KDAMONDS = Path("/sys/kernel/mm/damon/admin/kdamonds")
INSTANCES = Path("/sys/kernel/tracing/instances")
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
START_S = 180.0  # the agent's start under emulation on a loaded host: generous, not a bar

FAULTS_INJECTED: list[str] = []


def hotcold(seconds: int, hot: str = "32M", cold: str = "32M") -> list[str]:
    return [HOTCOLD, "--hot", hot, "--cold", cold, "--seconds", str(seconds)]


def sysfs(path: Path, value: str | None = None) -> str:
    """Read (or write) a DAMON sysfs file; it answers EBUSY while a kdamond holds its lock."""
    for _ in range(400):
        try:
            if value is None:
                return path.read_text().strip()
            path.write_text(value)
            return value
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            time.sleep(0.05)
    raise TimeoutError(f"{path} stayed busy")


class Agent:
    def __init__(self, args: list[str], run_dir: Path) -> None:
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            [DAMON_HP, *args], env={**os.environ, "DAMON_HP_RUN_DIR": str(run_dir)},
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        self.pid = self.proc.pid

    def kdamond(self) -> Path:
        """Our kdamond's sysfs directory, once the agent has started it and opened its event
        stream (the only kdamond in the VM). The claim record alone comes before the kdamond
        starts: a loaded fresh-clone run stopped the kdamond inside the agent's start-up, and
        the agent rightly said it had not started, not that monitoring was lost."""
        found: dict[Path, int] = {}

        def one() -> bool:
            assert self.proc.poll() is None, f"the agent exited early:\n{self.finish()[1]}"
            found.clear()
            found.update(running_kdamonds())
            stream = any(n.startswith(f"damon-hp-{self.pid}-") for n in os.listdir(INSTANCES))
            return (len(found) == 1 and stream
                    and (self.run_dir / f"agent-{self.pid}.json").exists())

        wait_for("the agent's kdamond", one, START_S)
        return next(iter(found))

    def finish(self, timeout_s: float = 300) -> tuple[str, str]:
        try:
            return self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            return self.proc.communicate()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict]:
    """THP `never` (every huge page is the agent's), a private run directory, and the check
    that nothing is left behind."""
    assert running_kdamonds() == {}, "a kdamond was running before the test"
    old_thp = procfs.thp_mode()
    THP_ENABLED.write_text("never")
    w: dict = {"run_dir": tmp_path / "run", "agents": [], "targets": []}
    try:
        yield w
    finally:
        for a in w["agents"]:
            if a.proc.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
                a.proc.communicate()
        for t in w["targets"]:
            if t.poll() is None:
                t.kill()
            t.wait()
        THP_ENABLED.write_text(old_thp)
    for a in w["agents"]:
        assert [n for n in os.listdir(INSTANCES) if n.startswith(f"damon-hp-{a.pid}-")] == []
        wait_for("the agent's session to end", lambda a=a: not session_members(a.pid), 60)
    wait_for("no kdamond running", lambda: not running_kdamonds() and not kdamond_threads(), 60)
    run_dir = w["run_dir"]
    left = sorted(p.name for p in run_dir.iterdir()) if run_dir.exists() else []
    assert left == [], f"records left: {left}"


def start_agent(world: dict, args: list[str]) -> Agent:
    a = Agent(args, world["run_dir"])
    world["agents"].append(a)
    return a


def start_target(world: dict, argv: list[str]) -> subprocess.Popen:
    t = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    world["targets"].append(t)
    t.stdout.readline()  # its ranges: memory is mapped and touched
    return t


def passed(request: pytest.FixtureRequest) -> None:
    FAULTS_INJECTED.append(request.node.name)


@pytest.fixture(scope="module", autouse=True)
def _tally(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    plugins = request.config.pluginmanager
    reporter, capman = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capman is not None:
        with capman.global_and_fixture_disabled():
            reporter.write_line(f"\nfault matrix (vm): {len(FAULTS_INJECTED)} faults injected "
                                "and passed, nothing left behind")


# --------------------------------------------------------------------------------------------
# PID reuse


def spawn_at_pid(pid: int, argv: list[str], tries: int = 50) -> subprocess.Popen:
    """Start argv as process `pid` (free again): ns_last_pid makes it the next pid handed out,
    unless some other fork takes it first; then try again."""
    for _ in range(tries):
        NS_LAST_PID.write_text(str(pid - 1))
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    raise AssertionError(f"could not start a process with pid {pid} in {tries} tries")


def test_pid_reused_after_the_target_exits_is_never_touched(world, tmp_path, request) -> None:
    out = tmp_path / "out.json"
    old = start_target(world, hotcold(600))
    agent = start_agent(world, ["attach", "-q", "--json", str(out), str(old.pid)])
    agent.kdamond()
    agent.proc.send_signal(signal.SIGSTOP)  # frozen between two steps, old pid in hand
    try:
        old.kill()
        old.wait()
        new = spawn_at_pid(old.pid, hotcold(600))
        world["targets"].append(new)
        ranges = json.loads(new.stdout.readline())
        assert ranges["pid"] == old.pid
    finally:
        agent.proc.send_signal(signal.SIGCONT)
    resumed_at = time.monotonic()
    _, err = agent.finish()
    assert agent.proc.returncode == 0, err
    report = json.loads(out.read_text())
    assert report["summary"]["stopped_by"] == "target exit"
    # Nothing after the resume: no collapse, no mark, and none of the new process's memory
    # is huge or marked (THP is `never`: only the agent could have made huge pages).
    late = [e for e in report["timeline"] if e["monotonic_s"] >= resumed_at]
    assert all(e["actions"]["collapse"]["tried"] == 0 for e in late), late
    assert alive(new.pid)
    maps = procfs.read_smaps(new.pid)
    assert sum(m.counters.get("AnonHugePages", 0) for m in maps) == 0
    # (the program's own thread stacks carry `nh`: only its two buffers are the agent's to mark)
    buffers = [(ranges[k]["start"], ranges[k]["end"]) for k in ("hot", "cold")]
    marked = [m for m in maps if {"hg", "nh"} & set(m.vm_flags)
              and any(m.start < hi and lo < m.end for lo, hi in buffers)]
    assert marked == []
    passed(request)


# --------------------------------------------------------------------------------------------
# another tool stops or reconfigures our kdamond


def stop_it(kd: Path) -> None:
    sysfs(kd / "state", "off")
    wait_for("the kdamond to stop", lambda: sysfs(kd / "state") == "off", 60)


def stop_and_remove_it(kd: Path) -> None:
    stop_it(kd)
    sysfs(kd.parent / "nr_kdamonds", "0")  # its directory is gone too


INTERFERENCE = {"stopped": stop_it, "stopped-and-removed": stop_and_remove_it}


@pytest.mark.parametrize("how", list(INTERFERENCE))
def test_attach_whose_kdamond_another_tool_stops_says_so_and_leaves_nothing(
        world, tmp_path, request, how) -> None:
    target = start_target(world, hotcold(600))
    out = tmp_path / "out.json"
    agent = start_agent(world, ["attach", "-q", "--json", str(out), str(target.pid)])
    INTERFERENCE[how](agent.kdamond())
    _, err = agent.finish()
    assert agent.proc.returncode == 1, err
    assert "monitoring was lost" in err and f"damon-hp attach {target.pid}" in err, err
    assert "Traceback" not in err
    assert json.loads(out.read_text())["summary"]["stopped_by"] == "kdamond stopped"
    assert alive(target.pid), "the target must run on"
    passed(request)


def test_run_whose_kdamond_another_tool_stops_lets_the_command_finish(world, request) -> None:
    agent = start_agent(world, ["run", "-q", "--", "sh", "-c",
                                f"{HOTCOLD} --hot 32M --cold 32M --seconds 600 >/dev/null & "
                                "echo $!; wait $!; exit 6"])
    hotcold_pid = int(agent.proc.stdout.readline())
    stop_it(agent.kdamond())
    wait_for("the agent to say so", lambda: not instances_of(agent.pid), 120)
    assert alive(hotcold_pid) and agent.proc.poll() is None, "the command must run on"
    os.kill(hotcold_pid, signal.SIGTERM)
    _, err = agent.finish()
    assert agent.proc.returncode == 6, err
    assert "monitoring was lost" in err and "runs on without huge-page management" in err, err
    assert "Traceback" not in err
    passed(request)


def test_attach_whose_kdamond_another_tool_reconfigures_runs_on_and_stops_cleanly(
        world, request) -> None:
    target = start_target(world, hotcold(600))
    agent = start_agent(world, ["attach", "-q", str(target.pid)])
    kd = agent.kdamond()
    intervals = kd / "contexts/0/monitoring_attrs/intervals"
    sysfs(intervals / "sample_us", "30000")
    sysfs(intervals / "aggr_us", "600000")
    sysfs(kd / "state", "commit")
    time.sleep(5)  # some aggregations at the new intervals (not a speed bar)
    assert agent.proc.poll() is None, agent.finish()[1]
    agent.proc.send_signal(signal.SIGTERM)
    _, err = agent.finish()
    assert agent.proc.returncode == 0, err
    assert "Traceback" not in err
    assert alive(target.pid)
    passed(request)


# --------------------------------------------------------------------------------------------
# DAMON sysfs busy (EBUSY) for seconds
#
# DAMON sysfs guards its files with one mutex its handlers only try-lock (EBUSY while it is
# held). Another tool holds it for seconds, for real, by rewriting a large `nr_regions` in its
# own idle kdamond dir: the kernel removes and re-creates every region directory with the lock
# held (~1 s per rewrite of 60,000 here; a separate prober got through 0 times in 1,076 tries).
# The agent's dir is an empty one beside it, which it may reuse (placement.py).

HAMMER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, sys.argv[2].encode(), 0)
print("holding", flush=True)
while True:
    os.pwrite(fd, sys.argv[2].encode(), 0)
"""
# Region dirs another tool rewrites in a loop: each rewrite holds DAMON's lock for ~1 s (up to
# 5 s on a loaded host), so the lock is free only for the microseconds between two rewrites.
REGIONS_HELD = 60_000
# "Busy for a couple of seconds": this long after the agent has claimed its target (its first
# DAMON read follows within a second or two), plus the rewrite still in progress when the other
# tool is stopped. The agent's bound (damon/io.py EBUSY_RETRY_S) is 10 s per operation; the
# longest wait seen was 6.9 s with 20,000 dirs at load 12, so fewer dirs here keep that tail
# short (~0.2 s unloaded).
BUSY_FOR_S = 3.0
REGIONS_HELD_BRIEFLY = 10_000


@pytest.fixture
def other_tool() -> Iterator[dict]:
    """An idle kdamond dir configured by another tool (1) beside an empty one (0, ours to
    reuse); the other tool's dirs are removed afterwards."""
    sysfs(KDAMONDS / "nr_kdamonds", "2")  # fresh dirs (`world` has checked that none runs)
    sysfs(KDAMONDS / "1/contexts/nr_contexts", "1")
    sysfs(KDAMONDS / "1/contexts/0/targets/nr_targets", "1")
    tool: dict = {"regions": KDAMONDS / "1/contexts/0/targets/0/regions/nr_regions",
                  "hammer": None}
    try:
        yield tool
    finally:
        stop_hammer(tool)
        # Ours must be as the agent found it: empty (the other tool's dir is not its to touch).
        ours = sorted(p.name for p in (KDAMONDS / "0/contexts").iterdir())
        sysfs(KDAMONDS / "nr_kdamonds", "0")
    assert ours == ["nr_contexts"], f"the agent left its kdamond dir configured: {ours}"


def start_hammer(tool: dict, regions: int) -> None:
    """The other tool starts rewriting its region count: DAMON sysfs is busy from now on."""
    h = subprocess.Popen([sys.executable, "-c", HAMMER, str(tool["regions"]), str(regions)],
                         stdout=subprocess.PIPE, text=True)
    tool["hammer"] = h
    assert h.stdout.readline().strip() == "holding", "the busy-maker did not start"


def stop_hammer(tool: dict) -> None:
    h = tool["hammer"]
    if h is not None and h.poll() is None:
        h.send_signal(signal.SIGTERM)  # takes effect when the rewrite in progress returns
        h.wait(timeout=120)
    tool["hammer"] = None


def test_damon_sysfs_busy_for_seconds_is_waited_out(world, other_tool, tmp_path,
                                                     request) -> None:
    target = start_target(world, hotcold(600))
    out = tmp_path / "out.json"
    start_hammer(other_tool, REGIONS_HELD_BRIEFLY)
    agent = start_agent(world, ["attach", "-q", "--json", str(out), str(target.pid)])
    wait_for("the agent to claim its target",
             lambda: (world["run_dir"] / f"agent-{agent.pid}.json").exists(), START_S)
    time.sleep(BUSY_FOR_S)
    stop_hammer(other_tool)
    agent.kdamond()
    agent.proc.send_signal(signal.SIGTERM)
    _, err = agent.finish()
    assert agent.proc.returncode == 0, err
    assert "Traceback" not in err
    notes = json.loads(out.read_text())["summary"].get("notes", [])
    busy = [n for n in notes if n.startswith("DAMON sysfs was busy (EBUSY)")]
    assert busy, f"the agent never waited on a busy DAMON (the fault was not injected): {notes}"
    assert alive(target.pid)
    passed(request)


def test_damon_sysfs_busy_beyond_the_bound_fails_clearly_and_leaves_nothing(
        world, other_tool, request) -> None:
    start_hammer(other_tool, REGIONS_HELD)
    agent = start_agent(world, ["run", "-q", "--", HOTCOLD, "--hot", "32M", "--cold", "32M",
                                "--seconds", "600"])
    # Busy for as long as the agent tries: it must give up by itself (finish() times out
    # and fails the test otherwise).
    _, err = agent.finish(timeout_s=240)
    stop_hammer(other_tool)
    assert agent.proc.returncode == 1, err
    assert "DAMON sysfs stayed busy (EBUSY) for 10 s" in err, err
    assert "another program holds DAMON's sysfs lock" in err, err
    assert "Traceback" not in err
    # No kdamond, tracefs instance, record or child (the held command): `world` checks them.
    passed(request)


# --------------------------------------------------------------------------------------------
# collapses refused under memory pressure
#
# The target runs in a cgroup whose memory.max leaves less room than one huge page: every
# MADV_COLLAPSE must charge a new 2 MiB page to it before the 4 KiB pages go, and fails. On
# 6.12 a failed memcg charge reads EBUSY (madvise_collapse_errno: SCAN_CGROUP_CHARGE_FAIL); a
# failed huge-page allocation reads ENOMEM, and a page that cannot be isolated EAGAIN.

CGROUP_ROOT = Path("/sys/fs/cgroup")
PRESSURE_ERRNOS = {"EBUSY", "ENOMEM", "EAGAIN"}
# Room above the target's usage: under one huge page, above what its thread stacks still touch.
HEADROOM_BYTES = 512 << 10
# The workload runs until the agent has tried collapsing for PRESSURE_OBSERVE_S (long enough for
# the back-off to double a few times), then is told to stop. A fixed 40 s run once ended before
# a loaded VM's agent had tried anything (a fresh-clone suite beside another and a host
# experiment, 2026-11-25).
PRESSURE_OBSERVE_S = 30
FIRST_TRY_S = 300


def attempts_allowed(seconds: float, retry_after_s: float, max_retry_after_s: float) -> int:
    """Collapses of one range within `seconds` that the documented back-off allows: the first,
    then one after each wait of retry_after_s, doubling, at most max_retry_after_s."""
    n, waited, delay = 1, 0.0, retry_after_s
    while waited + delay <= seconds:
        waited += delay
        n += 1
        delay = min(delay * 2, max_retry_after_s)
    return n


@pytest.fixture
def tight_cgroup() -> Iterator[Path]:
    cg = CGROUP_ROOT / f"damon-hp-test-pressure-{os.getpid()}"
    controllers = CGROUP_ROOT / "cgroup.subtree_control"
    if "memory" not in controllers.read_text().split():
        controllers.write_text("+memory")
    cg.mkdir()
    try:
        yield cg
    finally:
        for pid in (cg / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        wait_for("the pressure cgroup to empty",
                 lambda: not (cg / "cgroup.procs").read_text().split(), 60)
        cg.rmdir()
    assert not cg.exists()


def test_collapses_refused_under_memory_pressure_back_off_and_the_workload_finishes(
        world, tight_cgroup, tmp_path, request) -> None:
    cg = tight_cgroup
    target = start_target(world, ["sh", "-c", f"echo $$ > {cg}/cgroup.procs && exec "
                                  + " ".join(hotcold(FIRST_TRY_S + 4 * PRESSURE_OBSERVE_S))])
    (cg / "memory.max").write_text(str(int((cg / "memory.current").read_text())
                                       + HEADROOM_BYTES))
    out = tmp_path / "out.json"
    agent = start_agent(world, ["attach", "-q", "--json", str(out), str(target.pid)])
    record = world["run_dir"] / f"agent-{agent.pid}.json"

    def tried() -> int:
        assert agent.proc.poll() is None, f"the agent exited early:\n{agent.finish()[1]}"
        try:
            return json.loads(record.read_text()).get("collapses_tried", 0)
        except (OSError, ValueError):
            return 0  # not written yet

    wait_for("the agent's first collapse attempt", tried, FIRST_TRY_S, every_s=1)
    time.sleep(PRESSURE_OBSERVE_S)
    target.send_signal(signal.SIGTERM)
    _, err = agent.finish()
    assert agent.proc.returncode == 0, err
    assert "Traceback" not in err
    # The workload ran until told to stop and was never OOM-killed.
    assert target.wait(timeout=60) == 0
    assert json.loads(target.stdout.read().splitlines()[-1])["stopped_by"] == "SIGTERM"
    events = dict(line.split() for line in (cg / "memory.events").read_text().splitlines())
    assert events["oom_kill"] == "0", events

    report = json.loads(out.read_text())
    summary = report["summary"]
    assert summary["stopped_by"] == "target exit"
    collapse = summary["collapse"]
    assert collapse["tried"] > 0, "the agent never tried a collapse: no pressure was tested"
    assert collapse["ok"] == 0, f"a collapse got through the memory limit: {collapse}"
    assert sum(collapse["errors"].values()) == collapse["tried"], collapse
    # hotcold unmaps its buffers on SIGTERM: a batch running then fails UNMAPPED on the ranges
    # left (actuate.collapse), and ESRCH once the process is gone; only that batch may.
    tries = [a for a in report["actions"] if a["action"] == "collapse"]
    assert {a["error"] for a in tries} - {None} <= PRESSURE_ERRNOS | set(EXIT_ERRORS)
    assert sum(a["error"] in EXIT_ERRORS for a in tries) == sum(
        exit_cut(report["actions"]).values()), collapse
    # No retry storm: each range is tried no more often than the back-off allows over the
    # whole run (policy.PolicyParams: retry after 2 s, doubling up to 60 s).
    p = PolicyParams()
    allowed = attempts_allowed(summary["wall_s"], p.retry_after_s, p.max_retry_after_s)
    per_range: dict[int, int] = {}
    for a in report["actions"]:
        if a["action"] == "collapse":
            per_range[a["start"]] = per_range.get(a["start"], 0) + 1
    assert sum(per_range.values()) == collapse["tried"]
    worst = max(per_range.values())
    assert worst <= allowed, (f"a range was tried {worst} times in {summary['wall_s']} s; the "
                              f"back-off allows {allowed}: {sorted(per_range.values())}")
    passed(request)
