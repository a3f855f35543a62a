"""damon-hpd SIGKILLed mid-run and started again, on this host (passive source).

A SIGKILLed daemon cleans nothing: its tracefs instance and its status records (one per
managed process) stay, and so do the huge pages it made. The next daemon must remove both
leftovers before it manages the processes again, and must count those huge pages against the
budget from its first round. Which pages the dead daemon made depends on when the passive
source showed it the hot set, so the test tops them up itself after the kill (MADV_COLLAPSE of a
budget's worth of one process's hot region): the second daemon then starts with its budget
full (smaps says so), and must admit nothing when it sees the hot sets. The test waits (polling
the daemon's --json, rewritten after every round with candidates) until the second daemon has
had rounds with candidates: without them "admits nothing" would hold by default.
"""

from __future__ import annotations

import json
import signal

import pytest
from collapse_errors import until_settled
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
# Until the second daemon has had this many rounds with candidates: the passive rule needs 3
# hot snapshots over 2 of the foreign kdamond's 5 s aggregations, tens of seconds more on a
# loaded host; a faster rule only shortens the wait.
ROUNDS = 2
ROUNDS_DEADLINE_S = 180

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
        results = until_settled(lambda s: actuate.collapse(target, s), starts)
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
        # mid-run: the first daemon has taken snapshots of both (its status records say so)
        wait_for("the first daemon's first snapshots", lambda: all(
            r["snapshots"] >= 1 for r in status(first.env) if r["agent_pid"] == first.pid),
            60, every_s=1)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        left_instances = instances_of(first.pid)
        left_records = first.records()
        assert left_instances and len(left_records) == 2  # the leftovers this test is about
        assert all(not r["alive"] for r in status(first.env) if r["agent_pid"] == first.pid)
        collapse_budget_worth(a, hot_a)  # on top of whatever the first daemon made
        huge_before = anon_huge(a) + anon_huge(b)
        assert huge_before >= BUDGET, f"{huge_before / MIB:.0f} MiB huge (smaps)"

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

        def rounds() -> list[dict]:
            try:
                return json.loads((tmp_path / "second.json").read_text())["rounds"]
            except (OSError, ValueError):  # not written yet
                return []

        took = wait_for(f"{ROUNDS} rounds with candidates of the second daemon",
                        lambda: len(rounds()) >= ROUNDS, ROUNDS_DEADLINE_S, every_s=1)
        huge_after = anon_huge(a) + anon_huge(b)
        assert second.terminate() == 0, second.log()
        log = second.log()
        report = json.loads((tmp_path / "second.json").read_text())
    finally:
        for d in (first, second):
            if d is not None:
                d.kill()
        work.stop_all()

    assert len(report["rounds"]) >= ROUNDS
    assert huge_after == huge_before  # a full budget admits nothing (smaps)
    for rnd in report["rounds"]:
        assert rnd["candidates"], rnd
        assert rnd["held_bytes_before"] >= huge_before, rnd  # counted from the first round
        assert not any(c["admitted"] for c in rnd["candidates"]), rnd
    assert instances_of(second.pid) == []
    assert not list(run.glob("agent-*"))
    assert running_kdamonds() == kdamonds_before
    assert "Traceback" not in log
    print(f"{ROUNDS} rounds with candidates after {took:.0f} s; "
          f"left by SIGKILL: {left_instances}, {[p.name for p in left_records]}; huge "
          f"{huge_before / MIB:.0f} MiB at the restart, {huge_after / MIB:.0f} MiB at the "
          f"end; log:\n{log}")
