"""The CLI's refusals on this host: each is exit 2 with a message naming what is wrong.

This host's DAMON has only paddr and runs a kdamond damon-hp did not start, so `run` and
`attach` must refuse without writing to DAMON sysfs, and say where a real DAMON is (the VM).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from leftovers import kdamond_states

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = [sys.executable, "-m", "damon_hp.cli"]
ADMIN = Path("/sys/kernel/mm/damon/admin")


def damon_hp(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DAMON_HP, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)




def test_attach_to_a_pid_that_never_existed_exits_2_naming_the_pid() -> None:
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # can never exist
    r = damon_hp("attach", str(pid))
    assert r.returncode == 2
    assert f"no process {pid}" in r.stderr
    assert "Traceback" not in r.stderr


def test_attach_to_an_exited_pid_exits_2() -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    r = damon_hp("attach", str(p.pid))
    assert r.returncode == 2
    assert f"no process {p.pid}" in r.stderr


@pytest.mark.parametrize("bad", ["abc", "0", "-5", "1.5"])
def test_attach_with_a_malformed_pid_exits_2(bad: str) -> None:
    r = damon_hp("attach", "--", bad)
    assert r.returncode == 2
    assert "is not a process id" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--bogus", "--", "true"], "unrecognized arguments: --bogus"),
        (["run", "--max-huge", "150%", "--", "true"], "percentage of RSS must be 0..100%"),
        (["run", "--max-huge", "lots", "--", "true"], "is not a size"),
        (["run", "--promote-after", "0", "--", "true"], "is not a positive integer"),
        (["run", "--min-regions", "2", "--", "true"], "--min-regions"),
        (["run", "--sample-us", "500000", "--aggr-us", "400000", "--", "true"], "sample_us"),
        (["attach", "--demote-after", "-3", "1"], "not a non-negative number"),
        (["run"], "no command given"),
        (["run", "--", "/nonexistent/program"], "command not found"),
        (["run", "--source", "bogus", "--", "true"], "is not a source"),
        (["run", "--source", "vaddr=7", "--", "true"], "only passive takes a kdamond pid"),
        (["run", "--source", "passive=x", "--", "true"], "is not a kdamond pid"),
        (["run", "--source", "passive=999999", "--", "true"], "no running kdamond has pid"),
    ],
)
def test_bad_flags_and_commands_exit_2_with_a_message(args: list[str], message: str) -> None:
    r = damon_hp(*args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.usefixtures("foreign_kdamond")  # DAMON busy with a kdamond not ours
def test_run_with_a_source_this_hosts_damon_cannot_give_exits_2_and_points_to_the_vm() -> None:
    before = kdamond_states()
    for source in ("vaddr", "paddr"):
        r = damon_hp("run", "--source", source, "--", "true")
        assert r.returncode == 2, r.stderr
        assert "busy" in r.stderr or "operations set" in r.stderr
        assert f"make vm-run CMD='.venv/bin/damon-hp run --source {source} -- true'" in r.stderr
    assert kdamond_states() == before  # the foreign kdamond runs on, untouched


@pytest.mark.usefixtures("foreign_kdamond")  # DAMON busy with a kdamond not ours
def test_attach_on_this_hosts_damon_exits_2_and_leaves_the_target_running() -> None:
    before = kdamond_states()
    target = subprocess.Popen(["sleep", "3600"])  # killed below
    try:
        r = damon_hp("attach", "--source", "vaddr", str(target.pid))
        assert r.returncode == 2
        assert "make vm-run" in r.stderr
        time.sleep(0.1)
        assert target.poll() is None
    finally:
        target.kill()
        target.wait()
    assert kdamond_states() == before


def test_run_leaves_no_held_child_behind_when_it_refuses() -> None:
    # Whatever the reason for refusing, no forked child may survive the agent.
    r = subprocess.run([*DAMON_HP, "run", "--source", "vaddr", "--", "sleep", "1234.5"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2
    ps = subprocess.run(["pgrep", "-f", "sleep 1234.5"], capture_output=True, text=True)
    assert ps.stdout.strip() == ""


def test_status_with_no_agents_says_so_and_exits_0(tmp_path) -> None:
    r = subprocess.run([*DAMON_HP, "status"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT, env={"DAMON_HP_RUN_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0
    assert "no damon-hp agents are running" in r.stdout
