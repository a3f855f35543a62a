"""`damon-hp doctor` inside the test VM: a free DAMON with vaddr, so the agent can run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from damon_hp.damon import Intervals, start_vaddr

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = ROOT / ".venv/bin/damon-hp"
KDAMONDS = Path("/sys/kernel/mm/damon/admin/kdamonds")


def doctor_json() -> tuple[int, dict]:
    p = subprocess.run([str(DAMON_HP), "doctor", "--json"], capture_output=True, text=True,
                       timeout=600)
    return p.returncode, json.loads(p.stdout)


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_doctor_says_the_agent_can_run_in_the_vm():
    code, report = doctor_json()
    checks = by_name(report)
    assert code in (0, 1), report["verdict"]
    assert report["exit_code"] == code
    assert not [c for c in report["checks"] if c["status"] == "MISSING"]
    assert checks["damon ops"]["status"] == "OK" and "vaddr" in checks["damon ops"]["detail"]
    assert checks["new kdamond"]["status"] == "OK"
    assert checks["madv_collapse"]["status"] == "OK"
    assert checks["process_madvise"]["status"] == "OK"
    # No PMU in a TCG guest: a limit, never a number.
    assert checks["pmu"]["status"] == "LIMITED" and "n/a" in checks["pmu"]["detail"]
    assert report["verdict"].startswith("damon-hp can run here")


def test_doctor_human_output_has_one_line_per_check_and_the_verdict():
    p = subprocess.run([str(DAMON_HP), "doctor"], capture_output=True, text=True, timeout=600)
    lines = p.stdout.splitlines()
    assert p.returncode in (0, 1)
    status_lines = [ln for ln in lines if ln.split(" ", 1)[0] in ("OK", "LIMITED", "MISSING")]
    names = [ln[9:27].strip() for ln in status_lines]
    for want in ("kernel", "damon sysfs", "damon ops", "new kdamond", "thp", "pmu", "root"):
        assert want in names
    assert lines[-1].startswith("damon-hp can run here")


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield p
    p.kill()
    p.wait()


def test_doctor_names_our_running_kdamond_and_says_no_second_one_fits(sleeper):
    with start_vaddr(sleeper.pid, Intervals(5000, 100000, 1000000), 10, 50) as kd:
        before = (KDAMONDS / "nr_kdamonds").read_text(), (KDAMONDS / "0/pid").read_text()
        code, report = doctor_json()
        after = (KDAMONDS / "nr_kdamonds").read_text(), (KDAMONDS / "0/pid").read_text()
        assert kd.is_running()
    checks = by_name(report)
    mine = checks[f"kdamond {kd.index}"]
    assert mine["status"] == "OK"
    assert f"started by damon-hp agent pid {os.getpid()}" in mine["detail"]
    assert checks["new kdamond"]["status"] == "MISSING"
    assert code == 2
    assert before == after
