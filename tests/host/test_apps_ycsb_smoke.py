"""The YCSB half of the app experiment end to end on tiny data sets: Redis with 20,000 YCSB
records (loaded once by `go-ycsb load` into a seed snapshot every run starts from) and MariaDB
with 5,000 in its own table (loaded once into a seed data directory every run copies), each
under thp-never, everywhere and damon-hp attach, driven by go-ycsb workloads C and A with
zipfian requests, each test stopped by SIGTERM after 2 s. It checks behaviour, never speed: every
run completes, the workloads are the mixes they say (C only reads, A about half updates), the
arms did what they say (THP off for thp-never's server only, huge pages after everywhere's
collapse, none in thp-never's), damon-hp's own snapshots were recorded and read for the skew,
the report has the YCSB target rows and the skew table, and nothing is left behind: no server,
client (go-ycsb) or agent process, no data or socket directory, no tracefs instance of our
agents, THP settings unchanged. About a minute here."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from damon_hp.damon.model import Recording
from damon_hp.experiment.apps import ycsb
from leftovers import instances_of, processes_mentioning

DAMON_HP = str(Path(sys.executable).parent / "damon-hp")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

SMOKE = """
[experiment]
name = "apps-ycsb-smoke"
where = "host"
repetitions = 1
arms = ["thp-never", "everywhere", "damon-hp"]
sample_interval_s = 0.25
timeout_s = 300

[[workloads]]
app = "redis-ycsb"
threads = [4]
[workloads.params]
records = 20000
seconds = 2
warmup_seconds = 1
settle_s = 1

[[workloads]]
app = "mariadb-ycsb"
threads = [2]
[workloads.params]
records = 5000
buffer_pool = "128M"
seconds = 2
warmup_seconds = 1
settle_s = 1
"""


def _default_sigint() -> None:
    # A suite started in the background of a non-interactive shell inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _leftovers(marker: str) -> list[str]:
    return [f"{pid} {cmd[:200]}" for pid, cmd in processes_mentioning(marker).items()]


def test_tiny_ycsb_on_redis_and_mariadb_runs_every_arm_reports_the_skew_and_leaves_nothing(
        tmp_path):
    thp_before = THP.read_text()
    exp = tmp_path / "apps-ycsb-smoke.toml"
    exp.write_text(SMOKE)
    out = tmp_path / "out"
    proc = subprocess.run([DAMON_HP, "experiment", "run", str(exp), "--out", str(out)],
                          capture_output=True, text=True, timeout=900, check=False,
                          preexec_fn=_default_sigint)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr

    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 6
    by = {(r["workload"], r["arm"]): r for r in runs}
    for (workload, arm), r in by.items():
        assert r["status"] == "ok", (workload, arm, r["notes"])
        assert [p["test"] for p in r["phases"]] == ["ycsb-c", "ycsb-a"]
        c, a = r["phases"]
        for p in (c, a):
            assert p["requests"] > 0 and p["throughput"] > 0
            assert p["p50_ms"] is not None and p["p99_ms"] is not None
            assert p["server_cpu_s"] is not None and p["cpu_us_per_request"] is not None
            assert "steal_frac" in p and p["rss_bytes"] > 0
            # go-ycsb's run was a measurement: at most 1 % of its operations failed
            assert p["errors"] <= 0.01 * p["requests"]
        # workload C only reads; workload A updates about half of the time
        assert c["ops_read"] == c["requests"] and "ops_update" not in c
        assert 0.35 < a["ops_update"] / a["requests"] < 0.65, a
        assert r["samples"], "the server's memory was never sampled"
        assert r["app"]["thp_enabled"] is (arm != "thp-never"), (workload, arm)
        if arm == "everywhere":
            assert all(p["anon_huge_bytes"] > 0 for p in r["phases"]), workload
        if arm == "thp-never":
            assert all(p["anon_huge_bytes"] == 0 for p in r["phases"]), workload
    for workload in ("redis-ycsb", "mariadb-ycsb"):
        assert by[(workload, "everywhere")]["app"]["collapse"]["ok"] > 0
        # the data set was made once per experiment and reused by every run
        assert sum("seed_s" in by[(workload, arm)]["app"]
                   for arm in ("thp-never", "everywhere", "damon-hp")) == 1, workload
        damon = by[(workload, "damon-hp")]
        assert damon["app"]["agent_exit"] == 0
        # the agent's own snapshots were recorded and read per test for the skew
        Recording.load(out / "runs" / damon["cell_id"] / "agent-record.json")
        assert set(damon["app"]["skew"]) == {"ycsb-c", "ycsb-a"}, damon["app"]["skew"]
    # Redis: every read found its record but for go-ycsb's one key past the loaded ones (its
    # scrambled zipfian range is inclusive of recordcount), whose GETs are its READ errors
    get = by[("redis-ycsb", "thp-never")]["phases"][0]
    assert get["keyspace_hits"] >= get["ops_read"]
    # MariaDB: go-ycsb counts a read of a missing row as a success; the rows the server read show
    # that every read found its row (the runner's own queries add a few)
    for arm in ("thp-never", "everywhere", "damon-hp"):
        read = by[("mariadb-ycsb", arm)]["phases"][0]
        assert read["rows_read"] >= 0.99 * read["ops_read"], (arm, read)

    report = (out / "report.md").read_text()
    for row in ("redis-ycsb: ycsb-c: damon-hp keeps >= 80 % of everywhere's gain in server CPU",
                "redis-ycsb: ycsb-a: damon-hp throughput no worse than thp-never beyond noise",
                "mariadb-ycsb: RSS within 2 % of thp-never's",
                "mariadb-ycsb: RSS at least 400 MiB below everywhere's",
                "How skewed the traffic was at huge-page granularity"):
        assert row in report, row

    # nothing left behind
    assert _leftovers(str(tmp_path)) == []
    assert _leftovers(str(ycsb.binary())) == []
    assert not list(out.glob("runs/*/data")), "a server's data directory is left"
    assert not (out / "apps-data").exists(), "a seed directory is left"
    for arm in ("thp-never", "everywhere", "damon-hp"):
        assert not Path(by[("mariadb-ycsb", arm)]["app"]["socket_dir"]).exists()
    for workload in ("redis-ycsb", "mariadb-ycsb"):
        agent = by[(workload, "damon-hp")]["app"]["agent_pid"]
        assert instances_of(agent) == [], f"tracefs instance of agent {agent} left"
    assert THP.read_text() == thp_before


def test_sigterm_while_go_ycsb_drives_the_server_leaves_nothing(tmp_path):
    """SIGTERM to the experiment while a go-ycsb client runs a test against a Redis server that
    damon-hp attach watches: exit 130, no client, server or agent left, no data directory, no
    tracefs instance."""
    from leftovers import wait_for

    exp = tmp_path / "apps-ycsb-term.toml"
    text = SMOKE.replace('app = "redis-ycsb"', 'app = "redis-ycsb"\narms = ["damon-hp"]')
    exp.write_text(text[:text.index('[[workloads]]\napp = "mariadb-ycsb"')]
                   .replace("seconds = 2\n", "seconds = 120\n"))
    out = tmp_path / "out"
    proc = subprocess.Popen([DAMON_HP, "experiment", "run", str(exp), "--out", str(out),
                             "--no-report"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_sigint)
    agents: list[int] = []

    def client_runs() -> bool:
        procs = processes_mentioning(str(tmp_path))
        agents[:] = [pid for pid, cmd in procs.items() if "damon-hp attach" in cmd]
        return bool(agents) and any("client-ycsb-c.json" in cmd for cmd in procs.values())

    try:
        wait_for("go-ycsb running workload C", client_runs, 240, 0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            # a SIGKILL would leave the runner's server, client and agent (each in a session
            # of its own) behind: ask first
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    assert _leftovers(str(tmp_path)) == []
    assert not list(out.glob("runs/*/data"))
    assert not (out / "apps-data").exists()
    assert instances_of(agents[0]) == []
