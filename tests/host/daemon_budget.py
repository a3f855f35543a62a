"""damon-hpd natively on this host through the passive source: three hotcold processes under
two rules and one budget smaller than their hot sets together, one more hotcold excluded.

One run (about 50 s, at most 100 s; the passive source needs 20-40 s of 5 s aggregations to see
a hot set) checks: the budget holds at every look; in every budget round the admitted ranges
are the most beneficial ones (the largest hot set has the largest benefit per range); a process
started after the daemon is picked up within a scan; the excluded process is never collapsed;
`status --json` lists each managed process; a reload with a bad config is refused with its
line while the old config keeps running; SIGTERM leaves no tracefs instance, no status
record, no kdamond.
The copies of hotcold under unique paths keep the rules off other engineers' processes.

Opt-in host check, not part of `make test` (run it by path:
.venv/bin/pytest tests/host/daemon_budget.py).

Why opt-in: whether a round contests the budget and how much of it gets used depend on how fast
the passive source shows each process's hot set. On 2026-11-23, in a loaded fresh-clone run and
a rerun, it failed once on the budget use (48 of 96 MiB) and once on "no contested round".
Making it independent of that timing is open work (#13).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOTCOLD = ROOT / "workloads/bin/hotcold"
INSTANCES = Path("/sys/kernel/tracing/instances")
KDAMONDS = Path("/sys/kernel/mm/damon/admin/kdamonds")
MIB = 1 << 20
BUDGET = 96 * MIB  # hot sets: 128 + 64 + 64 MiB


def running_kdamonds() -> set[str]:
    return {(d / "pid").read_text().strip() for d in KDAMONDS.iterdir()
            if d.name.isdigit() and (d / "state").read_text().strip() == "on"}


def anon_huge(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def config(tmp: Path, budget: str) -> str:
    return f"""\
[daemon]
source = "passive"
budget = "{budget}"
scan_every_s = 2
summary_every_s = 10

[[rule]]
name = "big"
exe = "{tmp}/hc-big"

[[rule]]
name = "small"
cmdline = "^{tmp}/hc-(small|excl)"

[[rule]]
name = "latency"
exclude = true
exe = "{tmp}/hc-excl"
"""


def test_daemon_shares_one_budget_by_benefit_and_leaves_nothing_behind(tmp_path) -> None:
    for name in ("hc-big", "hc-small", "hc-excl"):
        shutil.copy(HOTCOLD, tmp_path / name)
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(config(tmp_path, "96M"))
    out = tmp_path / "daemon.json"
    err_path = tmp_path / "daemon.err"
    env = {**os.environ, "DAMON_HP_RUN_DIR": str(tmp_path / "run")}
    kdamonds_before = running_kdamonds()
    procs: dict[str, subprocess.Popen] = {}

    def start(key: str, exe: str, hot: str, cold: str, threads: int = 1) -> None:
        procs[key] = subprocess.Popen(
            [str(tmp_path / exe), "--hot", hot, "--cold", cold, "--threads", str(threads),
             "--seconds", "110"], stdout=subprocess.DEVNULL)

    def stderr() -> str:
        return err_path.read_text()

    daemon = None
    try:
        start("big", "hc-big", "128M", "128M", threads=2)
        start("small1", "hc-small", "64M", "128M")
        start("excl", "hc-excl", "64M", "64M")
        with open(err_path, "w") as err:
            daemon = subprocess.Popen([str(BIN / "damon-hpd"), "--config", str(cfg),
                                       "--json", str(out)], stderr=err, env=env)
        t0 = time.monotonic()
        time.sleep(6)
        start("small2", "hc-small", "64M", "128M")
        t_small2 = time.monotonic()
        while f"managing pid {procs['small2'].pid}" not in stderr():
            assert time.monotonic() - t_small2 < 10, "a new process was not picked up in 10 s"
            time.sleep(0.5)
        reloaded = False
        worst_total = 0
        while time.monotonic() - t0 < 95:
            time.sleep(2)
            assert daemon.poll() is None, stderr()
            assert anon_huge(procs["excl"].pid) == 0, "the excluded process was collapsed"
            managed = [procs[k].pid for k in ("big", "small1", "small2")]
            total = sum(anon_huge(p) for p in managed)
            worst_total = max(worst_total, total)
            assert total <= BUDGET, f"{total / MIB} MiB huge over a budget of 96 MiB"
            if not reloaded and time.monotonic() - t0 > 40:
                cfg.write_text(config(tmp_path, "96M") + "\n[[rule]]\nexe = \"x\"\n"
                               "cmdline = \"([\"\n")
                daemon.send_signal(signal.SIGHUP)
                reloaded = True
            if (reloaded and "reload refused" in stderr() and total >= 0.9 * BUDGET
                    and f"managing pid {procs['small2'].pid}" in stderr()):
                break
        log = stderr()
        assert f"managing pid {procs['small2'].pid}" in log
        assert f"managing pid {procs['excl'].pid}" not in log
        assert "reload refused, still running the old config" in log
        assert f"{cfg}:22:" in log and "not a regular expression" in log, log

        st = subprocess.run([str(BIN / "damon-hp"), "status", "--json"], capture_output=True,
                            text=True, env=env, timeout=30)
        records = json.loads(st.stdout)["agents"]
        by_target = {r["target_pid"]: r for r in records}
        assert set(by_target) == {procs[k].pid for k in ("big", "small1", "small2")}
        assert all(r["mode"].startswith("daemon") and r["agent_pid"] == daemon.pid
                   for r in records)

        final = {k: anon_huge(procs[k].pid) for k in ("big", "small1", "small2")}
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, stderr()
        report = json.loads(out.read_text())
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        for p in procs.values():
            p.kill()
            p.wait()

    # the budget was used, and held
    assert 0.75 * BUDGET <= worst_total <= BUDGET, worst_total
    assert report["budget_bytes"] == BUDGET
    # the ranges that won were the most beneficial of their round
    contested = 0
    for rnd in report["rounds"]:
        won = [c["benefit"] for c in rnd["candidates"] if c["admitted"]]
        lost = [c["benefit"] for c in rnd["candidates"] if not c["admitted"]]
        if won and lost:
            contested += 1
            assert min(won) >= max(lost), rnd
    assert contested >= 1, "no round had more candidates than the budget left room for"
    # Who ends up with the most depends on when the passive source shows each hot set (a few
    # ranges per aggregation) and no huge page is taken back: seen big 66/44/45 MiB against
    # small 44-50/40 MiB. A figure, not asserted.
    # nothing left behind: no tracefs instance, no status record, no kdamond of ours
    assert not [n for n in os.listdir(INSTANCES)
                if n.startswith(f"damon-hp-{daemon.pid}-")]
    assert not list((tmp_path / "run").glob("agent-*"))
    assert running_kdamonds() == kdamonds_before
    print(f"contested rounds {contested}; final huge {final}; log:\n{log}")
