"""Pure pieces of the runner: sample reductions, benchmark output parsing, ETA, agent JSON."""

from __future__ import annotations

import math

import pytest
from damon_hp import procfs
from damon_hp.experiment import workloads
from damon_hp.experiment.arms import agent_metrics
from damon_hp.experiment.measure import (
    _all_mapped,
    first_time_at_least,
    peak,
    time_weighted_mean,
)
from damon_hp.experiment.progress import eta_seconds
from damon_hp.experiment.results import RunResult
from damon_hp.ranges import AddrRange, huge_capable_bytes

MiB = 2**20


def test_time_weighted_mean_holds_each_sample_until_the_next():
    # 0 MiB for 1 s, then 10 MiB for 3 s: (0*1 + 10*3) / 4 = 7.5 MiB
    s = [{"t": 0.0, "x": 0}, {"t": 1.0, "x": 10 * MiB}, {"t": 4.0, "x": 99 * MiB}]
    assert time_weighted_mean(s, "x") == pytest.approx(7.5 * MiB)


def test_time_weighted_mean_of_one_sample_or_none():
    assert time_weighted_mean([{"t": 3.0, "x": 5}], "x") == 5
    assert time_weighted_mean([{"t": 3.0, "x": None}], "x") is None
    assert time_weighted_mean([], "x") is None


def test_peak_ignores_missing_values():
    assert peak([{"x": None}, {"x": 3}, {"x": 7}, {}], "x") == 7
    assert peak([{"x": None}], "x") is None


def test_first_time_a_fraction_is_reached():
    s = [{"t": 0.5, "h": 0.0}, {"t": 1.0, "h": 0.5}, {"t": 1.5, "h": 0.95}, {"t": 2.0, "h": 1}]
    assert first_time_at_least(s, "h", 0.9) == 1.5
    assert first_time_at_least(s[:2], "h", 0.9) is None


def test_only_whole_aligned_huge_pages_count_as_huge_capable():
    two = 2 * MiB
    assert huge_capable_bytes([AddrRange(0, 4 * MiB)]) == 4 * MiB
    # [1 MiB, 7 MiB): only [2, 6) MiB are whole aligned 2 MiB pages
    assert huge_capable_bytes([AddrRange(1 * MiB, 7 * MiB)]) == 2 * two
    assert huge_capable_bytes([AddrRange(1 * MiB, 3 * MiB)]) == 0


def test_hot_range_is_read_from_the_benchmarks_first_json_line():
    text = ('noise\n{"pid":12,"hot":{"start":4194304,"end":8388608},'
            '"cold":{"start":16777216,"end":33554432}}\n{"ops":1}\n')
    assert workloads.hot_ranges(text) == [AddrRange(4194304, 8388608)]
    # gups reads its whole table at random: the table is its hot range
    assert workloads.hot_ranges('{"pid":1,"table":{"start":0,"end":4096}}\n') == [
        AddrRange(0, 4096)]
    assert workloads.hot_ranges('{"pid":1,"regions":[{"start":0,"end":4096}]}\n') is None
    assert workloads.hot_ranges('{"hot": broken\n') is None


def test_figure_of_merit_is_ns_per_operation():
    # hotcold/phases print ops per second: 4e7 ops/s = 25 ns per operation
    assert workloads.figure_of_merit('{"ops":80000000,"seconds":2,"ops_per_s":4e7}\n') == \
        pytest.approx(25.0)
    assert workloads.figure_of_merit('{"ns_per_update":12.5,"gups":0.08}\n') == 12.5
    assert workloads.figure_of_merit("streamcluster prints no JSON\n") is None
    assert workloads.figure_of_merit('{"ops":0,"ops_per_s":0}\n') is None


def _phase_output(seconds: int, ops_per_s: list[float], cpu_per_s: list[float]) -> str:
    """A benchmark's progress lines (one a second) and final line, from per-second rates."""
    lines, ops, cpu = ['{"pid":1,"hot":{"start":0,"end":4096}}'], 0.0, 0.0
    for t in range(1, seconds + 1):
        ops += ops_per_s[t - 1]
        cpu += cpu_per_s[t - 1]
        lines.append(f'{{"progress":{{"t":{t}.001,"ops":{int(ops)},"cpu_s":{cpu:.4f}}}}}')
    lines.append(f'{{"ops":{int(ops)},"seconds":{seconds}.001,"ops_per_s":{ops / seconds},'
                 f'"cpu_s":{cpu:.4f},"stopped_by":"timeout"}}')
    return "\n".join(lines) + "\n"


def test_measured_phase_reads_the_phase_cpu_and_the_speed_of_its_last_third():
    # 30 s: 10 ns per op (1e8 ops/s) for 20 s, then 5 ns per op (2e8 ops/s) once promoted; the
    # CPU is half a core throughout (a loaded host)
    text = _phase_output(30, [1e8] * 20 + [2e8] * 10, [0.5] * 30)
    phase = workloads.measured_phase(text)
    assert phase.seconds == pytest.approx(30.001)
    assert phase.cpu_s == pytest.approx(15.0)
    assert phase.late_from_s == pytest.approx(20.001)  # the first progress line at >= 2/3
    assert phase.late_ns_per_op == pytest.approx(5.0, rel=1e-3)
    assert phase.late_cpu_ns_per_op == pytest.approx(2.5, rel=1e-3)


def test_measured_phase_without_progress_has_no_late_figures():
    phase = workloads.measured_phase(
        '{"ops":100,"seconds":2,"ops_per_s":50,"cpu_s":1.5,"stopped_by":"timeout"}\n')
    assert (phase.seconds, phase.cpu_s, phase.late_ns_per_op) == (2, 1.5, None)
    assert workloads.measured_phase("streamcluster prints no JSON\n") is None


def test_cpu_per_op_counts_only_the_measured_phase_when_reported():
    r = RunResult("c", "w", "hotcold", None, 1, "thp-always", "sufficient", 0, user_s=8.0,
                  sys_s=4.0, ops=1_000_000_000)
    assert r.cpu_ns_per_op == pytest.approx(12.0)  # set-up included: nothing else known
    r.phase_cpu_s = 9.0
    assert r.cpu_ns_per_op == pytest.approx(9.0)
    r.phase_s, r.hot_huge_fraction_final, r.time_to_hot_huge_s = 40.0, 0.95, 10.0
    assert r.before_hot_huge_frac == pytest.approx(0.25)
    r.time_to_hot_huge_s = None
    assert r.before_hot_huge_frac == 1.0


def test_eta_uses_the_median_of_the_same_kind_else_of_everything():
    durations = {"a": [10.0, 30.0, 20.0], "b": [100.0]}
    # a: median 20 -> 2 x 20; c unknown: median of all four (10, 20, 30, 100) = 25
    assert eta_seconds(["a", "a", "c"], durations) == pytest.approx(2 * 20 + 25)
    assert math.isnan(eta_seconds(["a"], {}))


def test_agent_cpu_times_come_from_the_agents_json_summary():
    data = {"version": 1, "summary": {"agent_cpu_s": 1.25, "kdamond_cpu_s": 0.5,
                                      "wall_s": 9.0}, "timeline": []}
    assert agent_metrics(data) == {"agent_cpu_s": 1.25, "kdamond_cpu_s": 0.5}
    assert agent_metrics({"summary": {"agent_cpu_s": None}}) == {}


def test_a_physical_sources_least_watched_share_over_the_run_is_taken():
    timeline = [{"t_s": 1.0, "monitored_share": 0.9}, {"t_s": 2.0, "monitored_share": 0.4},
                {"t_s": 3.0, "monitored_share": None}, {"t_s": 4.0, "monitored_share": 1.0}]
    assert agent_metrics({"summary": {}, "timeline": timeline}) == {"watched_share_min": 0.4}
    assert "watched_share_min" not in agent_metrics({"summary": {}, "timeline": timeline[2:3]})


def test_agents_own_time_to_hot_set_huge_starts_at_its_first_hot_snapshot():
    from damon_hp.experiment.arms import agent_hot_huge_s

    timeline = [
        {"t_s": 0.5, "hot_bytes": 0, "hot_huge_bytes": 0},
        {"t_s": 1.0, "hot_bytes": 100, "hot_huge_bytes": 0},
        {"t_s": 2.0, "hot_bytes": 100, "hot_huge_bytes": 50},
        {"t_s": 3.5, "hot_bytes": 100, "hot_huge_bytes": 95},
    ]
    # first hot snapshot at 1.0 s, 95% huge at 3.5 s
    assert agent_hot_huge_s(timeline) == pytest.approx(2.5)
    assert agent_hot_huge_s(timeline[:3]) is None
    assert agent_hot_huge_s(None) is None


def test_water_layout_gives_var_and_each_threads_force_run_as_hot_ranges():
    line = ('{"event":"layout","pid":7,"nmol":512,"threads":2,'
            '"VAR":{"start":1000,"end":2000},"gl":{"start":5000,"end":6000},"pforces":['
            '{"thread":0,"table":{"start":10,"end":20},"nodes":{"start":3000,"end":3500}},'
            '{"thread":1,"table":{"start":30,"end":40},"nodes":{"start":3500,"end":4000}}]}\n')
    assert workloads.hot_ranges("water_nsquared: warning\n" + line) == [
        AddrRange(1000, 2000), AddrRange(3000, 3500), AddrRange(3500, 4000)]
    assert workloads.ground_truth_env("water_nsquared") == {"WATER_NSQUARED_JSON": "1"}
    assert workloads.ground_truth_env("hotcold") == {}


def _maps(*spans: tuple[int, int]) -> list[procfs.Vma]:
    return [procfs.Vma(lo, hi, "rw-p", 0, 0, "") for lo, hi in spans]


def test_a_hot_range_counts_as_mapped_only_while_every_byte_of_it_is():
    hot = [AddrRange(4 * MiB, 20 * MiB)]
    assert _all_mapped(_maps((2 * MiB, 10 * MiB), (10 * MiB, 22 * MiB)), hot)
    # unmapped before exit (hotcold does this after its result line): no longer a measurement
    assert not _all_mapped(_maps((30 * MiB, 40 * MiB)), hot)
    assert not _all_mapped(_maps((2 * MiB, 10 * MiB), (12 * MiB, 22 * MiB)), hot)
    assert not _all_mapped([], hot)


def test_operations_are_read_from_the_benchmarks_last_line():
    assert workloads.operations('{"pid":1}\n{"ops":1262952448,"seconds":1.0,'
                                '"ops_per_s":1.2e9,"stopped_by":"timeout"}\n') == 1262952448
    assert workloads.operations('{"size":268435456,"updates":20000000,"seconds":0.3,'
                                '"ns_per_update":15.7}\n') == 20000000
    assert workloads.operations("streamcluster prints no JSON\n") is None

