"""Doctor's verdicts on facts recorded on real machines (tests/fixtures/doctor-*.json).

The host fixture is this project's development host: paddr-only DAMON with a foreign kdamond,
no PMU. The vm fixture is the pinned 6.12 test kernel: free DAMON with vaddr, no PMU. Variants
change one fact at a time to show which fact decides which verdict.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from damon_hp import doctor, kconfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WANTS = kconfig.load_fragment()


def facts(name: str) -> doctor.Facts:
    return doctor.Facts.from_dict(json.loads((FIXTURES / name).read_text())["facts"])


def host() -> doctor.Facts:
    return facts("doctor-host-6.18.44.json")


def vm() -> doctor.Facts:
    return facts("doctor-vm-6.12.95.json")


def judge(f: doctor.Facts) -> tuple[int, dict[str, doctor.Check]]:
    checks = doctor.evaluate(f, WANTS)
    return doctor.exit_code(checks), {c.name: c for c in checks}


def test_host_runs_passive_only_on_its_paddr_only_and_busy_damon():
    code, c = judge(host())
    assert code == 1
    assert c["damon ops"].status == "LIMITED" and "only paddr" in c["damon ops"].detail
    assert c["config DAMON_VADDR"].status == "LIMITED"
    foreign = host().damon["kdamonds"][0]
    k = c[f"kdamond {foreign['index']}"]
    assert "NOT started by damon-hp" in k.detail and f"pid {foreign['pid']}" in k.detail
    assert c["new kdamond"].status == "LIMITED" and "nr_kdamonds is locked" in c[
        "new kdamond"].detail
    assert c["source"].status == "OK" and "takes passive" in c["source"].detail
    passive = c["source passive"]
    assert passive.status == "OK" and f"pid {foreign['pid']}" in passive.detail
    assert "aggregation 5000 ms" in passive.detail and "pageout" in passive.detail
    for name in ("vaddr", "paddr"):
        assert c[f"source {name}"].status == "LIMITED"
        assert "nr_kdamonds is locked" in c[f"source {name}"].detail
    assert "only paddr" in c["source vaddr"].detail
    assert c["pmu"].status == "LIMITED" and "no PMU" in c["pmu"].detail


def test_recorded_verdict_matches_what_doctor_printed_then():
    for name in ("doctor-host-6.18.44.json", "doctor-vm-6.12.95.json"):
        recorded = json.loads((FIXTURES / name).read_text())
        assert judge(doctor.Facts.from_dict(recorded["facts"]))[0] == recorded["exit_code"]


def test_vm_can_run_with_limits_and_no_pmu_is_a_limit():
    code, c = judge(vm())
    assert code == 1
    assert not [x for x in c.values() if x.status == "MISSING"]
    assert c["new kdamond"].status == "OK" and c["damon ops"].status == "OK"
    assert c["pmu"].status == "LIMITED" and "n/a" in c["pmu"].detail


def test_vm_with_a_pmu_and_full_config_runs_with_everything():
    f = vm()
    f.pmu = {"devices": ["cpu"], "cycles": "ok", "dtlb_load_misses": "ok"}
    f.kconfig = {w.name: "y" for w in WANTS}
    code, c = judge(f)
    assert code == 0, [x.line() for x in c.values() if x.status != "OK"]


def test_foreign_running_paddr_kdamond_leaves_the_vm_the_passive_source():
    f = vm()
    f.damon = copy.deepcopy(f.damon)
    f.damon["kdamonds"] = [{"index": 0, "state": "on", "pid": 321, "ops": ["paddr"],
                            "target_pids": [0], "owner": "foreign", "agent_pid": None}]
    f.foreign = {"0": {"intervals_us": [5000, 100000, 1000000], "schemes": []}}
    code, c = judge(f)
    assert code == 1
    assert "kdamond 0 (pid 321, ops paddr)" in c["new kdamond"].detail
    assert c["source passive"].status == "OK" and "takes passive" in c["source"].detail


def test_no_source_at_all_cannot_run():
    f = vm()
    f.damon = copy.deepcopy(f.damon)
    f.damon["kdamonds"] = [{"index": 0, "state": "on", "pid": 321, "ops": ["vaddr"],
                            "target_pids": [9], "owner": "foreign", "agent_pid": None}]
    code, c = judge(f)
    assert code == 2
    assert c["source"].status == "MISSING" and "vm-run" in c["source"].fix
    assert "no running paddr kdamond" in c["source passive"].detail


def test_kdamond_left_by_a_dead_agent_is_a_limit_not_a_blocker():
    f = vm()
    f.damon = copy.deepcopy(f.damon)
    f.damon["kdamonds"] = [{"index": 0, "state": "on", "pid": 321, "ops": ["vaddr"],
                            "target_pids": [55], "owner": "damon-hp (agent gone)",
                            "agent_pid": 44}]
    code, c = judge(f)
    assert code == 1
    assert c["kdamond 0"].status == "LIMITED" and c["new kdamond"].status == "LIMITED"


@pytest.mark.parametrize("change, check, status", [
    (lambda f: setattr(f, "euid", 1000), "root", "MISSING"),
    (lambda f: setattr(f, "cap_eff", 0), "capabilities", "MISSING"),
    (lambda f: setattr(f, "cap_eff", (1 << 21) | (1 << 23)), "capabilities", "LIMITED"),
    (lambda f: setattr(f, "madv_collapse", "EINVAL"), "madv_collapse", "MISSING"),
    (lambda f: setattr(f, "madv_collapse", "ENOMEM"), "madv_collapse", "LIMITED"),
    (lambda f: setattr(f, "process_madvise", "EPERM"), "process_madvise", "MISSING"),
    (lambda f: setattr(f, "process_madvise", "EAGAIN"), "process_madvise", "LIMITED"),
    (lambda f: setattr(f, "btf", False), "btf", "LIMITED"),
    (lambda f: setattr(f, "tracefs", {"mount": None}), "tracefs", "LIMITED"),
    (lambda f: setattr(f, "thp", {k: None for k in f.thp}), "thp", "MISSING"),
    (lambda f: setattr(f, "release", "5.15.0-91-generic"), "kernel", "MISSING"),
    (lambda f: setattr(f, "release", "6.5.0"), "kernel", "LIMITED"),
    (lambda f: setattr(f, "kconfig_source", None), "config", "LIMITED"),
])
def test_one_changed_fact_gives_the_expected_status(change, check, status):
    f = vm()
    change(f)
    code, c = judge(f)
    assert c[check].status == status
    assert code == (2 if status == "MISSING" else 1)
    if status != "OK":
        assert c[check].fix or status == "LIMITED"


def test_missing_damon_sysfs_is_missing_with_a_way_out():
    f = vm()
    f.damon = {**f.damon, "sysfs_present": False, "readable": False,
               "error": "/sys/kernel/mm/damon/admin does not exist", "kdamonds": []}
    code, c = judge(f)
    assert code == 2
    assert c["damon sysfs"].status == "MISSING" and "vm-run" in c["damon sysfs"].fix


def test_every_line_starts_with_its_status_and_says_what_to_do_when_missing():
    for f in (host(), vm()):
        for check in doctor.evaluate(f, WANTS):
            assert check.line().startswith(check.status)
            if check.status == "MISSING":
                assert check.fix, check.name
