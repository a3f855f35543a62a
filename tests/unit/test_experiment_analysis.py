"""Analysis of constructed run records; every expected number below is worked out by hand in
the comment next to it."""

from __future__ import annotations

import pytest
from damon_hp.experiment.analysis import analyse, overhead_removed, speedup_preserved
from damon_hp.experiment.results import OOM, RunResult

MiB = 2**20


def run(arm, rep, wall, peak=100 * MiB, memory="sufficient", status="ok", **kw):
    return RunResult(
        cell_id=f"w_t1_{arm}_{memory}_r{rep}", workload="w", program="w", input=None,
        threads=1, arm=arm, memory=memory, rep=rep, status=status, wall_s=wall,
        peak_rss_bytes=peak, **kw,
    )


def records():
    # never: 10, 12, 11 (median 11, half-range 1); always: 8, 8, 9 (median 8)
    # damon-hp: 9, 9.5, 10 (median 9.5); an OOM run of damon-hp must be ignored.
    rs = []
    for rep, (n, a, p) in enumerate([(10, 8, 9), (12, 8, 9.5), (11, 9, 10)]):
        rs.append(run("thp-never", rep, n, peak=100 * MiB, minflt=1000))
        rs.append(run("thp-always", rep, a, peak=140 * MiB, minflt=10))
        rs.append(run("damon-hp", rep, p, peak=110 * MiB, minflt=500))
    rs.append(run("damon-hp", 3, 999.0, peak=1, status=OOM))
    return rs


def test_speedup_preserved_from_medians_with_per_repetition_range():
    g = analyse(records()).group("w", 1, "sufficient")
    sp = g.arms["damon-hp"].speedup_preserved
    # (11 - 9.5) / (11 - 8) = 0.5
    assert sp.value == pytest.approx(0.5)
    # per rep: (10-9)/(10-8)=0.5, (12-9.5)/(12-8)=0.625, (11-10)/(11-9)=0.5
    assert (sp.lo, sp.hi, sp.n) == (pytest.approx(0.5), pytest.approx(0.625), 3)


def test_baselines_get_their_trivial_ratios():
    g = analyse(records()).group("w", 1, "sufficient")
    assert g.arms["thp-never"].speedup_preserved.value == pytest.approx(0.0)
    assert g.arms["thp-always"].speedup_preserved.value == pytest.approx(1.0)
    assert g.arms["thp-never"].overhead_removed.value == pytest.approx(1.0)
    assert g.arms["thp-always"].overhead_removed.value == pytest.approx(0.0)


def test_memory_overhead_removed():
    g = analyse(records()).group("w", 1, "sufficient")
    # (140 - 110) / (140 - 100) = 0.75, the same in every repetition
    r = g.arms["damon-hp"].overhead_removed
    assert r.value == pytest.approx(0.75)
    assert (r.lo, r.hi) == (pytest.approx(0.75), pytest.approx(0.75))


def test_runtime_normalised_to_never():
    g = analyse(records()).group("w", 1, "sufficient")
    r = g.arms["damon-hp"].vs_never["runtime_s"]
    # 9.5 / 11; per rep 9/10 = 0.9, 9.5/12, 10/11
    assert r.value == pytest.approx(9.5 / 11)
    assert r.lo == pytest.approx(9.5 / 12)
    assert r.hi == pytest.approx(10 / 11)
    assert g.arms["thp-always"].vs_never["minflt"].value == pytest.approx(10 / 1000)


def test_failed_runs_are_counted_but_never_enter_the_numbers():
    a = analyse(records())
    s = a.group("w", 1, "sufficient").arms["damon-hp"]
    assert (s.n_ok, s.n_not_ok) == (3, 1)
    assert s.metrics["wall_s"].hi == 10
    assert [d["status"] for d in a.not_ok] == ["oom"]


def test_tlb_ratio_without_pmu_is_not_available_rather_than_zero():
    s = analyse(records()).group("w", 1, "sufficient").arms["damon-hp"]
    r = s.vs_never["dtlb_load_misses"]
    assert r.value is None
    assert r.undefined == "n/a (no PMU)"


def test_speedup_is_undefined_when_always_was_not_faster():
    r = speedup_preserved([(0, 9.0), (1, 9.0)], [(0, 10.0), (1, 10.0)], [(0, 10.5), (1, 10.4)])
    assert r.value is None
    assert "thp-always was not faster than thp-never" in r.undefined


def test_speedup_is_undefined_when_the_gap_is_within_noise():
    # never 10 and 12: median 11, half-range 1; always median 10.6: gap 0.4 <= 1
    r = speedup_preserved([(0, 9.0), (1, 9.0)], [(0, 10.0), (1, 12.0)], [(0, 10.5), (1, 10.7)])
    assert r.value is None
    assert "within run-to-run noise" in r.undefined


def test_single_runs_use_a_one_percent_noise_floor():
    # gap 0.05 on 10 s is below 1% (0.1): undefined; gap 0.5 is not.
    assert speedup_preserved([(0, 9.99)], [(0, 10.0)], [(0, 9.95)]).value is None
    r = speedup_preserved([(0, 9.75)], [(0, 10.0)], [(0, 9.5)])
    assert r.value == pytest.approx(0.5)


def test_overhead_is_undefined_when_always_used_no_more_memory():
    r = overhead_removed([(0, 100.0)], [(0, 100.0)], [(0, 100.0)])
    assert r.value is None
    assert "thp-always used no more memory than thp-never" in r.undefined


def test_fixed_time_benchmarks_compare_ns_per_operation_not_wall_time():
    rs = [run("thp-never", 0, 5.0, ns_per_op=20.0), run("thp-always", 0, 5.1, ns_per_op=10.0),
          run("damon-hp", 0, 5.2, ns_per_op=12.0)]
    g = analyse(rs).group("w", 1, "sufficient")
    assert g.runtime_basis == "ns per operation"
    # (20 - 12) / (20 - 10) = 0.8
    assert g.arms["damon-hp"].speedup_preserved.value == pytest.approx(0.8)


def test_memory_pressure_slowdown_is_paired_by_arm():
    rs = records()
    rs.append(run("thp-always", 0, 16.0, memory="insufficient"))
    rs.append(run("damon-hp", 0, 9.9, memory="insufficient"))
    rs.append(run("thp-never", 0, 10.0, memory="insufficient", status=OOM))
    a = analyse(rs)
    by_arm = {e.arm: e.slowdown for e in a.pressure}
    # always: 16 / median(8, 8, 9) = 2; damon-hp: 9.9 / 9.5
    assert by_arm["thp-always"].value == pytest.approx(2.0)
    assert by_arm["damon-hp"].value == pytest.approx(9.9 / 9.5)
    assert by_arm["thp-never"].value is None
    assert "oom" in by_arm["thp-never"].undefined


def test_groups_are_ordered_by_workload_threads_then_sufficient_first():
    rs = [run("thp-never", 0, 1.0, memory="insufficient"), run("thp-never", 0, 1.0)]
    a = analyse(rs)
    assert [g.memory for g in a.groups] == ["sufficient", "insufficient"]


def test_memory_gap_below_one_huge_page_is_not_an_overhead():
    # always uses 1 MiB more than never: less than one 2 MiB huge page, so no ratio
    r = overhead_removed([(0, 100.5 * MiB)], [(0, 100.0 * MiB)], [(0, 101.0 * MiB)])
    assert r.value is None
    assert "within run-to-run noise" in r.undefined


def test_speedup_preserved_from_cpu_time_per_operation():
    # Wall time says nothing (a loaded host held damon-hp's workload off the CPU), CPU per op
    # does: never 20 ns/op, always 16, damon-hp 17 -> (20 - 17) / (20 - 16) = 75%.
    rs = []
    for rep in range(3):
        for arm, cpu_ns in (("thp-never", 20), ("thp-always", 16), ("damon-hp", 17)):
            ops = 10**9
            rs.append(run(arm, rep, 40.0 if arm != "damon-hp" else 60.0, user_s=cpu_ns,
                          sys_s=0.0, ops=ops, ns_per_op=40.0, agent_cpu_s=0.4))
    s = analyse(rs).group("w", 1, "sufficient").arms["damon-hp"]
    assert s.speedup_preserved_cpu.value == pytest.approx(0.75)
    assert s.metrics["cpu_ns_per_op"].median == pytest.approx(17)
    assert s.metrics["agent_cpu_frac"].median == pytest.approx(0.4 / 60)


def test_speedup_preserved_from_cpu_time_for_fixed_work():
    # no ops (streamcluster): the CPU time itself; never 10 s, always 8, damon-hp 9 -> 50%
    rs = [run(arm, rep, 30.0, user_s=cpu, sys_s=0.0)
          for rep in range(3)
          for arm, cpu in (("thp-never", 10.0), ("thp-always", 8.0), ("damon-hp", 9.0))]
    s = analyse(rs).group("w", 1, "sufficient").arms["damon-hp"]
    assert s.speedup_preserved_cpu.value == pytest.approx(0.5)
