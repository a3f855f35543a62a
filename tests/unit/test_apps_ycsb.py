"""The YCSB apps (experiment/apps/{ycsb,redis_ycsb,mariadb_ycsb,skew}.py): go-ycsb's totals
parsed (a recorded output in tests/fixtures/apps/), the workload mixes and the debug server kept
on loopback, their parameters checked, and the skew read from the agent's snapshots."""

from __future__ import annotations

from pathlib import Path

import pytest
from damon_hp.damon.model import Region, Snapshot
from damon_hp.experiment.apps import params_of, skew, ycsb
from damon_hp.experiment.apps import report as app_report
from damon_hp.experiment.results import RunResult

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "apps"
MIB2 = 2 << 20


def test_go_ycsb_totals_give_successful_operations_errors_and_latency_in_ms():
    t = ycsb.parse_totals((FIXTURES / "go-ycsb-c-redis.json").read_text())
    assert t.ops == {"READ": 330750} and t.errors == {"READ": 1}
    r = t.client_result()
    assert r.requests == 330750 and r.seconds == 9.9
    assert r.throughput == pytest.approx(330750 / 9.9)
    assert (r.p50_ms, r.p99_ms, r.p999_ms) == (0.278, 4.215, 11.311)
    assert r.extra == {"ops_read": 330750, "errors": 1}


def test_go_ycsb_totals_without_a_total_row_are_refused():
    with pytest.raises(Exception, match="no TOTAL row"):
        ycsb.parse_totals('[{"Operation": "READ", "Count": "3"}]')


def test_workloads_c_and_a_are_the_standard_mixes_with_the_distribution_asked_for():
    props = ycsb.core_properties(1000, 1, 256, "zipfian")
    argv = ycsb.argv("run", "redis", {**props, **ycsb.MIXES["ycsb-a"]}, 8)
    assert argv[1:5] == ["run", "redis", "--threads", "8"]
    assert "requestdistribution=zipfian" in argv and "readproportion=0.5" in argv
    assert "updateproportion=0.5" in argv and "insertproportion=0" in argv
    assert ycsb.MIXES["ycsb-c"] == {"readproportion": "1", "updateproportion": "0"}
    # its debug HTTP server would otherwise listen on :6060 of every interface
    assert "debug.pprof=127.0.0.1:0" in argv


@pytest.mark.parametrize("app,raw,message", [
    ("redis-ycsb", {"records": 0}, "records must be an integer >= 1"),
    ("redis-ycsb", {"tests": ["ycsb-b"]}, "tests must be a non-empty list of ycsb-c, ycsb-a"),
    ("redis-ycsb", {"distribution": "gauss"}, "distribution must be one of"),
    ("redis-ycsb", {"churn": True}, "churn is not available"),
    ("mariadb-ycsb", {"buffer_pool": "lots"}, "buffer_pool must be a size"),
    ("mariadb-ycsb", {"seconds": -1}, "seconds must be seconds >= 0"),
    ("mariadb-ycsb", {"keys": 5}, "unknown mariadb-ycsb parameters"),
])
def test_bad_ycsb_params_are_named(app, raw, message):
    with pytest.raises(ValueError, match=message):
        params_of(app, raw)


def _snap(t: float, levels: list[int], top: int = 10) -> Snapshot:
    regions = tuple(Region(i * MIB2, (i + 1) * MIB2, n, 1) for i, n in enumerate(levels))
    return Snapshot(t, 1, 500_000, 500_000 * top, regions)


def test_uniform_traffic_puts_a_tenth_of_the_accesses_on_the_hottest_tenth():
    snaps = [_snap(t, [5] * 50) for t in (1.0, 2.0)]
    got = skew.of_snapshots(snaps, 0, 10)
    assert got["hottest_10pct_share"] == pytest.approx(0.10)
    assert got == {**got, "snapshots": 2, "ranges": 50, "accessed_ranges": 50}


def test_a_few_hot_ranges_hold_most_accesses_and_a_window_selects_snapshots():
    hot = _snap(5.0, [10] * 5 + [1] * 45)
    outside = _snap(50.0, [10] * 50)
    got = skew.of_snapshots([hot, outside], 0, 10)
    assert got["snapshots"] == 1
    assert got["hottest_10pct_share"] == pytest.approx(50 / 95)


def test_a_large_region_spreads_its_frequency_over_its_2mib_ranges_by_bytes():
    # one 8 MiB region at 4 of 10 plus a half range at the end: 4 full ranges and a half one
    snap = Snapshot(1.0, 1, 500_000, 5_000_000, (Region(0, 4 * MIB2 + MIB2 // 2, 4, 3),))
    w = skew.range_weights([snap])
    assert w == {0: 0.4, MIB2: 0.4, 2 * MIB2: 0.4, 3 * MIB2: 0.4, 4 * MIB2: 0.2}


def test_no_access_seen_leaves_the_share_undefined():
    assert skew.of_snapshots([_snap(1.0, [0] * 4)], 0, 10)["hottest_10pct_share"] is None


def test_skew_of_a_run_reads_the_recording_per_test(tmp_path):
    from damon_hp.damon.model import Recording

    rec = tmp_path / "rec.json"
    Recording("k", "c", (_snap(101.0, [10] + [0] * 9), _snap(111.0, [1] * 10))).save(rec)
    got = skew.of_run(rec, 100.0, {"ycsb-c_start": 0.5, "ycsb-c_end": 5.0,
                                   "ycsb-a_start": 10.0, "ycsb-a_end": 12.0},
                      ["ycsb-c", "ycsb-a"])
    assert got["ycsb-c"]["hottest_10pct_share"] == 1.0
    assert got["ycsb-a"]["hottest_10pct_share"] == pytest.approx(0.1)
    assert "error" in skew.of_run(tmp_path / "none.json", 0, {}, ["ycsb-c"])


def _run(arm: str, rep: int, cpu: float, rss: int, share: float) -> RunResult:
    r = RunResult(cell_id=f"{arm}-{rep}", workload="redis-ycsb", program="redis-server",
                  input=None, threads=16, arm=arm, memory="sufficient", rep=rep)
    r.phases = [{"test": "ycsb-c", "throughput": 1e4, "p99_ms": 1.0, "cpu_us_per_request": cpu,
                 "requests": 100, "rss_bytes": rss, "anon_huge_bytes": rss // 4}]
    r.app = {"measured": {"rss_bytes": rss},
             "skew": {"ycsb-c": {"snapshots": 6, "ranges": 1200, "accessed_ranges": 900,
                                 "hottest_10pct_share": share}}}
    return r


def test_report_has_the_ycsb_targets_and_the_skew_beside_the_gain_kept():
    runs = []
    for rep in range(3):
        runs += [_run("thp-never", rep, 10.0, 1000 << 20, 0.0),
                 _run("everywhere", rep, 9.0, 1500 << 20, 0.0),
                 _run("damon-hp", rep, 9.2, 1010 << 20, 0.31)]
    rs = app_report.Runs(runs)
    rows = {t.what: t for t in app_report.targets("redis-ycsb", rs, ["ycsb-c"], False)}
    gain = rows["ycsb-c: damon-hp keeps >= 80 % of everywhere's gain in server CPU per request"]
    assert gain.met is True and "share kept 80%" in gain.numbers
    mdb = {t.what: t for t in app_report.targets("mariadb-ycsb", rs, ["ycsb-c"], False)}
    assert mdb["RSS at least 400 MiB below everywhere's (after the measured tests)"].met is True
    table = "\n".join(app_report.skew_table(rs, ["ycsb-c"]))
    assert "| ycsb-c | 31.0 % | 1,200 / 900 | 6 | 25.0 % | 80% |" in table


def test_piped_records_are_named_as_go_ycsb_load_names_them():
    # `go-ycsb load redis --threads 2 -p recordcount=1000 -p redis.datatype=string` (v1.0.3,
    # 2026-11-25) wrote exactly the 1000 keys key_numbers(0, 1000) names; record 0 is this one
    from damon_hp.experiment.apps.redis_ycsb import key_numbers, record_commands, record_value

    assert key_numbers(0, 1).tolist() == [6284781860667377211]
    assert len(set(key_numbers(0, 100_000).tolist())) == 100_000
    assert (key_numbers(0, 1000) > 0).all()
    value = record_value(1, 256)
    assert value.startswith(b'{"field0":"') and len(value) == 13 + 344
    first = next(record_commands(3, 1, 256))
    assert first.startswith(b"*3\r\n$3\r\nSET\r\n$33\r\nusertable/user6284781860667377211\r\n")
    assert first.count(b"*3\r\n") == 3
