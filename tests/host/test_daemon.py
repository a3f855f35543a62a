"""damon-hpd natively on this host through the passive source: three hotcold processes under
two rules and one budget (96 MiB) smaller than their hot sets together (256 MiB), one more
hotcold excluded by a third rule.

Only what does not hang on when the passive source shows a hot set is asserted (the foreign
kdamond's 5 s aggregations decide that, and a loaded host delays it by tens of seconds):
- at every look (twice a second) the managed processes' huge pages together stay within the
  budget, and the excluded process has none;
- in the daemon's own per-round admission records (--json), every round stays within the
  budget, and whenever a round had more candidates than room, each admitted range had a
  benefit >= every refused one (the ranking itself is tested on recorded snapshots in
  tests/unit/test_daemon_rounds.py);
- a reload with a bad config is refused with its line, and the old config keeps running: a
  process started after it is picked up by the old rules within a few scans;
- `status --json` lists exactly the managed processes, never the excluded one;
- SIGTERM: exit 0, no tracefs instance, no status record, the kdamonds and THP settings as
  they were.
How much of the budget gets used, and by whom, is printed, not asserted.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from daemon_host import (
    MIB,
    BudgetWatcher,
    Daemon,
    Workloads,
    running_kdamonds,
)
from leftovers import instances_of, wait_for
from thp_settings import thp_settings

BUDGET = 96 * MIB
HUGE = 2 * MIB
SCAN_S = 2
PICKUP_S = 20  # "a few scans" with room for a loaded host
RUN_S = 45  # from the daemon's start to SIGTERM: rounds to check, well under 90 s in all

pytestmark = pytest.mark.usefixtures("foreign_kdamond")  # never a skip: conftest.py


def config(folder: Path) -> str:
    return f"""\
[daemon]
source = "passive"
budget = "96M"
scan_every_s = {SCAN_S}
summary_every_s = 10

[[rule]]
name = "big"
exe = "{folder}/hc-big"

[[rule]]
name = "small"
cmdline = "^{folder}/hc-(small|excl)"

[[rule]]
name = "latency"
exclude = true
exe = "{folder}/hc-excl"
"""


BAD_LINE = 22  # the line of the broken rule appended below
BAD_RULE = '\n[[rule]]\nexe = "x"\ncmdline = "(["\n'


def test_daemon_keeps_its_budget_and_rules_and_leaves_nothing_behind(tmp_path) -> None:
    work = Workloads(tmp_path, ["hc-big", "hc-small", "hc-excl"])
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(config(tmp_path))
    out = tmp_path / "daemon.json"
    kdamonds_before, thp_before = running_kdamonds(), thp_settings()
    daemon = watcher = None
    try:
        big = work.start("big", "hc-big", "128M", "128M", threads=2)
        small1 = work.start("small1", "hc-small", "64M", "128M")
        excl = work.start("excl", "hc-excl", "64M", "64M")
        t0 = time.monotonic()
        daemon = Daemon(cfg, tmp_path / "run", tmp_path / "daemon.err", out)
        # small2's pid is not known yet: the watcher's list is completed when it starts
        watcher = BudgetWatcher([big, small1], excl, BUDGET)
        watcher.start()
        daemon.wait_managing({big, small1})

        cfg.write_text(config(tmp_path) + BAD_RULE)
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for("the bad reload to be refused", lambda: "reload refused" in daemon.log(), 30)
        log = daemon.log()
        assert f"{cfg}:{BAD_LINE}:" in log and "not a regular expression" in log, log

        small2 = work.start("small2", "hc-small", "64M", "128M")
        watcher.managed.append(small2)
        pickup_s = daemon.wait_managing({big, small1, small2}, PICKUP_S)
        assert daemon.managed() == {big, small1, small2}  # never the excluded one

        time.sleep(max(0.0, RUN_S - (time.monotonic() - t0)))
        daemon.running()
        watcher.halt.set()
        watcher.join()
        assert daemon.terminate() == 0, daemon.log()
        report = json.loads(out.read_text())
        log = daemon.log()
    finally:
        if watcher is not None:
            watcher.halt.set()
        if daemon is not None:
            daemon.kill()
        work.stop_all()

    assert watcher.looks >= RUN_S // 2, f"only {watcher.looks} looks in {RUN_S} s"
    assert not watcher.broken, watcher.broken[:5]
    assert f"managing pid {excl}" not in log

    assert report["budget_bytes"] == BUDGET
    contested = 0
    for rnd in report["rounds"]:
        assert all(c["pid"] != excl for c in rnd["candidates"]), rnd
        won = [c["benefit"] for c in rnd["candidates"] if c["admitted"]]
        lost = [c["benefit"] for c in rnd["candidates"] if not c["admitted"]]
        assert rnd["held_bytes_before"] + len(won) * HUGE <= BUDGET, rnd
        if won and lost:
            contested += 1
            assert min(won) >= max(lost), rnd

    assert instances_of(daemon.pid) == []
    assert not list((tmp_path / "run").glob("agent-*"))
    assert running_kdamonds() == kdamonds_before
    assert thp_settings() == thp_before
    print(f"picked up after {pickup_s:.1f} s; {len(report['rounds'])} rounds with candidates, "
          f"{contested} contested; most huge at once {watcher.most / MIB:.0f} MiB of 96; "
          f"log:\n{log}")
