"""The fault matrix, vm tier: faults that need a DAMON of damon-hp's own (a vaddr kdamond).

- PID reuse: the target exits while the agent is frozen and a new process gets its pid; the
  agent, pinned to the old process by a pidfd, stops ("target exit") and touches nothing of
  the new one.
- another tool stops our kdamond, removes its sysfs directory, or reconfigures it mid-run.

Each case fails if anything is lost or left behind: a running kdamond, a kdamond thread, an
ownership or status record, a tracefs instance of the agent, a process of its session.
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
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from damon_hp import procfs

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


def running_kdamonds() -> list[Path]:
    out = []
    for kd in sorted(KDAMONDS.glob("[0-9]*")):
        try:
            if sysfs(kd / "state") == "on":
                out.append(kd)
        except FileNotFoundError:
            continue
    return out


def kdamond_threads() -> list[int]:
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if (d / "comm").read_text().startswith("kdamond"):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def session_members(sid: int) -> list[str]:
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            text = (d / "stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[3]) == sid:
            out.append(f"{d.name} {text[text.index('(') + 1:text.rindex(')')]}")
    return out


def alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] != "Z"


def wait_for(what: str, ok: Callable[[], object], timeout_s: float = START_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


class Agent:
    def __init__(self, args: list[str], run_dir: Path) -> None:
        self.run_dir = run_dir
        self.proc = subprocess.Popen(
            [DAMON_HP, *args], env={**os.environ, "DAMON_HP_RUN_DIR": str(run_dir)},
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        self.pid = self.proc.pid

    def kdamond(self) -> Path:
        """Our kdamond's sysfs directory, once it runs (the only kdamond in the VM)."""
        found: list[Path] = []

        def one() -> bool:
            assert self.proc.poll() is None, f"the agent exited early:\n{self.finish()[1]}"
            found[:] = running_kdamonds()
            return len(found) == 1 and (self.run_dir / f"agent-{self.pid}.json").exists()

        wait_for("the agent's kdamond", one)
        return found[0]

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
    assert running_kdamonds() == [], "a kdamond was running before the test"
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
    wait_for("the agent to say so", lambda: not [
        n for n in os.listdir(INSTANCES) if n.startswith(f"damon-hp-{agent.pid}-")], 120)
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
