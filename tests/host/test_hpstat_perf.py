"""The perf wrapper with the real perf of this host, and hpstat and perf side by side.

This host (and CI, and the VM) has no hardware PMU: the hardware events must come back as None
with the reason "no PMU", never 0, while the software event page-faults stays a real count.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from damon_hp.errors import EnvironmentProblem
from damon_hp.hpstat import HpStat
from damon_hp.perf import HARDWARE_EVENTS, NO_PMU, PERF_EVENTS, PerfSession
from hpstat_child import Child, build_hpstat

CPU_PMUS = ("cpu", "cpu_core", "cpu_atom")


def has_cpu_pmu() -> bool:
    devices = Path("/sys/bus/event_source/devices")
    return any((devices / name).exists() for name in CPU_PMUS) or any(
        d.name.startswith("armv") for d in devices.iterdir()
    )


@pytest.fixture(scope="session", autouse=True)
def built_hpstat() -> str:
    return build_hpstat()


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child()
    yield c
    c.stop()


def check_hardware_events(result) -> None:
    for event in PERF_EVENTS:
        if event not in HARDWARE_EVENTS:
            continue
        if has_cpu_pmu():
            assert result.value(event) is not None, event
        else:
            assert result.value(event) is None, event
            assert result.reason(event) == NO_PMU
            assert result.format(event) == "n/a (no PMU)"
            assert json.loads(json.dumps(result.to_json()))["events"][event] is None


def test_attached_perf_counts_the_childs_page_faults_and_no_invented_hardware_figures(
        child: Child) -> None:
    pages = 5000
    session = PerfSession.start(child.pid)
    child.ask(f"touch {pages} 0")
    result = session.stop()
    faults = result.value("page-faults")
    assert faults is not None
    assert pages <= faults <= 1.05 * pages
    assert result.format("page-faults") == f"{faults:,}"
    check_hardware_events(result)


def test_perf_run_measures_a_command_and_returns_its_exit_code() -> None:
    pages = 3000
    script = (f"import mmap; m = mmap.mmap(-1, 4096 * {pages}, flags=mmap.MAP_PRIVATE | "
              f"mmap.MAP_ANONYMOUS); [m.__setitem__(i * 4096, 1) for i in range({pages})]; "
              "raise SystemExit(3)")
    result = PerfSession.run([sys.executable, "-c", script])
    assert result.exit_code == 3
    assert result.value("page-faults") >= pages
    assert result.elapsed_s > 0
    check_hardware_events(result)


def test_perf_on_a_missing_pid_is_an_environment_problem() -> None:
    gone = Child()
    pid = gone.pid
    gone.stop()
    with pytest.raises(EnvironmentProblem, match=f"PID {pid}"):
        PerfSession.start(pid)


def test_hpstat_and_perf_agree_on_the_childs_page_faults(child: Child) -> None:
    pages = 10000
    with HpStat.start(pid=child.pid, interval_s=1) as trace:
        perf = PerfSession.start(child.pid)
        child.ask(f"touch {pages} 1")
        perf_result = perf.stop()
        total = trace.stop().total
    perf_faults = perf_result.value("page-faults")
    assert perf_faults is not None
    # perf's software event also counts faults the kernel takes on user memory, so it may
    # exceed the user-mode tracepoint's count slightly; both see the child's pages.
    assert abs(total.page_faults_user - perf_faults) <= 0.05 * pages
    assert total.page_faults_user >= pages
