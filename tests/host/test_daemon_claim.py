"""damon-hpd and `damon-hp attach` share one claim on each process (status_records: check and
write under the run directory's lock), on this host (passive source).

- A process the daemon manages: attach is refused (exit 2) naming the daemon, its rule and
  how to free the process; it leaves no tracefs instance and no record; the daemon runs on.
- A process attach manages first: the daemon leaves it alone (its rules select it) and says
  so once; when the attach agent stops, the daemon takes it within a few scans.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from daemon_host import (
    BIN,
    ROOT,
    Daemon,
    Workloads,
    status,
)
from leftovers import instances_of, wait_for

pytestmark = pytest.mark.usefixtures("foreign_kdamond")  # never a skip: conftest.py

START_S = 60.0
TAKE_OVER_S = 20.0  # "a few scans" (scan_every_s = 1) with room for a loaded host


def config(folder) -> str:
    return f"""\
[daemon]
source = "passive"
budget = "16M"
scan_every_s = 1

[[rule]]
name = "shared"
exe = "{folder}/hc-claim"
"""


def attach(pid: int, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "damon-hp"), "attach", "-q", str(pid)], cwd=ROOT,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def attached(agent: subprocess.Popen, target: int, env: dict[str, str]) -> bool:
    assert agent.poll() is None, f"attach exited early: {agent.communicate()[1]}"
    return any(r["agent_pid"] == agent.pid and r.get("target_pid") == target and r.get("source")
               for r in status(env)) and bool(instances_of(agent.pid))


def test_daemon_and_attach_never_manage_one_process_together(tmp_path) -> None:
    work = Workloads(tmp_path, ["hc-claim"])
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(config(tmp_path))
    run = tmp_path / "run"
    env = {**os.environ, "DAMON_HP_RUN_DIR": str(run)}
    daemon = first = second = None
    try:
        by_daemon = work.start("d", "hc-claim", "16M", "16M")
        by_attach = work.start("a", "hc-claim", "16M", "16M")
        first = attach(by_attach, env)
        wait_for("attach to start monitoring", lambda: attached(first, by_attach, env), START_S)

        daemon = Daemon(cfg, run, tmp_path / "daemon.err")
        daemon.wait_managing({by_daemon})
        wait_for("the daemon to say it leaves the attached process alone",
                 lambda: f"not managing pid {by_attach}" in daemon.log(), 30)
        assert by_attach not in daemon.managed()

        second = attach(by_daemon, env)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert (f"process {by_daemon} is already managed by damon-hpd pid {daemon.pid} "
                "(rule shared") in err, err
        assert f"kill -HUP {daemon.pid}" in err and "Traceback" not in err, err
        assert instances_of(second.pid) == []
        assert not (run / f"agent-{second.pid}.json").exists()
        assert daemon.managed() == {by_daemon}

        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
        took_s = daemon.wait_managing({by_daemon, by_attach}, TAKE_OVER_S)
        assert daemon.terminate() == 0, daemon.log()
        log = daemon.log()
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if daemon is not None:
            daemon.kill()
        work.stop_all()

    assert log.count(f"not managing pid {by_attach}") == 1, log  # said once, not every scan
    assert f"damon-hp agent pid {first.pid} (attach" in log, log
    assert instances_of(daemon.pid) == [] and instances_of(first.pid) == []
    assert status(env) == []
    assert "Traceback" not in log
    print(f"taken over {took_s:.1f} s after attach stopped; log:\n{log}")
