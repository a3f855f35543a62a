"""The fault matrix, host tier: faults injected into real damon-hp runs on this host.
(Named _host: tests/vm/test_faults.py has the vm tier's, and `make test` collects both tiers
in one session, where two test modules may not share a basename.)

Here damon-hp runs through the passive source (the foreign paddr kdamond's events, read from a
private tracefs instance); nothing is ever written under /sys/kernel/mm/damon. Each case
injects one fault and fails if anything is lost or left behind: a tracefs instance of an agent,
a status record, a process of the agent's session (the command of `run`), a changed kdamond or
THP setting. The faults about cleanup need no hot memory, so runs are short and small.

Kdamond faults (someone stops or reconfigures our kdamond) and PID reuse need a DAMON of our
own: tests/vm/test_faults.py. `FAULTS_INJECTED` counts the cases that passed (printed at the
end of the module's run).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from leftovers import alive, instances_of, kdamond_states, session_members, wait_for
from thp_settings import thp_settings

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = str(Path(sys.executable).parent / "damon-hp")
HOTCOLD = str(ROOT / "workloads/bin/hotcold")
ADMIN = Path("/sys/kernel/mm/damon/admin")
INSTANCES = Path("/sys/kernel/tracing/instances")
EVENT = "events/damon/damon_aggregated"
START_S = 90.0  # generous: the agent's start is a few seconds here, more on a loaded host

FAULTS_INJECTED: list[str] = []

pytestmark = pytest.mark.usefixtures("foreign_kdamond")  # never a skip: conftest.py


def hotcold(seconds: int, hot: str = "64M", cold: str = "64M") -> list[str]:
    return [HOTCOLD, "--hot", hot, "--cold", cold, "--seconds", str(seconds)]


# --------------------------------------------------------------------------------------------
# what must never be left behind












class Agent:
    """One damon-hp process in a session of its own, with a private run directory."""

    def __init__(self, args: list[str], run_dir: Path, *, prefix: list[str] | None = None,
                 stdout: int | None = subprocess.PIPE) -> None:
        self.run_dir = run_dir
        env = {**os.environ, "DAMON_HP_RUN_DIR": str(run_dir)}
        self.proc = subprocess.Popen([*(prefix or []), DAMON_HP, *args], cwd=ROOT, env=env,
                                     stdin=subprocess.DEVNULL, stdout=stdout,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.pid = self.proc.pid
        self.out = self.err = ""

    def record(self) -> dict | None:
        try:
            return json.loads((self.run_dir / f"agent-{self.pid}.json").read_text())
        except (OSError, ValueError):
            return None

    def started(self) -> bool:
        """Monitoring runs: our tracefs instance exists and the record names the source."""
        assert self.proc.poll() is None, f"the agent exited early:\n{self.finish()[1]}"
        rec = self.record()
        return bool(instances_of(self.pid) and rec and rec.get("source"))

    def wait_started(self) -> None:
        wait_for(f"agent {self.pid} to start monitoring", self.started, START_S)

    def instance(self) -> Path:
        names = instances_of(self.pid)
        assert len(names) == 1, names
        return INSTANCES / names[0]

    def finish(self, timeout_s: float = 120) -> tuple[str, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            out, err = self.proc.communicate()
        self.out, self.err = out or "", err or ""
        return self.out, self.err

    def kill_session(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.communicate()


def assert_nothing_left(agents: list[Agent], run_dir: Path) -> None:
    for a in agents:
        assert a.proc.poll() is not None, f"agent {a.pid} still runs"
        assert instances_of(a.pid) == [], f"tracefs instance of agent {a.pid} left"
        wait_for(f"agent {a.pid}'s session to end", lambda a=a: not session_members(a.pid), 30)
    left = sorted(p.name for p in run_dir.iterdir()) if run_dir.exists() else []
    assert left == [], f"records left in the run directory: {left}"


@pytest.fixture
def world(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict]:
    """A private run directory; the system's kdamonds and THP settings, checked afterwards."""
    before = (kdamond_states(), thp_settings())
    started: list[Agent] = []
    targets: list[subprocess.Popen] = []
    yield {"run_dir": tmp_path / "run", "agents": started, "targets": targets}
    for a in started:
        a.kill_session()
    for t in targets:
        if t.poll() is None:
            t.kill()
        t.wait()
    assert (kdamond_states(), thp_settings()) == before


def passed(request: pytest.FixtureRequest) -> None:
    FAULTS_INJECTED.append(request.node.name)


@pytest.fixture(scope="module", autouse=True)
def _tally(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    plugins = request.config.pluginmanager
    reporter, capman = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capman is not None:
        with capman.global_and_fixture_disabled():
            reporter.write_line(f"\nfault matrix (host): {len(FAULTS_INJECTED)} faults injected "
                                "and passed, nothing left behind")


def start_target(world: dict, argv: list[str]) -> subprocess.Popen:
    t = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    world["targets"].append(t)
    return t


def start_agent(world: dict, args: list[str], **kw) -> Agent:
    a = Agent(args, world["run_dir"], **kw)
    world["agents"].append(a)
    return a


# --------------------------------------------------------------------------------------------
# the target exits or execs during the run


def test_run_whose_command_exits_mid_run_ends_with_its_exit_code(world, tmp_path, request):
    out = tmp_path / "out.json"
    a = start_agent(world, ["run", "-q", "--json", str(out), "--", "sh", "-c",
                            f"{HOTCOLD} --hot 64M --cold 64M --seconds 3 >/dev/null; exit 3"])
    _, err = a.finish()
    assert a.proc.returncode == 3, err
    assert json.loads(out.read_text())["summary"]["stopped_by"] == "target exit"
    assert_nothing_left([a], world["run_dir"])
    passed(request)


def test_run_whose_command_is_killed_mid_run_exits_128_plus_the_signal(world, request):
    a = start_agent(world, ["run", "-q", "--", *hotcold(600)])
    pid = json.loads(a.proc.stdout.readline())["pid"]
    a.wait_started()
    os.kill(pid, signal.SIGKILL)
    _, err = a.finish()
    assert a.proc.returncode == 128 + signal.SIGKILL, err
    assert "target exit" in err
    assert_nothing_left([a], world["run_dir"])
    passed(request)


def test_attach_whose_target_is_killed_mid_run_stops_cleanly(world, tmp_path, request):
    target = start_target(world, hotcold(600))
    out = tmp_path / "out.json"
    a = start_agent(world, ["attach", "-q", "--json", str(out), str(target.pid)])
    a.wait_started()
    target.kill()
    target.wait()
    _, err = a.finish()
    assert a.proc.returncode == 0, err
    assert json.loads(out.read_text())["summary"]["stopped_by"] == "target exit"
    assert_nothing_left([a], world["run_dir"])
    passed(request)


@pytest.mark.parametrize("mode", ["run", "attach"])
def test_a_target_that_execs_mid_run_stays_the_target(world, tmp_path, request, mode):
    # The program after exec is the same process: the pidfd and the agent follow it, and its
    # 128 MiB show in the agent's readings.
    out, go = tmp_path / "out.json", tmp_path / "go"
    os.mkfifo(go)
    script = f"read x < {go}; exec {HOTCOLD} --hot 64M --cold 64M --seconds 14"
    if mode == "run":
        a = start_agent(world, ["run", "-q", "--json", str(out), "--", "sh", "-c", script])
    else:
        target = start_target(world, ["sh", "-c", script])
        a = start_agent(world, ["attach", "-q", "--json", str(out), str(target.pid)])
    a.wait_started()  # monitoring the shell
    go.write_text("exec\n")
    ranges = json.loads((a.proc if mode == "run" else target).stdout.readline())
    _, err = a.finish()
    assert a.proc.returncode == 0, err
    s = json.loads(out.read_text())["summary"]
    assert s["target_pid"] == ranges["pid"]  # the shell's pid, now hotcold's
    assert s["stopped_by"] == "target exit"
    assert s["peak_rss_bytes"] >= 128 << 20, s
    assert_nothing_left([a], world["run_dir"])
    passed(request)


# --------------------------------------------------------------------------------------------
# the agent is SIGKILLed mid-run


@pytest.mark.parametrize("mode", ["run", "attach"])
def test_agent_sigkilled_mid_run_is_cleaned_up_by_the_next_start(world, request, mode):
    if mode == "run":
        first = start_agent(world, ["run", "-q", "--", *hotcold(600)])
        command_pid = json.loads(first.proc.stdout.readline())["pid"]
        target_pid = None
    else:
        target = start_target(world, hotcold(600))
        target_pid = target.pid
        first = start_agent(world, ["attach", "-q", str(target_pid)])
    first.wait_started()
    stale = instances_of(first.pid)
    first.proc.kill()  # SIGKILL: nothing of the agent's cleanup runs
    first.finish()
    if mode == "run":  # the command must not outlive its agent (PR_SET_PDEATHSIG)
        wait_for("the command to follow its agent", lambda: not alive(command_pid), 30)
    else:
        assert alive(target_pid), "attach must never end its target"
    assert instances_of(first.pid) == stale, "the killed agent's instance should still be there"
    assert first.record() is not None, "the killed agent's record should still be there"
    status = subprocess.run([DAMON_HP, "status", "--json"], capture_output=True, text=True,
                            env={**os.environ, "DAMON_HP_RUN_DIR": str(world["run_dir"])})
    assert [a["alive"] for a in json.loads(status.stdout)["agents"]] == [False]

    # The next start (attach to the same process: a dead agent's claim does not count).
    victim = target_pid if mode == "attach" else start_target(world, hotcold(600)).pid
    second = start_agent(world, ["attach", "-q", str(victim)])
    second.wait_started()
    assert instances_of(first.pid) == [], "the next start did not remove the stale instance"
    assert first.record() is None, "the next start did not drop the dead agent's record"
    second.proc.send_signal(signal.SIGTERM)
    _, err = second.finish()
    assert second.proc.returncode == 0, err
    assert alive(victim)
    assert_nothing_left([first, second], world["run_dir"])
    passed(request)


# --------------------------------------------------------------------------------------------
# someone changes our tracefs instance mid-run


def disable_event(inst: Path) -> None:
    (inst / EVENT / "enable").write_text("0")


def change_filter(inst: Path) -> None:
    (inst / EVENT / "filter").write_text("common_pid == 1")


def tracing_off(inst: Path) -> None:
    (inst / "tracing_on").write_text("0")


TAMPERING = {
    "event-disabled": (disable_event, "the damon_aggregated event was disabled"),
    "filter-changed": (change_filter, "its filter changed to 'common_pid == 1'"),
    "tracing-off": (tracing_off, "tracing_on was set to 0"),
}


@pytest.mark.parametrize("tamper", list(TAMPERING))
def test_attach_says_when_its_tracefs_instance_is_changed_and_stops_cleanly(
        world, tmp_path, request, tamper):
    change, said = TAMPERING[tamper]
    target = start_target(world, hotcold(600))
    out = tmp_path / "out.json"
    a = start_agent(world, ["attach", "-q", "--json", str(out), str(target.pid)])
    a.wait_started()
    change(a.instance())
    _, err = a.finish()
    assert a.proc.returncode == 1, err
    assert said in err and "do not modify damon-hp-* instances" in err, err
    assert "monitoring was lost" in err and f"damon-hp attach {target.pid}" in err, err
    assert json.loads(out.read_text())["summary"]["stopped_by"] == "event stream lost"
    assert alive(target.pid), "the target must run on"
    assert "Traceback" not in err
    assert_nothing_left([a], world["run_dir"])
    passed(request)


def test_run_whose_event_is_disabled_lets_the_command_finish_unmanaged(world, request):
    a = start_agent(world, ["run", "-q", "--", "sh", "-c",
                            f"{HOTCOLD} --hot 64M --cold 64M --seconds 600 >/dev/null & "
                            "echo $!; wait $!; exit 5"])
    hotcold_pid = int(a.proc.stdout.readline())
    a.wait_started()
    inst = a.instance()
    disable_event(inst)
    # The instance goes as soon as the loss is seen, while the command runs on.
    wait_for("the agent to drop its instance", lambda: not inst.exists(), 60)
    assert alive(hotcold_pid) and a.proc.poll() is None
    os.kill(hotcold_pid, signal.SIGTERM)
    _, err = a.finish()
    assert a.proc.returncode == 5, err  # the command's own exit code
    assert "the damon_aggregated event was disabled" in err
    assert "runs on without huge-page management" in err
    assert "event stream lost" in err  # the summary's "stopped by"
    assert_nothing_left([a], world["run_dir"])
    passed(request)


def test_our_instance_cannot_be_removed_while_we_read_it_and_the_agent_runs_on(
        world, request):
    target = start_target(world, hotcold(600))
    a = start_agent(world, ["attach", "-q", str(target.pid)])
    a.wait_started()
    inst = a.instance()
    with pytest.raises(OSError) as e:
        os.rmdir(inst)
    assert e.value.errno == 16  # EBUSY: the kernel keeps an instance whose trace_pipe is open
    time.sleep(2)  # a health check of the agent's (every second without data) has passed
    assert a.proc.poll() is None and inst.exists()
    a.proc.send_signal(signal.SIGTERM)
    _, err = a.finish()
    assert a.proc.returncode == 0, err
    assert_nothing_left([a], world["run_dir"])
    passed(request)


def test_tracefs_unmounted_under_the_agent_neither_stops_it_nor_strands_its_instance(
        world, tmp_path, request):
    """The agent runs in a mount namespace of its own, where tracefs is then unmounted
    (lazily: the mount is busy with the agent's files); the host's mount is never touched. The
    instance lives on in the one tracefs superblock, visible wherever tracefs is mounted, so
    the agent must keep reading and still remove it at the end."""
    assert shutil.which("nsenter"), "nsenter missing: it comes with util-linux (Debian: essential)"
    target = start_target(world, hotcold(600))
    out = tmp_path / "out.json"
    a = start_agent(world, ["attach", "-q", "--json", str(out), str(target.pid)],
                    prefix=["unshare", "--mount", "--propagation", "private"])
    a.wait_started()
    inst = a.instance()
    ns = f"--mount=/proc/{a.pid}/ns/mnt"
    subprocess.run(["nsenter", ns, "umount", "-l", "/sys/kernel/tracing"], check=True,
                   timeout=30)
    gone = subprocess.run(["nsenter", ns, "findmnt", "/sys/kernel/tracing"],
                          capture_output=True, timeout=30)
    assert gone.returncode != 0, "tracefs is still mounted in the agent's namespace"
    seen = (a.record() or {}).get("snapshots", 0)
    # Snapshots keep coming (one per aggregation of the foreign kdamond, 5 s here).
    wait_for("a snapshot after the unmount",
             lambda: (a.record() or {}).get("snapshots", 0) > seen, START_S)
    assert a.proc.poll() is None and inst.exists()
    a.proc.send_signal(signal.SIGTERM)
    _, err = a.finish()
    assert a.proc.returncode == 0, err
    assert "Traceback" not in err
    assert json.loads(out.read_text())["summary"]["stopped_by"] != "event stream lost"
    assert not inst.exists(), "the instance was stranded in the tracefs superblock"
    assert_nothing_left([a], world["run_dir"])
    passed(request)


# --------------------------------------------------------------------------------------------
# output that cannot be written


@pytest.mark.parametrize("option", ["--json", "--record"])
def test_output_to_dev_full_is_reported_and_the_run_still_cleans_up(world, request, option):
    before = os.stat("/dev/full")
    a = start_agent(world, ["run", "-q", option, "/dev/full", "--", "sleep", "3"])
    _, err = a.finish()
    assert a.proc.returncode == 1, err  # the command exited 0, its report was lost
    assert f"cannot write the {option}" in err and "No space left on device" in err, err
    assert "damon-hp summary" in err  # the summary on stderr is still there
    after = os.stat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev, "/dev/full replaced"
    assert not list(Path("/dev").glob(".full.tmp*"))
    assert_nothing_left([a], world["run_dir"])
    passed(request)


def test_json_on_a_full_disk_leaves_no_partial_file(world, tmp_path, request):
    assert shutil.which("unshare"), "unshare missing: it comes with util-linux (Debian: essential)"
    # A 64 KiB tmpfs, filled, in a private mount namespace (nobody else sees it).
    disk = tmp_path / "disk"
    disk.mkdir()
    world["run_dir"].mkdir()
    script = (f"mount -t tmpfs -o size=64k tmpfs {disk} && "
              f"(dd if=/dev/zero of={disk}/fill bs=4k 2>/dev/null || true) && "
              f"{DAMON_HP} run -q --json {disk}/out.json -- sleep 3; echo rc=$?; ls -A {disk}")
    env = {**os.environ, "DAMON_HP_RUN_DIR": str(world["run_dir"])}
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=180, env=env)
    lines = p.stdout.split()
    assert "rc=1" in lines, p.stdout + p.stderr
    assert lines[lines.index("rc=1") + 1:] == ["fill"], f"left on the disk: {lines}"
    assert "cannot write the --json report" in p.stderr and "No space left" in p.stderr
    assert "Traceback" not in p.stderr
    assert list(world["run_dir"].iterdir()) == []
    passed(request)


# --------------------------------------------------------------------------------------------
# a second agent on a process already managed


def test_a_second_agent_on_a_managed_process_is_refused_and_the_first_runs_on(world, request):
    target = start_target(world, hotcold(600))
    first = start_agent(world, ["attach", "-q", str(target.pid)])
    first.wait_started()
    rec = first.record()
    second = start_agent(world, ["attach", "-q", str(target.pid)])
    _, err = second.finish()
    assert second.proc.returncode == 2, err
    assert (f"process {target.pid} is already managed by damon-hp agent pid {first.pid}"
            in err), err
    assert f"kill {first.pid}" in err and "Traceback" not in err
    assert instances_of(second.pid) == []
    assert first.proc.poll() is None and first.record()["agent_pid"] == rec["agent_pid"]
    first.proc.send_signal(signal.SIGINT)
    _, err = first.finish()
    assert first.proc.returncode == 0, err
    assert_nothing_left([first, second], world["run_dir"])
    passed(request)


# --------------------------------------------------------------------------------------------
# root without the capabilities the agent uses


@pytest.mark.parametrize("cap", ["cap_sys_admin", "cap_sys_nice"])
@pytest.mark.parametrize("mode", ["run", "attach"])
def test_root_without_a_needed_capability_is_refused_by_name(world, request, cap, mode):
    # capsh comes with libcap2-bin, which `make setup` installs: missing, the test fails
    # rather than skips (a skipped reliability case would read as a passed one).
    assert shutil.which("capsh"), "capsh missing: run `make setup` (Debian package libcap2-bin)"
    target = start_target(world, ["sleep", "600"])
    args = ["run", "--", "sleep", "600"] if mode == "run" else ["attach", str(target.pid)]
    a = start_agent(world, args, prefix=["capsh", f"--drop={cap}", "--", "-c",
                                         'exec "$0" "$@"'])
    _, err = a.finish()
    assert a.proc.returncode == 2, err
    assert f"lacks {cap.upper()}" in err and "full capabilities" in err, err
    assert "Traceback" not in err
    assert alive(target.pid)
    assert_nothing_left([a], world["run_dir"])
    passed(request)
