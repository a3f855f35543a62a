"""`damon-hp doctor` on the real host, and the DAMON layer's refusal to touch a busy DAMON.

The host's DAMON offers only paddr and runs a kdamond damon-hp did not start. Nothing here
writes under /sys/kernel/mm/damon: doctor only reads, and the start attempt runs in a private
mount namespace where DAMON's sysfs is bind-mounted read-only, so even a bug could not write.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from leftovers import damon_read, sysfs_tree

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = ROOT / ".venv/bin/damon-hp"
ADMIN = Path("/sys/kernel/mm/damon/admin")
THP = Path("/sys/kernel/mm/transparent_hugepage")


# THP counters the kernel moves by itself (allocation stats, khugepaged progress): not
# settings, so they are left out of "nothing changed". DAMON's scheme stats stay in: they
# only move when someone writes update_schemes_stats, which doctor must never do.
THP_COUNTERS = ("stats/", "khugepaged/full_scans", "khugepaged/pages_collapsed")


def read_tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every readable file under `root` with its content, except paths containing `skip`."""
    return sysfs_tree(root, lambda rel: any(c in rel for c in skip))




def running_kdamonds() -> list[tuple[int, int, str]]:
    """(index, pid, ops) of every running kdamond, read from sysfs."""
    out = []
    for kd in sorted((ADMIN / "kdamonds").glob("[0-9]*")):
        if damon_read(kd / "state") == "on":
            ops = damon_read(kd / "contexts/0/operations")
            out.append((int(kd.name), int(damon_read(kd / "pid")), ops))
    return out


@pytest.fixture(scope="module")
def host_damon(foreign_kdamond) -> list[tuple[int, int, str]]:
    running = running_kdamonds()  # foreign_kdamond: the one running, or the tier's own
    if not running:
        pytest.fail("this host was expected to run a foreign kdamond (see DEVELOPERS.md); "
                    "these tests check damon-hp's behaviour next to it")
    return running


def test_doctor_json_on_host_names_the_passive_source_the_foreign_kdamond_and_no_pmu(
        host_damon):
    p = subprocess.run([str(DAMON_HP), "doctor", "--json"], capture_output=True, text=True,
                       timeout=120)
    report = json.loads(p.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert p.returncode == 1 and report["exit_code"] == 1
    assert checks["damon ops"]["status"] == "LIMITED"
    assert "only paddr" in checks["damon ops"]["detail"]
    for index, pid, ops in host_damon:
        line = checks[f"kdamond {index}"]
        assert f"pid {pid}" in line["detail"] and f"ops {ops}" in line["detail"]
        assert "NOT started by damon-hp" in line["detail"]
    assert checks["new kdamond"]["status"] == "LIMITED"
    assert "nr_kdamonds is locked" in checks["new kdamond"]["detail"]
    index, pid, ops = host_damon[0]
    passive = checks["source passive"]
    assert passive["status"] == "OK" and f"pid {pid}" in passive["detail"]
    assert checks["source"]["detail"] == "--source auto takes passive"
    assert checks["source vaddr"]["status"] == checks["source paddr"]["status"] == "LIMITED"
    assert checks["pmu"]["status"] == "LIMITED" and "no PMU" in checks["pmu"]["detail"]
    assert report["verdict"].startswith("damon-hp can run here, with limits")


def test_doctor_human_output_has_the_lines_and_verdict(host_damon):
    p = subprocess.run([str(DAMON_HP), "doctor"], capture_output=True, text=True, timeout=120)
    out = p.stdout
    assert p.returncode == 1
    index, pid, ops = host_damon[0]
    lines = out.splitlines()
    assert any(ln.startswith("LIMITED  damon ops") and "only paddr" in ln for ln in lines)
    assert any(ln.startswith(f"LIMITED  kdamond {index}") and f"pid {pid}" in ln
               for ln in lines)
    assert any(ln.startswith("OK       source passive") and f"pid {pid}" in ln for ln in lines)
    assert any(ln.startswith("LIMITED  pmu") and "n/a (no PMU)" in ln for ln in lines)
    assert lines[-1].startswith("damon-hp can run here") and lines[-1].endswith("(exit 1)")


def test_doctor_changes_nothing_in_damon_sysfs_or_thp_settings(host_damon):
    before = read_tree(ADMIN), read_tree(THP, THP_COUNTERS)
    subprocess.run([str(DAMON_HP), "doctor"], capture_output=True, timeout=120)
    subprocess.run([str(DAMON_HP), "doctor", "--json"], capture_output=True, timeout=120)
    after = read_tree(ADMIN), read_tree(THP, THP_COUNTERS)
    assert after == before
    assert running_kdamonds() == host_damon


ATTEMPT = """
import json, os, sys
from damon_hp.damon import start_vaddr
from damon_hp.errors import DamonHpError, EnvironmentProblem
try:
    start_vaddr(os.getpid())
    out = {"outcome": "started"}
except EnvironmentProblem as e:
    out = {"outcome": "refused", "message": str(e), "exit_code": e.exit_code}
except DamonHpError as e:
    out = {"outcome": "error", "message": str(e)}
print(json.dumps(out))
"""


def test_start_on_host_is_refused_before_any_write_naming_the_foreign_kdamond(host_damon,
                                                                           tmp_path):
    assert shutil.which("unshare"), "unshare missing: it comes with util-linux (Debian: essential)"
    # In a private mount namespace DAMON's sysfs is read-only: a write would fail with EROFS
    # (outcome "error") instead of reaching the kernel; the refusal must come first.
    script = (
        f"mount --bind {ADMIN.parent} {ADMIN.parent} && "
        f"mount -o remount,bind,ro {ADMIN.parent} && "
        f"findmnt -no OPTIONS {ADMIN.parent} | grep -qE '(^|,)ro(,|$)' && "
        f"exec {sys.executable} -c \"$ATTEMPT\""
    )
    env = {**os.environ, "ATTEMPT": ATTEMPT, "DAMON_HP_RUN_DIR": str(tmp_path)}
    before = read_tree(ADMIN)
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["outcome"] == "refused", result
    assert result["exit_code"] == 2
    index, pid, ops = host_damon[0]
    assert f"kdamond {index} (pid {pid}, ops {ops})" in result["message"]
    assert "needs the vaddr operations set" in result["message"]
    assert read_tree(ADMIN) == before
    assert list(tmp_path.iterdir()) == []  # no ownership record left behind
