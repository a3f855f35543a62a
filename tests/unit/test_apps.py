"""App workloads (experiment/apps/): their experiment-file rules, the clients' output parsed
into throughput and latency quantiles (recorded outputs in tests/fixtures/apps/), the Redis
loader's keys named as redis-benchmark names them, and the report's target rows."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from damon_hp.experiment import spec
from damon_hp.experiment.apps import mariadb, redis
from damon_hp.experiment.apps import report as app_report
from damon_hp.experiment.apps.client import from_histogram, quantile
from damon_hp.experiment.results import RunResult
from damon_hp.experiment.spec import SpecError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "apps"


def app_doc(**over):
    d = {"experiment": {"name": "a", "where": "host", "repetitions": 2,
                        "arms": ["thp-never", "everywhere", "damon-hp"]},
         "workloads": [{"app": "redis", "threads": [4], "params": {"keys": 1000}}]}
    for k, v in over.items():
        d[k] = v
    return d


@pytest.mark.parametrize("app", ["redis", "mariadb"])
def test_each_half_of_apps_toml_is_its_own_file(app):
    full = tomllib.loads((ROOT / "experiments" / "apps.toml").read_text())
    half = tomllib.loads((ROOT / "experiments" / f"apps-{app}.toml").read_text())
    assert half["workloads"] == [w for w in full["workloads"] if w["app"] == app]
    for key in ("repetitions", "arms", "where", "sample_interval_s"):
        assert half["experiment"][key] == full["experiment"][key]


def test_the_harm_experiment_runs_apps_tomls_mariadb_ycsb_workload_under_two_arms():
    full = tomllib.loads((ROOT / "experiments" / "apps.toml").read_text())
    harm = tomllib.loads((ROOT / "experiments" / "harm-mariadb-ycsb.toml").read_text())
    assert harm["workloads"] == [w for w in full["workloads"] if w["app"] == "mariadb-ycsb"]
    cells, skipped = spec.expand(spec.load(ROOT / "experiments" / "harm-mariadb-ycsb.toml"))
    assert not skipped
    # interleaved, the arms' order turned every other repetition (ABBA: neither arm always
    # runs on the server's heels)
    n, d = "thp-never", "damon-hp"
    assert [(c.arm, c.rep) for c in cells] == [(n, 0), (d, 0), (d, 1), (n, 1),
                                               (n, 2), (d, 2), (d, 3), (n, 3)]


def test_bundled_app_experiments_parse_and_expand_interleaved():
    exp = spec.load(ROOT / "experiments" / "apps.toml")
    cells, skipped = spec.expand(exp)
    assert not skipped
    assert len(cells) == 4 * 3 * 3  # 3 interleaved repetitions fit the hour (issue 23)
    assert [c.arm for c in cells[:3]] == ["thp-never", "everywhere", "damon-hp"]
    assert [c.arm for c in cells[12:15]] == ["everywhere", "damon-hp", "thp-never"]
    assert {c.workload.app for c in cells} == {"redis", "mariadb", "redis-ycsb", "mariadb-ycsb"}


@pytest.mark.parametrize("change,message", [
    ({"arms": ["thp-never", "thp-always"]}, "app workloads take the arms"),
    ({"where": "vm"}, "run on the host only"),
    ({"memory": ["sufficient", "insufficient"], "arms": ["thp-never", "thp-always"]},
     "take the arms"),
])
def test_app_experiments_refuse_what_they_cannot_run(change, message):
    d = app_doc()
    d["experiment"].update(change)
    with pytest.raises(SpecError, match=message):
        spec.parse(d)


def test_unknown_app_params_and_bad_values_are_named():
    with pytest.raises(SpecError, match=r"unknown redis parameters \['key'\]"):
        spec.parse(app_doc(workloads=[{"app": "redis", "params": {"key": 5}}]))
    with pytest.raises(SpecError, match="tests must be"):
        spec.parse(app_doc(workloads=[{"app": "mariadb", "params": {"tests": ["tpcc"]}}]))
    with pytest.raises(SpecError, match="unknown app 'memcached'"):
        spec.parse(app_doc(workloads=[{"app": "memcached"}]))


def test_apps_and_programs_do_not_share_a_file():
    d = app_doc()
    d["workloads"].append({"program": "hotcold", "args": ["--hot", "1M"]})
    with pytest.raises(SpecError, match="cannot share an experiment file"):
        spec.parse(d)


def test_an_app_workload_stays_hashable_with_list_params():
    exp = spec.parse(app_doc(workloads=[{"app": "redis", "params": {"tests": ["get"]}}]))
    assert hash(exp.workloads[0])
    assert dict(exp.workloads[0].params)["tests"] == ("get",)


def test_redis_benchmark_output_gives_throughput_and_percentiles():
    text = (FIXTURES / "redis-benchmark-get.txt").read_text()
    r = redis.parse_benchmark(text, 200000, 0.42)
    assert r.throughput == pytest.approx(516795.88)
    assert r.p50_ms == pytest.approx(0.087)
    assert r.p99_ms is not None and r.p99_ms <= r.p999_ms  # type: ignore[operator]
    assert r.p999_ms == pytest.approx(4.639)  # the first line at or above 99.9 %


def test_sysbench_output_gives_queries_transactions_and_histogram_quantiles():
    text = (FIXTURES / "sysbench-oltp_read_only.txt").read_text()
    r = mariadb.parse_sysbench(text)
    assert r.requests == 101088
    assert r.throughput == pytest.approx(2102.58)
    assert r.p50_ms is not None and r.p99_ms is not None and r.p999_ms is not None
    assert r.p50_ms <= r.p99_ms <= r.p999_ms


def test_quantiles():
    assert quantile([(1.0, 0.5), (2.0, 0.99), (3.0, 1.0)], 0.99) == 2.0
    assert quantile([], 0.5) is None
    assert from_histogram([(1.0, 90), (5.0, 9), (9.0, 1)], 0.99) == 5.0
    assert from_histogram([(1.0, 90), (5.0, 9), (9.0, 1)], 0.999) == 9.0


def test_loaded_keys_are_named_as_redis_benchmark_names_them():
    # redis-benchmark -r N replaces __rand_int__ in key:__rand_int__ by a 12-digit number < N
    assert redis.key(42) == b"key:000000000042"
    chunk = b"".join(redis.set_commands(range(2), b"vv"))
    assert chunk.startswith(b"*3\r\n$3\r\nSET\r\n$16\r\nkey:000000000000\r\n$2\r\nvv\r\n")


def test_templated_commands_equal_commands_built_from_their_parts():
    value = b"v%dv" * 3  # a '%' in the value must not be taken for the key's placeholder
    ids = [*range(3), 41, 999_999_999_999]
    assert b"".join(redis.set_commands(ids, value)) == b"".join(
        redis._resp(b"SET", redis.key(i), value) for i in ids)
    assert b"".join(redis.del_commands(ids)) == b"".join(
        redis._resp(b"DEL", redis.key(i)) for i in ids)
    batches = list(redis.set_commands(range(redis.LOAD_BATCH + 1), b"v"))
    assert len(batches) == 2 and batches[1].count(b"SET") == 1


def _run(arm: str, rep: int, cpu: float, tput: float, rss: int, churn_rss: int) -> RunResult:
    r = RunResult(cell_id=f"r_{arm}_{rep}", workload="redis", program="redis-server",
                  input=None, threads=8, arm=arm, memory="sufficient", rep=rep)
    r.phases = [{"test": "get", "throughput": tput, "p99_ms": 1.0, "cpu_us_per_request": cpu,
                 "requests": 100}]
    r.app = {"measured": {"rss_bytes": rss}, "after_churn": {"rss_bytes": churn_rss}}
    return r


def test_targets_are_rows_with_verdicts_and_numbers():
    runs = []
    for rep in range(3):
        runs += [_run("thp-never", rep, 2.0, 100.0, 1000, 900),
                 _run("everywhere", rep, 1.6, 120.0, 1100, 1100),
                 _run("damon-hp", rep, 1.74, 118.0, 1010, 950)]
    rows = {t.what: t for t in app_report.targets("redis", app_report.Runs(runs), ["get"], True)}
    gain = rows["get: damon-hp keeps >= 70 % of everywhere's gain in server CPU per request"]
    assert gain.met is False and "share kept 65%" in gain.numbers
    harm = rows["get: no harm: damon-hp's server CPU per request no worse than thp-never's "
                "beyond noise"]
    assert harm.met is True and "-13.0%" in harm.numbers
    assert rows["get: damon-hp throughput no worse than thp-never beyond noise"].met is True
    assert rows["RSS within 2 % of thp-never's (after the measured tests)"].met is True
    churn = [t for w, t in rows.items() if w.startswith("after deleting")][0]
    assert churn.met is False  # 150 bytes less is less than one huge page: no difference


def test_no_harm_fails_when_damon_hp_costs_the_server_cpu():
    runs = []
    for rep in range(3):
        runs += [_run("thp-never", rep, 2.0 + rep * 0.02, 100.0, 1000, 900),
                 _run("everywhere", rep, 1.6, 120.0, 1100, 1100),
                 _run("damon-hp", rep, 2.2, 100.0, 1000, 900)]
    rows = app_report.targets("redis", app_report.Runs(runs), ["get"], False)
    harm = [t for t in rows if "no harm" in t.what][0]
    assert harm.met is False and "+8.9%" in harm.numbers


def test_a_gain_within_noise_leaves_the_share_undefined():
    runs = []
    for rep, never in enumerate((2.0, 1.0, 1.5)):
        runs += [_run("thp-never", rep, never, 100.0, 1000, 900),
                 _run("everywhere", rep, 1.45, 100.0, 1000, 900),
                 _run("damon-hp", rep, 1.5, 100.0, 1000, 900)]
    rows = app_report.targets("redis", app_report.Runs(runs), ["get"], False)
    gain = [t for t in rows if "gain" in t.what][0]
    assert gain.met is None and "within noise" in gain.numbers


def test_less_memory_after_churn_needs_more_than_the_spread():
    runs = []
    for rep, (every, damon) in enumerate(((3 << 30, 2 << 30), (3 << 30, 2 << 30),
                                          (3 << 30, 2 << 30))):
        runs += [_run("thp-never", rep, 2.0, 100.0, 1000, 2 << 30),
                 _run("everywhere", rep, 1.6, 120.0, 1000, every),
                 _run("damon-hp", rep, 1.7, 110.0, 1000, damon)]
    rows = app_report.targets("redis", app_report.Runs(runs), ["get"], True)
    churn = [t for t in rows if t.what.startswith("after deleting")][0]
    assert churn.met is True and "1.00 GiB less" in churn.numbers
