"""The experiment runner on the host, with real processes and the host's own arms
(prctl THP-disable, process_madvise collapse): what it measures, that it never touches the
global THP mode or DAMON here, and that Ctrl-C leaves nothing behind and keeps finished runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from damon_hp.errors import EnvironmentProblem
from damon_hp.experiment import arms
from leftovers import kdamond_states, processes_mentioning

DAMON_HP = str(Path(sys.executable).parent / "damon-hp")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _experiment(tmp_path: Path, workloads: str, arms_: str = '"thp-never", "oracle"',
                reps: int = 1) -> Path:
    p = tmp_path / "exp.toml"
    p.write_text(f"""
[experiment]
name = "hosttest"
where = "host"
repetitions = {reps}
arms = [{arms_}]
sample_interval_s = 0.1
timeout_s = 120
warmup = false
{workloads}
""")
    return p


def _as_in_a_terminal() -> None:
    # Ctrl-C reaches a foreground program with SIGINT at its default. A suite started in the
    # background of a non-interactive shell (`make test &`) inherits SIGINT ignored, and the
    # runner, like any Python program, then keeps ignoring it: these tests timed out so.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run(args: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DAMON_HP, "experiment", "run", *args], capture_output=True,
                          text=True, timeout=600, check=False, **kw)


def _processes_with(marker: str) -> list[int]:
    return list(processes_mentioning(marker))


def test_never_gets_no_huge_pages_and_the_oracle_backs_exactly_the_hot_range(tmp_path):
    thp_before = THP.read_text()
    exp = _experiment(tmp_path, """
[[workloads]]
program = "hotcold"
args = ["--hot", "16M", "--cold", "32M", "--seconds", "1.5"]
""")
    out = tmp_path / "out"
    proc = _run([str(exp), "--out", str(out), "--json"])
    assert proc.returncode == 0, proc.stderr
    runs = {r["arm"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    never, oracle = runs["thp-never"], runs["oracle"]
    assert never["status"] == oracle["status"] == "ok"
    assert never["mechanism"].startswith("prctl(PR_SET_THP_DISABLE)")
    assert never["anon_huge_peak_bytes"] == 0
    assert never["hot_huge_fraction_final"] == 0
    assert oracle["hot_huge_fraction_final"] >= 0.9, oracle["notes"]
    # only the 16 MiB hot range was collapsed, not the 32 MiB cold one
    assert oracle["anon_huge_peak_bytes"] <= 16 << 20
    for r in (never, oracle):
        assert r["accounting"] == "wait4"
        assert r["minflt"] > (48 << 20) // 4096 * 0.9  # every page of both ranges touched once
        assert r["peak_rss_bytes"] >= 48 << 20
        assert r["ns_per_op"] > 0
        assert r["dtlb_load_misses"] is None  # no PMU here: null, never 0
    assert THP.read_text() == thp_before


def test_the_damos_arm_refuses_to_run_on_the_host(tmp_path):
    exp = _experiment(tmp_path, """
[[workloads]]
program = "hotcold"
args = ["--seconds", "1"]
""", arms_='"thp-never", "damos-ethp"')
    proc = _run([str(exp), "--out", str(tmp_path / "out")])
    assert proc.returncode == 2
    assert "damos-ethp needs a DAMON of its own" in proc.stderr
    assert not list((tmp_path / "out").glob("runs/*.json"))


def test_global_thp_mode_is_never_written_outside_the_vm(monkeypatch):
    monkeypatch.delenv("DAMON_HP_IN_VM", raising=False)
    before = THP.read_text()
    with pytest.raises(EnvironmentProblem, match="outside the test VM"):
        arms.set_global_thp("never")
    assert THP.read_text() == before


def test_ctrl_c_stops_cleanly_and_a_rerun_resumes(tmp_path):
    # Only this test's long workload has it: another clone's suite running beside this one
    # (seen: two fresh-clone runs at once) has a long workload of its own.
    seconds = f"600.{os.getpid()}"
    marker = f"--cold 12M --seconds {seconds}"
    exp = _experiment(tmp_path, f"""
[[workloads]]
program = "hotcold"
label = "short"
args = ["--hot", "4M", "--cold", "4M", "--seconds", "0.3"]

[[workloads]]
program = "hotcold"
label = "long"
args = ["--hot", "4M", "--cold", "12M", "--seconds", "{seconds}"]
""")
    out = tmp_path / "out"
    proc = subprocess.Popen([DAMON_HP, "experiment", "run", str(exp), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_in_a_terminal)
    try:
        deadline = time.monotonic() + 120
        while not _processes_with(marker):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the long workload never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert _processes_with(marker) == []
    finished = sorted(p.stem for p in (out / "runs").glob("*.json"))
    assert finished == ["short_t1_oracle_sufficient_r0", "short_t1_thp-never_sufficient_r0"]

    dry = _run([str(exp), "--out", str(out), "--dry-run", "--json"])
    summary = json.loads(dry.stdout)
    assert (summary["planned"], summary["finished"]) == (4, 2)
    assert "done  short_t1_thp-never_sufficient_r0" not in dry.stdout  # --json: summary only
    listing = _run([str(exp), "--out", str(out), "--dry-run"]).stdout
    assert "done  short_t1_thp-never_sufficient_r0" in listing
    assert "todo  long_t1_thp-never_sufficient_r0" in listing


@pytest.mark.parametrize("delay_s", [0.3, 0.6, 0.9, 1.2, 1.5])
def test_ctrl_c_at_any_moment_of_the_start_leaves_no_workload_behind(tmp_path, delay_s):
    """Ctrl-C while the runner starts up, starts a workload or hands it to the sampler:
    a fresh-clone run once left its workload running when the signal came inside Popen."""
    seconds = f"600.{os.getpid()}{int(delay_s * 10)}"
    exp = _experiment(tmp_path, f"""
[[workloads]]
program = "hotcold"
args = ["--hot", "4M", "--cold", "4M", "--seconds", "{seconds}"]
""")
    proc = subprocess.Popen([DAMON_HP, "experiment", "run", str(exp), "--out",
                             str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_in_a_terminal)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Before the runner's own handling is in place Python dies of the signal (-2): nothing
    # was started then.
    assert proc.returncode in (130, -signal.SIGINT), err
    deadline = time.monotonic() + 5  # a killed process group takes a moment to go
    while _processes_with(f"--seconds {seconds}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(f"--seconds {seconds}") == []


def test_damon_hp_and_thp_always_run_on_the_host_without_changing_anything_global(tmp_path):
    """damon-hp runs with the source that works here (passive beside the foreign kdamond) and
    the workload's own CPU time is counted; thp-always (the LD_PRELOAD shim) backs memory the
    program mmaps itself with huge pages; THP settings and DAMON sysfs stay as they were."""
    damon_state = kdamond_states()
    thp_before = THP.read_text()
    exp = _experiment(tmp_path, """
[[workloads]]
program = "hotcold"
args = ["--hot", "32M", "--cold", "32M", "--seconds", "3"]
""", arms_='"thp-never", "thp-always", "damon-hp"')
    out = tmp_path / "out"
    proc = _run([str(exp), "--out", str(out), "--json"])
    assert proc.returncode == 0, proc.stderr
    runs = {r["arm"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert {a: r["status"] for a, r in runs.items()} == dict.fromkeys(runs, "ok")
    always, hp = runs["thp-always"], runs["damon-hp"]
    assert always["mechanism"].startswith("LD_PRELOAD=libthp-always.so")
    assert always["anon_huge_peak_bytes"] >= 60 << 20  # both mmap'd 32 MiB regions
    assert "damon-hp run" in hp["mechanism"] and "source " in hp["mechanism"]
    assert hp["accounting"] == "agent's reaped child"
    assert hp["user_s"] > 0.2  # 3 s of reads: some CPU even on a host loaded 6-7 (2 cores)
    assert hp["agent_cpu_s"] is not None
    for r in runs.values():
        assert r["ops"] > 0 and r["steal_frac"] is not None
    assert THP.read_text() == thp_before
    assert kdamond_states() == damon_state
