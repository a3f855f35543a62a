"""Ctrl-C in the middle of a run that holds everything at once (an agent with its kdamond, a
memory-limited cgroup, a zram swap device, a changed THP mode) leaves none of it behind and
keeps no half-finished result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from damon_hp.experiment.measure import kdamond_pids

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = str(Path(sys.executable).parent / "damon-hp")
CGROUP_PARENT = Path("/sys/fs/cgroup/damon-hp-experiment")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MARKER = "--cold 40M"  # only this test's workload has it


def _running_kdamonds() -> list[str]:
    # The pid file, not `state`: reading `state` fails with EBUSY while a kdamond starts.
    return sorted(kdamond_pids())


def _workloads() -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if MARKER in cmd and "hotcold" in cmd:
                pids.append(int(pid))
    return pids


def _in(cgroup: Path, pids: list[int]) -> bool:
    try:
        members = {int(x) for x in (cgroup / "cgroup.procs").read_text().split()}
    except OSError:
        return False
    return bool(members & set(pids))


def test_ctrl_c_during_an_agent_run_under_memory_pressure_leaves_nothing(tmp_path):
    exp = tmp_path / "interrupt.toml"
    exp.write_text(f"""
[experiment]
name = "interrupt"
arms = ["thp-never", "thp-always", "damon-hp"]
memory = ["sufficient", "insufficient"]
warmup = false
sample_interval_s = 0.5

[insufficient]
swap_size = "64M"

[[workloads]]
program = "hotcold"
label = "long"
args = ["--hot", "8M", "{MARKER.split()[0]}", "{MARKER.split()[1]}", "--seconds", "900"]
arms = ["damon-hp"]
memory = ["insufficient"]
""")
    out = tmp_path / "out"
    out.mkdir()
    # The limit normally comes from thp-always's measured peak; given here to start at once.
    (out / "limits.json").write_text(json.dumps({"long_t1": 32 << 20}))
    before = {"thp": THP.read_text(), "swaps": Path("/proc/swaps").read_text()}
    assert _running_kdamonds() == []

    proc = subprocess.Popen([DAMON_HP, "experiment", "run", str(exp), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cgroup = CGROUP_PARENT / "long_t1_damon-hp_insufficient_r0"
        deadline = time.monotonic() + 600
        while not (_running_kdamonds() and _workloads() and _in(cgroup, _workloads())):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the agent never got its workload going"
            time.sleep(0.2)
        # everything is in place at the moment of the interrupt
        assert (cgroup / "memory.max").read_text().strip() == str(32 << 20)
        assert Path("/proc/swaps").read_text() != before["swaps"]
        assert THP.read_text() != before["thp"] or "[madvise]" in before["thp"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert _workloads() == []
    assert _running_kdamonds() == []
    assert not CGROUP_PARENT.exists()
    assert Path("/proc/swaps").read_text() == before["swaps"]
    assert THP.read_text() == before["thp"]
    assert not list((out / "runs").glob("*.json"))
