"""hpstat (bpf/) on this host's real kernel: real tracepoints, real faults, real collapses.

Per-process only: children map their own memory and the test collapses it with
process_madvise(MADV_COLLAPSE); no global THP or DAMON setting is touched.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from damon_hp.errors import EnvironmentProblem
from damon_hp.hpstat import HpStat, format_table, parse_output
from hpstat_child import Child, build_hpstat

ROOT = Path(__file__).resolve().parents[2]
HPSTAT = ROOT / "bpf" / ".output" / "hpstat"
HUGE = 2 << 20
MADV_COLLAPSE = 25
SYS_PROCESS_MADVISE = 440  # x86_64


@pytest.fixture(scope="session", autouse=True)
def built_hpstat() -> str:
    return build_hpstat()


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child()
    yield c
    c.stop()


@pytest.fixture
def other_child() -> Iterator[Child]:
    c = Child()
    yield c
    c.stop()


def process_madvise(pid: int, start: int, length: int, advice: int) -> int:
    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pidfd = os.pidfd_open(pid)
    try:
        iov = IoVec(start, length)
        done = libc.syscall(SYS_PROCESS_MADVISE, pidfd, ctypes.byref(iov), 1, advice, 0)
        if done < 0:
            raise OSError(ctypes.get_errno(), "process_madvise")
        return done
    finally:
        os.close(pidfd)


def anon_huge_kib(pid: int, start: int, end: int) -> int:
    """AnonHugePages of the mappings inside [start, end), from /proc/PID/smaps."""
    total, inside = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < end and hi > start
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1])
    return total


def test_counts_each_fresh_page_fault_of_the_traced_process_and_its_threads(
        child: Child, other_child: Child) -> None:
    pages = 20000
    with HpStat.start(pid=child.pid, interval_s=0.5) as traced, \
            HpStat.start(pid=None, interval_s=0.5) as everyone:
        # the untraced process faults three times as much at the same time
        other_child.proc.stdin.write(f"touch {3 * pages} 0\n")
        other_child.proc.stdin.flush()
        assert child.ask(f"touch {pages} 2") == {"touched": pages}
        assert other_child.ask_raw() == {"touched": 3 * pages}
        total = traced.stop().total
        system = everyone.stop().total
    assert total.pid == child.pid
    assert abs(total.page_faults_user - pages) <= 0.05 * pages, total.page_faults_user
    # the other process's faults were real and visible system-wide, yet not counted for child
    assert system.page_faults_user >= 4 * pages


def test_pid_filter_leaves_out_other_processes_madvise_and_faults(
        child: Child, other_child: Child) -> None:
    with HpStat.start(pid=child.pid, interval_s=0.5) as traced, \
            HpStat.start(pid=other_child.pid, interval_s=0.5) as busy:
        assert other_child.ask("madvise 50") == {"madvised": 50}
        assert other_child.ask("touch 5000 0") == {"touched": 5000}
        assert child.ask("madvise 3") == {"madvised": 3}
        idle_total = traced.stop().total
        busy_total = busy.stop().total
    assert busy_total.madvise.get("MADV_COLD") == 50
    assert busy_total.page_faults_user >= 5000
    assert idle_total.madvise == {"MADV_COLD": 3}
    assert idle_total.page_faults_user < 0.05 * 5000


def test_sees_process_madvise_collapses_of_the_child_with_their_status(child: Child) -> None:
    areas = 4
    with HpStat.start(pid=child.pid, interval_s=0.5) as trace:
        span = child.ask(f"huge {areas}")
        start, end = span["start"], span["end"]
        assert anon_huge_kib(child.pid, start, end) == 0
        # this test process does the collapsing: the work is charged here, not to the child
        assert process_madvise(child.pid, start, end - start, MADV_COLLAPSE) == end - start
        huge_after_first = anon_huge_kib(child.pid, start, end) * 1024 // HUGE
        # again: every area is now PMD-mapped, which the scans report as such
        assert process_madvise(child.pid, start, end - start, MADV_COLLAPSE) == end - start
        summary = trace.stop()
    got = summary.total.madv_collapse
    assert huge_after_first >= 1
    assert got.collapse.get("succeeded") == huge_after_first
    assert got.collapsed == huge_after_first
    assert got.scan_pmd.get("succeeded") == huge_after_first
    assert got.already_huge == huge_after_first
    assert got.collapse_failed == {}
    assert summary.total.process_madvise == {"MADV_COLLAPSE": 2}
    # intervals add up to the summary
    assert sum(r.madv_collapse.collapsed for r in summary.intervals) == huge_after_first
    assert f"succeeded {huge_after_first}" in format_table(summary.total)
    headline = summary.total.headline()
    assert headline["collapsed"] == {"khugepaged": 0, "madv_collapse": huge_after_first}
    assert headline["collapse_failed"] == {}


def test_ends_with_a_summary_when_the_traced_process_exits(child: Child) -> None:
    trace = HpStat.start(pid=child.pid, interval_s=0.5)
    child.ask("touch 1000 0")
    child.stop()
    summary = trace.wait(timeout_s=30)
    assert summary.total.target_exited
    assert summary.total.page_faults_user >= 1000
    assert "exceptions/page_fault_user" in summary.attached


def test_json_lines_of_the_binary_add_up_and_parse(child: Child) -> None:
    proc = subprocess.Popen([str(HPSTAT), "-p", str(child.pid), "-i", "0.2", "-d", "1.5"],
                            stdout=subprocess.PIPE, text=True)
    assert json.loads(proc.stdout.readline())["type"] == "start"
    child.ask("touch 3000 1")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    lines = out.splitlines()
    kinds = [json.loads(line)["type"] for line in lines]
    assert kinds[-1] == "summary" and set(kinds[:-1]) == {"interval"}
    summary = parse_output(lines)
    assert summary.total.page_faults_user == sum(r.page_faults_user for r in summary.intervals)
    assert summary.total.page_faults_user >= 3000


def test_without_bpf_privilege_it_says_why_and_exits_2() -> None:
    nobody = 65534
    # The clone may sit below a mode-0700 folder (a home, a mktemp -d) that the unprivileged
    # user cannot traverse: run a copy from a folder it can reach, so the test is about BPF
    # privilege and not about path permissions.
    reachable = Path(tempfile.mkdtemp(prefix="hpstat-nobody-", dir="/tmp"))
    try:
        reachable.chmod(0o755)
        binary = reachable / "hpstat"
        shutil.copy2(HPSTAT, binary)
        binary.chmod(0o755)
        done = subprocess.run([str(binary), "-d", "1"], user=nobody, group=nobody,
                              extra_groups=[], capture_output=True, text=True, timeout=60,
                              check=False, cwd="/")
    finally:
        shutil.rmtree(reachable, ignore_errors=True)
    assert done.returncode == 2
    assert "BPF is not permitted" in done.stderr
    assert "root" in done.stderr
    assert done.stdout == ""


def test_missing_pid_is_an_environment_problem() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(EnvironmentProblem, match=f"no process with PID {gone.pid}"):
        HpStat.start(pid=gone.pid)


def test_damon_hp_trace_prints_json_intervals_then_summary(child: Child) -> None:
    cli = ROOT / ".venv" / "bin" / "damon-hp"
    proc = subprocess.Popen([str(cli), "trace", "--pid", str(child.pid), "--json",
                             "--interval", "0.3", "--duration", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the CLI prints nothing before hpstat is attached; give it the first interval
    first = proc.stdout.readline()
    child.ask("touch 2000 0")
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in [first, *rest.splitlines()]]
    assert records[-1]["type"] == "summary"
    assert records[-1]["pid"] == child.pid
    assert records[-1]["page_faults_user"] >= 2000


def test_collapses_of_a_child_that_never_runs_are_attributed_through_the_pidfd(
        child: Child) -> None:
    # populated before tracing starts; the child then sleeps in read() for the whole trace,
    # so hpstat can only learn its mm from the pidfd that process_madvise names
    span = child.ask("huge 2")
    start, end = span["start"], span["end"]
    with HpStat.start(pid=child.pid, interval_s=0.5) as trace:
        assert process_madvise(child.pid, start, end - start, MADV_COLLAPSE) == end - start
        huge = anon_huge_kib(child.pid, start, end) * 1024 // HUGE
        total = trace.stop().total
    assert huge >= 1
    assert total.page_faults_user == 0
    assert total.madv_collapse.collapsed == huge
    assert total.process_madvise == {"MADV_COLLAPSE": 1}
