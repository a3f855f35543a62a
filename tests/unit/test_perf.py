"""perf stat -x, parsing on recorded outputs (tests/fixtures/perf: each file says its origin)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from damon_hp.perf import (
    HARDWARE_EVENTS,
    NO_PMU,
    NOT_COUNTED,
    NOT_SUPPORTED,
    PERF_EVENTS,
    PerfCount,
    format_value,
    parse_perf_csv,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "perf"


def load(name: str):
    return parse_perf_csv((FIXTURES / name).read_text())


def test_every_fixture_names_its_origin():
    for path in FIXTURES.glob("*.csv"):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# fixture: ")
        constructed = "constructed" in path.name
        assert ("CONSTRUCTED" in first and "NOT captured" in first) == constructed, path.name
        assert ("captured (not constructed)" in first) != constructed, path.name


@pytest.mark.parametrize("name", ["no-pmu-run.csv", "no-pmu-attach.csv"])
def test_without_pmu_hardware_events_are_none_with_reason_no_pmu(name):
    result = load(name)
    assert set(result.counts) == set(PERF_EVENTS)
    for event in PERF_EVENTS:
        if event in HARDWARE_EVENTS:
            assert result.value(event) is None
            assert result.counts[event].status == NOT_SUPPORTED
            assert result.reason(event) == NO_PMU
            assert result.format(event) == "n/a (no PMU)"
        else:
            assert result.value(event) is not None


def test_without_pmu_software_page_faults_keep_their_real_value():
    # both numbers are the ones in the captured files
    assert load("no-pmu-run.csv").value("page-faults") == 10399
    attach = load("no-pmu-attach.csv")
    assert attach.value("page-faults") == 5000
    assert attach.format("page-faults") == "5,000"


def test_without_pmu_json_has_null_not_zero():
    data = json.loads(json.dumps(load("no-pmu-attach.csv").to_json()))
    assert data["events"]["dTLB-load-misses"] is None
    assert data["events"]["cycles"] is None
    assert data["unavailable"]["iTLB-load-misses"] == "no PMU"
    assert "page-faults" not in data["unavailable"]
    assert 0 not in [v for k, v in data["events"].items() if k in HARDWARE_EVENTS]


def test_with_pmu_every_event_has_its_value_and_metric():
    result = load("with-pmu-run.constructed.csv")
    assert result.value("dTLB-load-misses") == 48312977
    assert result.value("dTLB-store-misses") == 11203554
    assert result.value("iTLB-load-misses") == 18342
    assert result.value("page-faults") == 262404
    assert result.value("cycles") == 7311482207
    assert result.value("instructions") == 4702104529
    assert result.unavailable == {}
    ipc = result.counts["instructions"]
    assert (ipc.metric_value, ipc.metric_unit) == (0.64, "insn per cycle")
    assert result.format("cycles") == "7,311,482,207"


def test_multiplexed_counts_keep_running_share_and_not_counted_is_none():
    result = load("with-pmu-multiplexed.constructed.csv")
    assert result.counts["dTLB-load-misses"].running_pct == 49.97
    assert result.value("dTLB-load-misses") == 1203344
    itlb = result.counts["iTLB-load-misses"]
    assert itlb.value is None and itlb.status == NOT_COUNTED
    # the PMU exists (cycles counted), so this is not "no PMU"
    assert result.reason("iTLB-load-misses") == NOT_COUNTED
    assert result.format("iTLB-load-misses") == "n/a (not counted)"


def test_hybrid_cpu_lines_are_summed_per_event():
    text = (
        "# started on Mon Nov  3 10:00:00 2025\n\n"
        "1000,,cpu_core/dTLB-load-misses/,500,100.00,,\n"
        "<not supported>,,cpu_atom/dTLB-load-misses/,0,100.00,,\n"
        "2000,,cpu_core/cycles/,500,100.00,,\n"
        "3000,,cpu_atom/cycles/,500,100.00,,\n"
    )
    result = parse_perf_csv(text)
    assert result.value("dTLB-load-misses") == 1000
    assert result.value("cycles") == 5000


def test_notices_metric_only_lines_and_comments_are_skipped():
    text = (
        "# started on Mon Nov  3 10:00:00 2025\n\n"
        "Events disabled\nEvents enabled\n"
        "12.5,msec,task-clock,12500000,100.00,0.98,CPUs utilized\n"
        ",,,,,1.5,frontend cycles idle\n"
    )
    result = parse_perf_csv(text)
    assert list(result.counts) == ["task-clock"]
    assert result.value("task-clock") == 12.5
    assert result.format("task-clock") == "12.50"


def test_format_value_never_prints_zero_for_missing_data():
    missing = PerfCount("cycles", None, NOT_SUPPORTED)
    assert format_value(missing, NO_PMU) == "n/a (no PMU)"
    assert format_value(missing) == "n/a (not supported)"
    assert format_value(PerfCount("page-faults", 0, "counted")) == "0"
