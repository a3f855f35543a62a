"""damon-hpd SIGKILLed mid-run and started again, on this host (passive source).

A SIGKILLed daemon cleans nothing: its tracefs instance and its status records (one per
managed process) stay, and so do the huge pages it made. The next daemon must remove both
leftovers before it manages the processes again, and must count those huge pages against the
budget from its first round. Which pages the dead daemon made depends on when the passive
source showed it the hot set, so the test makes them itself after the kill (MADV_COLLAPSE of a
budget's worth of one process's hot region): the second daemon then starts with its budget
full, and must admit nothing whenever it sees the hot sets.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from daemon_host import (
    MIB,
    Daemon,
    Workloads,
    anon_huge,
    running_kdamonds,
    status,
)
from damon_hp import actuate
from leftovers import instances_of, wait_for

BUDGET = 32 * MIB
HUGE = 2 * MIB

pytestmark = pytest.mark.usefixtures("foreign_kdamond")  # never a skip: conftest.py


def config(folder) -> str:
    return f"""\
[daemon]
source = "passive"
budget = "32M"
scan_every_s = 1

[[rule]]
name = "hc"
exe = "{folder}/hc-restart"
"""


def collapse_budget_worth(pid: int, hot: tuple[int, int]) -> None:
    starts = range(hot[0], hot[0] + BUDGET, HUGE)
    with actuate.Target.open(pid) as target:
        results = actuate.collapse(target, starts)
    assert all(r.error is None for r in results), [r.to_dict() for r in results]


def test_a_daemon_killed_with_sigkill_is_cleaned_up_by_the_next_start(tmp_path) -> None:
    work = Workloads(tmp_path, ["hc-restart"])
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(config(tmp_path))
    run = tmp_path / "run"
    kdamonds_before = running_kdamonds()
    first = second = None
    try:
        a = work.start("a", "hc-restart", "64M", "32M")
        b = work.start("b", "hc-restart", "64M", "32M")
        hot_a = work.hot_range("a")
        work.hot_range("b")  # both have written their pages
        first = Daemon(cfg, run, tmp_path / "first.err")
        first.wait_managing({a, b})
        wait_for("the first daemon's tracefs instance", lambda: instances_of(first.pid), 30)
        time.sleep(2)  # mid-run: rounds going
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        left_instances = instances_of(first.pid)
        left_records = first.records()
        assert left_instances and len(left_records) == 2  # the leftovers this test is about
        assert all(not r["alive"] for r in status(first.env) if r["agent_pid"] == first.pid)
        if anon_huge(a) + anon_huge(b) == 0:
            collapse_budget_worth(a, hot_a)
        huge_before = anon_huge(a) + anon_huge(b)

        second = Daemon(cfg, run, tmp_path / "second.err", tmp_path / "second.json")
        second.wait_managing({a, b})
        assert instances_of(first.pid) == []
        assert not any(p.exists() for p in left_records)
        agents = status(second.env)
        assert {(r["agent_pid"], r["target_pid"]) for r in agents} == {(second.pid, a),
                                                                        (second.pid, b)}
        assert all(r["alive"] for r in agents)
        # counted from the start (the records are written before the first round)
        assert sum(r["anon_huge_bytes"] for r in agents) >= huge_before

        time.sleep(5)  # rounds of the second daemon
        huge_after = anon_huge(a) + anon_huge(b)
        assert second.terminate() == 0, second.log()
        log = second.log()
        report = json.loads((tmp_path / "second.json").read_text())
    finally:
        for d in (first, second):
            if d is not None:
                d.kill()
        work.stop_all()

    if huge_before >= BUDGET:
        assert huge_after == huge_before  # a full budget admits nothing
    assert huge_after <= max(BUDGET, huge_before)
    for rnd in report["rounds"]:
        admitted = sum(c["admitted"] for c in rnd["candidates"])
        assert rnd["held_bytes_before"] >= huge_before or admitted == 0, rnd
        assert rnd["held_bytes_before"] + admitted * HUGE <= max(BUDGET, huge_before), rnd
    assert instances_of(second.pid) == []
    assert not list(run.glob("agent-*"))
    assert running_kdamonds() == kdamonds_before
    assert "Traceback" not in log
    print(f"left by SIGKILL: {left_instances}, {[p.name for p in left_records]}; huge "
          f"{huge_before / MIB:.0f} MiB at the restart, {huge_after / MIB:.0f} MiB at the "
          f"end; log:\n{log}")
