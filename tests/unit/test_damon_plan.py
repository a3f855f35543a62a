"""Where damon-hp may start a kdamond, decided from a DAMON status (pure: no sysfs here).

The statuses are built like `probe()` builds them; the host's real one is in
tests/fixtures/doctor-host-6.18.44.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from damon_hp.damon import (
    OWNER_DAMON_HP,
    OWNER_FOREIGN,
    OWNER_NONE,
    OWNER_STALE,
    ULONG_MAX,
    AddrRange,
    DamonStatus,
    KdamondInfo,
    plan_placement,
    plan_start,
)
from damon_hp.damon.schemes import allow_ranges_as_reject_gaps
from damon_hp.errors import EnvironmentProblem

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ALL_OPS = ("vaddr", "fvaddr", "paddr")


def status(*kdamonds: KdamondInfo, ops: tuple[str, ...] = ALL_OPS) -> DamonStatus:
    return DamonStatus(True, True, None, ops, "avail_operations", kdamonds)


def kd(index: int, state: str, owner: str, pid: int | None = None, ops=("vaddr",),
       targets=(100,), agent: int | None = None) -> KdamondInfo:
    return KdamondInfo(index, state, pid, ops, targets, owner, agent)


def test_free_damon_gets_a_new_kdamond_dir():
    plan = plan_start(status())
    assert (plan.index, plan.set_nr_kdamonds) == (0, 1)


def test_empty_idle_dir_is_reused_in_place():
    plan = plan_start(status(kd(0, "off", OWNER_NONE, ops=(), targets=())))
    assert (plan.index, plan.set_nr_kdamonds) == (0, None)


def test_idle_dir_left_by_a_dead_agent_is_reused():
    plan = plan_start(status(kd(0, "off", OWNER_FOREIGN, ops=("paddr",)),
                             kd(1, "off", OWNER_STALE, agent=77)))
    assert (plan.index, plan.set_nr_kdamonds) == (1, None)


def test_running_foreign_kdamond_is_named_and_blocks_start():
    st = status(kd(0, "on", OWNER_FOREIGN, pid=77, ops=("paddr",), targets=(0,)))
    with pytest.raises(EnvironmentProblem) as e:
        plan_start(st)
    msg = str(e.value)
    assert "kdamond 0 (pid 77, ops paddr)" in msg
    assert "not started by damon-hp" in msg and "nr_kdamonds is locked" in msg
    assert e.value.exit_code == 2


def test_running_kdamond_of_a_live_agent_blocks_a_second_agent():
    st = status(kd(0, "on", OWNER_DAMON_HP, pid=90, agent=1234))
    with pytest.raises(EnvironmentProblem, match="damon-hp agent pid 1234"):
        plan_placement(st)


def test_idle_configured_foreign_dirs_are_never_wiped():
    st = status(kd(0, "off", OWNER_FOREIGN, ops=("paddr",)))
    with pytest.raises(EnvironmentProblem, match="wipe their configuration"):
        plan_start(st)


def test_missing_vaddr_and_busy_damon_are_both_named():
    st = status(kd(0, "on", OWNER_FOREIGN, pid=77, ops=("paddr",)), ops=("paddr",))
    with pytest.raises(EnvironmentProblem) as e:
        plan_start(st)
    assert "offers only paddr" in str(e.value) and "kdamond 0 (pid 77" in str(e.value)


def test_missing_or_unreadable_sysfs_is_an_environment_problem():
    with pytest.raises(EnvironmentProblem, match="CONFIG_DAMON_SYSFS"):
        plan_start(DamonStatus(False, False, "gone", (), "unknown", ()))
    with pytest.raises(EnvironmentProblem, match="as root"):
        plan_start(DamonStatus(True, False, "cannot read: Permission denied", (), "unknown", ()))


def test_recorded_host_status_refuses_with_the_real_foreign_kdamond():
    facts = json.loads((FIXTURES / "doctor-host-6.18.44.json").read_text())["facts"]
    st = DamonStatus.from_dict(facts["damon"])
    foreign = st.foreign_running
    assert len(foreign) == 1 and foreign[0].ops == ("paddr",)
    with pytest.raises(EnvironmentProblem) as e:
        plan_start(st)
    assert f"kdamond {foreign[0].index} (pid {foreign[0].pid}, ops paddr)" in str(e.value)


def test_status_round_trips_through_dict():
    st = status(kd(0, "on", OWNER_FOREIGN, pid=77, ops=("paddr",), targets=(0,)))
    assert DamonStatus.from_dict(json.loads(json.dumps(st.to_dict()))) == st


def test_allowed_ranges_become_the_rejected_gaps_around_them():
    a, b = AddrRange(0x1000, 0x3000), AddrRange(0x8000, 0x9000)
    assert allow_ranges_as_reject_gaps((b, a)) == [
        AddrRange(0, 0x1000), AddrRange(0x3000, 0x8000), AddrRange(0x9000, ULONG_MAX)]


def test_overlapping_and_touching_ranges_leave_no_gap_between_them():
    gaps = allow_ranges_as_reject_gaps((AddrRange(0x1000, 0x5000), AddrRange(0x3000, 0x6000),
                                         AddrRange(0x6000, 0x7000)))
    assert gaps == [AddrRange(0, 0x1000), AddrRange(0x7000, ULONG_MAX)]


def test_range_starting_at_zero_has_no_leading_gap():
    assert allow_ranges_as_reject_gaps((AddrRange(0, 0x1000),)) == [
        AddrRange(0x1000, ULONG_MAX)]
