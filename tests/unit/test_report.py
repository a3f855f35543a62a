"""The summary table and the JSON report: unknown values stay unknown, peaks and totals add up."""

from __future__ import annotations

import json

from damon_hp import report
from damon_hp.report import CollapseTally, RunReport, TimelineEntry


def make_report() -> RunReport:
    r = RunReport(mode="run", target_pid=42, command=["hotcold", "--hot", "256M"],
                  kernel="6.12.95", thp_mode="never", options={"sample_us": 5000})
    for i, (huge, rss, pte) in enumerate([(0, 100 << 20, 400 << 10), (64 << 20, 120 << 20,
                                          300 << 10), (32 << 20, 110 << 20, 350 << 10)]):
        e = TimelineEntry(t_s=i * 0.1, monotonic_s=100 + i * 0.1, nr_regions=12,
                          hot_bytes=64 << 20, hot_huge_bytes=huge, huge_bytes=huge,
                          rss_bytes=rss, promoted_bytes=huge)
        if i == 1:
            e.collapse.add(True, 2 << 20, None, 0.01)
            e.collapse.add(False, 0, "EAGAIN", 0.02)
        r.timeline.append(e)
        r.observe_memory(huge, rss, pte)
    r.collapse.add(True, 2 << 20, None, 0.01)
    r.collapse.add(False, 0, "EAGAIN", 0.02)
    r.hot_bytes, r.hot_huge_bytes = 64 << 20, 32 << 20
    return r


def test_peaks_and_finals_follow_the_readings() -> None:
    r = make_report()
    assert r.peak_huge_bytes == 64 << 20 and r.final_huge_bytes == 32 << 20
    assert r.peak_rss_bytes == 120 << 20 and r.final_rss_bytes == 110 << 20
    assert r.peak_pte_bytes == 400 << 10 and r.final_pte_bytes == 350 << 10


def test_a_missing_reading_does_not_erase_the_last_known_value() -> None:
    r = make_report()
    r.observe_memory(None, None, None)
    assert r.final_huge_bytes == 32 << 20 and r.peak_rss_bytes == 120 << 20


def test_a_reading_between_snapshots_moves_only_the_peaks() -> None:
    r = make_report()
    r.observe_memory(None, 130 << 20, 100 << 10, final=False)
    assert r.peak_rss_bytes == 130 << 20 and r.final_rss_bytes == 110 << 20
    assert r.peak_pte_bytes == 400 << 10 and r.final_pte_bytes == 350 << 10
    fresh = RunReport(mode="run", target_pid=1, command=[], kernel="k", thp_mode="never")
    fresh.observe_memory(None, 5 << 20, 4 << 10, final=False)  # no snapshot yet
    assert fresh.peak_rss_bytes == 5 << 20 and fresh.final_rss_bytes is None


def test_coverage_is_the_huge_share_of_the_last_hot_set_and_unknown_without_one() -> None:
    r = make_report()
    assert r.coverage == 0.5
    r.hot_bytes = 0
    assert r.coverage is None
    assert "n/a" in report.format_table(r).split("hot-set coverage")[1].splitlines()[0]


def test_coverage_is_of_the_last_hot_set_seen_not_of_a_quiet_end() -> None:
    r = RunReport(mode="run", target_pid=1, command=[], kernel="k", thp_mode="never")
    r.observe_hot(0, 0)  # nothing hot yet: no coverage to give
    assert (r.hot_bytes, r.coverage) == (0, None)
    r.observe_hot(8 << 20, 2 << 20)
    r.observe_hot(6 << 20, 6 << 20)
    r.observe_hot(0, 0)  # the workload's quiet end keeps the last hot set's figures
    assert (r.hot_bytes, r.hot_huge_bytes, r.coverage) == (6 << 20, 6 << 20, 1.0)
    assert "hot set (last seen)" in report.format_table(r)


def test_unmeasured_values_print_as_na_never_as_zero() -> None:
    r = RunReport(mode="attach", target_pid=7, command=[], kernel="k", thp_mode="never")
    table = report.format_table(r)
    for row in ("target CPU time", "kdamond CPU time", "AnonHugePages peak/final",
                "minor/major faults"):
        line = next(ln for ln in table.splitlines() if row in ln)
        assert "n/a" in line and " 0 " not in line, line
    s = r.summary_dict()
    assert s["target_cpu_s"] is None and s["minor_faults"] is None and s["hot_coverage"] is None


def test_table_counts_failures_by_errno() -> None:
    table = report.format_table(make_report())
    assert "failed collapses" in table and "EAGAIN x1 (pages busy for a moment)" in table
    assert "1 (2.0 MiB)" in table


def test_json_has_summary_timeline_and_actions(tmp_path) -> None:
    r = make_report()
    r.actions.append({"t_s": 0.1, "action": "collapse", "start": 0, "end": 2 << 20,
                      "bytes": 2 << 20, "error": None, "seconds": 0.01})
    path = tmp_path / "out.json"
    report.write_json(r, path)
    d = json.loads(path.read_text())
    assert d["version"] == report.REPORT_VERSION
    assert d["summary"]["promotions"] == 1 and d["summary"]["promoted_bytes"] == 2 << 20
    assert d["summary"]["collapse"]["errors"] == {"EAGAIN": 1}
    assert [e["huge_bytes"] for e in d["timeline"]] == [0, 64 << 20, 32 << 20]
    assert d["timeline"][1]["actions"]["collapse"]["tried"] == 2
    assert d["timeline"][0]["actions"]["collapse"]["tried"] == 0
    assert d["actions"][0]["bytes"] == 2 << 20
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_collapse_tally_adds_only_successful_bytes() -> None:
    t = CollapseTally()
    t.add(True, 100, None, 0.5)
    t.add(False, 0, "ENOMEM", 0.25)
    t.add(False, 0, "ENOMEM", 0.25)
    assert (t.tried, t.ok, t.bytes, t.errors, t.seconds) == (3, 1, 100, {"ENOMEM": 2}, 1.0)


def test_progress_line_names_the_target_and_what_was_done() -> None:
    line = report.format_progress(make_report())
    assert "pid 42" in line and "promoted 1" in line and "50.0 % huge" in line


def test_byte_formatting_uses_binary_units() -> None:
    assert report.fmt_bytes(None) == "n/a"
    assert report.fmt_bytes(512) == "512 B"
    assert report.fmt_bytes(3 << 20) == "3.0 MiB"
    assert report.fmt_bytes(5 << 30) == "5.0 GiB"


def test_perf_events_without_a_figure_print_na_with_the_reason() -> None:
    r = make_report()
    r.extra["perf"] = {"target": "pid 42", "elapsed_s": 1.0,
                       "events": {"dTLB-load-misses": None, "page-faults": 1234},
                       "unavailable": {"dTLB-load-misses": "no PMU"}}
    table = report.format_table(r)
    assert "perf dTLB-load-misses" in table and "n/a (no PMU)" in table
    assert "1,234" in table
    d = r.to_dict()
    assert d["summary"]["extra"]["perf"]["events"]["dTLB-load-misses"] is None


def test_monitoring_cpu_is_the_agents_less_the_kernels_collapse_copies(tmp_path) -> None:
    r = RunReport(mode="run", target_pid=1, command=[], kernel="k", thp_mode="never")
    r.wall_s, r.agent_cpu_s = 100.0, 3.0
    r.collapse.add(True, 2 << 20, None, 0.5, cpu_seconds=2.2)
    assert report.monitoring_cpu_s(r) == 3.0 - 2.2
    line = next(x for x in report.format_table(r).splitlines() if "agent CPU time" in x)
    assert "monitoring 0.80 s (0.8 % of a core), collapses 2.20 s" in line
    path = tmp_path / "r.json"
    report.write_json(r, path)
    assert json.loads(path.read_text())["summary"]["monitoring_cpu_s"] == 0.8
