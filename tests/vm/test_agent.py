"""The agent end to end on a real DAMON (inside the test VM, system THP mode `never`).

Ground truth comes from workloads/bin/hotcold, which prints its hot and cold ranges; the huge-page
state is read back from /proc/PID/smaps, never from the agent's own report.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from damon_hp import procfs, status_records
from damon_hp.ranges import AddrRange
from leftovers import kdamond_threads, running_kdamonds

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = str(ROOT / ".venv/bin/damon-hp")
# Until an agent's kdamond runs: its Python start-up alone (imports, numpy's the largest) took
# ~40 s in the VM on 2026-11-27's slowed host with one other VM beside it, and past 117 s with
# three (faulthandler's stacks, a by-hand run of the SIGKILL test below).
AGENT_START_S = 240
HOTCOLD = str(ROOT / "workloads/bin/hotcold")
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
KDAMONDS = Path("/sys/kernel/mm/damon/admin/kdamonds")
# Behaviour, not speed: the hot set must become huge while the workload runs (stopped once it
# is), the cold set must not. How fast is a benchmark's question (README); under emulation on a
# loaded 2-core host an agent that made it in 16 s alone took over 20 s (a fresh-clone CI run,
# 2026-11-23), and attach once missed 45 s beside four other sessions' VMs (load 6-12), and
# missed 90 s by one sample (89.8 % at 89.7 s; its first collapse came at 32 s) beside another
# fresh-clone suite and a host experiment (2026-11-25). The workload runs well past the deadline.
DEADLINE_S = 200.0
HOT_SHARE = 0.90
COLD_SHARE = 0.02


@pytest.fixture(autouse=True)
def thp_never() -> Iterator[None]:
    """THP `never` for the test, restored afterwards (a test may switch to another mode; the
    original is restored all the same). Only ever inside the VM: never the host's setting."""
    old = procfs.thp_mode()
    THP_ENABLED.write_text("never")
    yield
    THP_ENABLED.write_text(old)


@pytest.fixture(autouse=True)
def no_kdamond_left() -> Iterator[None]:
    assert running_kdamonds() == {}, "a kdamond was running before the test"
    yield
    assert running_kdamonds() == {}, "the test left a kdamond running"


@dataclass
class Ranges:
    pid: int
    hot: tuple[int, int]
    cold: tuple[int, int]

    @classmethod
    def from_line(cls, line: str) -> Ranges:
        d = json.loads(line)
        return cls(d["pid"], (d["hot"]["start"], d["hot"]["end"]),
                   (d["cold"]["start"], d["cold"]["end"]))

    def huge_shares(self) -> tuple[float, float]:
        """Shares of the hot and cold bytes that smaps shows as AnonHugePages."""
        maps = procfs.read_smaps(self.pid)
        hot = procfs.smaps_in_ranges(maps, [AddrRange(*self.hot)]).anon_huge_bytes
        cold = procfs.smaps_in_ranges(maps, [AddrRange(*self.cold)]).anon_huge_bytes
        return hot / (self.hot[1] - self.hot[0]), cold / (self.cold[1] - self.cold[0])


def hotcold(hot: str = "256M", cold: str = "1G", seconds: int = 260) -> list[str]:
    return [HOTCOLD, "--hot", hot, "--cold", cold, "--seconds", str(seconds)]


Samples = list[tuple[float, float, float]]


def watch_until_hot(r: Ranges, since: float) -> tuple[float | None, Samples]:
    """Poll smaps until the hot share reaches HOT_SHARE or the deadline passes.

    Returns (seconds from `since` to HOT_SHARE or None, samples of (t, hot, cold)).
    """
    samples = []
    while True:
        # smaps is read after the clock: a reading that ends past the deadline is too late.
        hot, cold = r.huge_shares()
        t = time.monotonic() - since
        if t > DEADLINE_S:
            return None, samples
        samples.append((round(t, 2), round(hot, 4), round(cold, 4)))
        if hot >= HOT_SHARE:
            return t, samples
        time.sleep(0.5)


def check_timeline(report_path: Path, r: Ranges, ready_at: float) -> None:
    """The agent's JSON timeline tells the same story as smaps."""
    d = json.loads(report_path.read_text())
    timeline = d["timeline"]
    assert timeline, "empty timeline"
    hot_size = r.hot[1] - r.hot[0]
    cold_size = r.cold[1] - r.cold[0]
    in_time = [e for e in timeline if e["monotonic_s"] <= ready_at + DEADLINE_S]
    assert any((e["huge_bytes"] or 0) >= HOT_SHARE * hot_size for e in in_time), (
        "timeline never shows the hot set huge within the deadline: "
        f"{[(e['t_s'], e['huge_bytes']) for e in timeline]}")
    # All huge memory the agent ever made fits in the hot range plus the cold allowance.
    assert max(e["huge_bytes"] or 0 for e in timeline) <= hot_size + COLD_SHARE * cold_size
    s = d["summary"]
    assert s["promotions"] >= HOT_SHARE * hot_size // (2 << 20)
    assert s["final_anon_huge_bytes"] >= HOT_SHARE * hot_size
    assert s["snapshots"] == len(timeline)
    assert sum(e["actions"]["collapse"]["ok"] for e in timeline) == s["promotions"]


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> tuple[str, str]:
    if proc.poll() is None:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return out, err


@pytest.mark.both_kernels
def test_run_backs_the_hot_buffer_with_huge_pages_and_leaves_the_cold_one(tmp_path) -> None:
    out = tmp_path / "out.json"
    proc = subprocess.Popen([DAMON_HP, "run", "-q", "--json", str(out), "--", *hotcold()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        r = Ranges.from_line(proc.stdout.readline())  # hotcold's line, passed through
        ready_at = time.monotonic()
        took, samples = watch_until_hot(r, ready_at)
        hot, cold = r.huge_shares()
    finally:
        _, err = stop(proc)
    print(f"time to {HOT_SHARE:.0%} of the hot set huge: {took} s; samples {samples}")
    assert took is not None, f"hot set not huge within {DEADLINE_S} s: {samples}\n{err}"
    assert cold <= COLD_SHARE, f"{cold:.1%} of the cold bytes are huge"
    assert max(c for _, _, c in samples) <= COLD_SHARE
    assert proc.returncode == 0, err  # hotcold exits 0 on SIGTERM, passed through
    assert "damon-hp summary" in err
    check_timeline(out, r, ready_at)


def test_attach_backs_the_hot_buffer_with_huge_pages_and_leaves_the_cold_one(tmp_path) -> None:
    out = tmp_path / "out.json"
    target = subprocess.Popen(hotcold(), stdout=subprocess.PIPE, text=True)
    agent = None
    try:
        r = Ranges.from_line(target.stdout.readline())
        started_at = time.monotonic()
        agent = subprocess.Popen([DAMON_HP, "attach", "-q", "--json", str(out), str(r.pid)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        took, samples = watch_until_hot(r, started_at)
        hot, cold = r.huge_shares()
        _, err = stop(agent, signal.SIGINT)
        assert target.poll() is None, "attach must leave its target running"
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
        target.kill()
        target.wait()
    print(f"attach: time to {HOT_SHARE:.0%} of the hot set huge: {took} s; samples {samples}")
    assert took is not None, f"hot set not huge within {DEADLINE_S} s: {samples}\n{err}"
    assert cold <= COLD_SHARE
    assert agent.returncode == 0, err
    assert "stopped by                SIGINT" in err
    check_timeline(out, r, started_at)


def test_run_passes_the_commands_exit_code_through() -> None:
    r = subprocess.run([DAMON_HP, "run", "-q", "--", "sh", "-c", "exit 7"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 7, r.stderr
    assert "exit code 7" in r.stderr


@pytest.mark.parametrize("launcher", [[], ["env", "DAMON_HP_TEST=1"]], ids=["direct", "env"])
def test_run_monitors_the_command_itself_from_its_start(tmp_path, launcher: list[str]) -> None:
    # With a launcher the program is a second exec in the same process: still the target.
    out, rec = tmp_path / "out.json", tmp_path / "rec.json"
    proc = subprocess.Popen([DAMON_HP, "run", "-q", "--json", str(out), "--record", str(rec),
                             "--", *launcher, *hotcold("16M", "16M", 0)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranges = None
    try:
        ranges = Ranges.from_line(proc.stdout.readline())
        # The kdamond starts on the forked child before its exec, so its first regions are the
        # old address space's; DAMON re-reads the target's mappings only at its next ops update
        # (update_us, damon_va_update). A fixed 5-s command ended in stop 42's CI before the
        # agent saw one aggregation after that. The agent finding the 16 MiB hot buffer hot
        # needs the new regions: end the command then (hotcold exits 0 on SIGTERM).
        found = wait_for_status(proc, lambda st: (st.get("hot_bytes") or 0) >= 16 << 20)
        last_status = status_seen(proc)
        os.kill(ranges.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            stop(proc, signal.SIGTERM)
        if ranges is not None and runs_hotcold(ranges.pid):
            # `--seconds 0` runs until stopped: a failure above must not leave it running. The
            # name is checked first: once the agent has reaped it, its pid may be another's.
            with contextlib.suppress(ProcessLookupError):
                os.kill(ranges.pid, signal.SIGKILL)
    assert found is not None, f"the agent never found the hot buffer: {last_status}\n{err}"
    assert proc.returncode == 0, err
    report = json.loads(out.read_text())
    assert report["summary"]["target_pid"] == ranges.pid
    assert report["summary"]["stopped_by"] == "target exit"
    # The agent's /proc readings followed the exec: the program's 32 MiB are in its RSS.
    assert report["summary"]["peak_rss_bytes"] >= 32 << 20
    snaps = json.loads(rec.read_text())["snapshots"]
    assert snaps and all(s["pid"] == ranges.pid for s in snaps)
    last = [s for s in snaps if s["regions"]][-1]["regions"]
    for lo, hi in (ranges.hot, ranges.cold):
        covered = sum(max(0, min(g["end"], hi) - max(g["start"], lo)) for g in last)
        assert covered == hi - lo, "DAMON's regions do not cover the command's buffers"


def runs_hotcold(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "hotcold"
    except OSError:
        return False


def status_seen(proc: subprocess.Popen) -> dict | None:
    """The status record agent `proc` keeps (refreshed every STATUS_EVERY_S), or None."""
    return next((st for st in status_records.read_statuses()
                 if st.get("agent_pid") == proc.pid), None)


def wait_for_status(proc: subprocess.Popen, ok, timeout_s: float = AGENT_START_S) -> dict | None:
    """The agent's status record once ok(record) holds; None when the agent exits or the time
    runs out first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        st = status_seen(proc)
        if st is not None and ok(st):
            return st
        time.sleep(0.5)
    return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_signal_ends_agent_and_command_and_leaves_no_kdamond(sig: int) -> None:
    proc = subprocess.Popen([DAMON_HP, "run", "-q", "--", *hotcold("16M", "16M", 300)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    r = Ranges.from_line(proc.stdout.readline())
    deadline = time.monotonic() + AGENT_START_S
    while not running_kdamonds() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(running_kdamonds()) == 1
    status = subprocess.run([DAMON_HP, "status", "--json"], capture_output=True, text=True,
                            timeout=120)
    agents = json.loads(status.stdout)["agents"]
    assert [(a["target_pid"], a["alive"]) for a in agents] == [(r.pid, True)]
    _, err = stop(proc, sig)  # to the agent alone, as `kill` would: the command must follow
    assert not Path(f"/proc/{r.pid}").exists(), "the command outlived the agent"
    assert f"stopped by                {signal.Signals(sig).name}" in err
    assert running_kdamonds() == {} and kdamond_threads() == []
    status = subprocess.run([DAMON_HP, "status", "--json"], capture_output=True, text=True,
                            timeout=120)
    assert json.loads(status.stdout)["agents"] == []


@pytest.mark.both_kernels
def test_agent_killed_with_sigkill_is_cleaned_up_by_the_next_start(tmp_path) -> None:
    target = subprocess.Popen(hotcold("16M", "16M", 600), stdout=subprocess.PIPE, text=True)
    try:
        r = Ranges.from_line(target.stdout.readline())
        first = subprocess.Popen([DAMON_HP, "attach", "-q", str(r.pid)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + AGENT_START_S
        while not running_kdamonds() and time.monotonic() < deadline:
            time.sleep(0.2)
        left_behind = running_kdamonds()
        assert len(left_behind) == 1
        first.kill()  # SIGKILL: no cleanup can run
        first.wait()
        assert running_kdamonds() == left_behind, "the stale kdamond should still run"

        second = subprocess.Popen([DAMON_HP, "attach", "-q", str(r.pid)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started = time.monotonic()
        seen = []  # (s after the start, running kdamonds) at each change: the failure says
        while time.monotonic() - started < AGENT_START_S and second.poll() is None:
            now = running_kdamonds()
            if not seen or seen[-1][1] != now:
                seen.append((round(time.monotonic() - started, 1), now))
            if now and now != left_behind:
                break
            time.sleep(0.2)
        if not (len(running_kdamonds()) == 1 and running_kdamonds() != left_behind):
            _, err = stop(second, signal.SIGTERM)
            pytest.fail(f"no new kdamond of the second agent; kdamonds seen (s, pids): {seen}; "
                        f"the stale one {left_behind}; second agent exit {second.returncode}, "
                        f"stderr:\n{err}")
        assert len(kdamond_threads()) == 1
        status = subprocess.run([DAMON_HP, "status", "--json"], capture_output=True, text=True,
                                timeout=120)
        agents = json.loads(status.stdout)["agents"]
        assert [(a["agent_pid"], a["alive"]) for a in agents] == [(second.pid, True)]
        _, err = stop(second, signal.SIGTERM)
        assert second.returncode == 0, err
        assert running_kdamonds() == {} and kdamond_threads() == []
        assert target.poll() is None
    finally:
        target.kill()
        target.wait()


class ForeignKdamond:
    """A kdamond started by raw sysfs writes, as another tool would (inside the VM only)."""

    def __init__(self) -> None:
        self.sleeper = subprocess.Popen(["sleep", "600"])
        (KDAMONDS / "nr_kdamonds").write_text("1")
        self.dir = KDAMONDS / "0"
        ctx = self.dir / "contexts"
        (ctx / "nr_contexts").write_text("1")
        (ctx / "0/operations").write_text("vaddr")
        (ctx / "0/monitoring_attrs/intervals/sample_us").write_text("7000")
        (ctx / "0/targets/nr_targets").write_text("1")
        (ctx / "0/targets/0/pid_target").write_text(str(self.sleeper.pid))
        (self.dir / "state").write_text("on")

    def snapshot(self) -> dict[str, str]:
        """Everything about it that damon-hp must not change."""
        ctx = self.dir / "contexts/0"
        return {
            "state": (self.dir / "state").read_text().strip(),
            "pid": (self.dir / "pid").read_text().strip(),
            "nr_kdamonds": (KDAMONDS / "nr_kdamonds").read_text().strip(),
            "ops": (ctx / "operations").read_text().strip(),
            "sample_us": (ctx / "monitoring_attrs/intervals/sample_us").read_text().strip(),
            "target": (ctx / "targets/0/pid_target").read_text().strip(),
            "nr_schemes": (ctx / "schemes/nr_schemes").read_text().strip(),
        }

    def remove(self) -> None:
        (self.dir / "state").write_text("off")
        deadline = time.monotonic() + 30
        while (self.dir / "state").read_text().strip() != "off" and time.monotonic() < deadline:
            time.sleep(0.1)
        (KDAMONDS / "nr_kdamonds").write_text("0")
        self.sleeper.kill()
        self.sleeper.wait()


def test_busy_damon_is_reported_and_the_foreign_kdamond_is_left_untouched() -> None:
    foreign = ForeignKdamond()
    try:
        before = foreign.snapshot()
        assert before["state"] == "on"
        run = subprocess.run([DAMON_HP, "run", "--", "true"], capture_output=True, text=True,
                             timeout=300)
        # killed below; long enough to outlive a slow attach (a `sleep 60` had exited before
        # attach looked at it on a loaded host, 2026-11-25: "process ... has already exited")
        victim = subprocess.Popen(["sleep", "3600"])
        attach = subprocess.run([DAMON_HP, "attach", str(victim.pid)], capture_output=True,
                                text=True, timeout=300)
        victim.kill()
        victim.wait()
        after = foreign.snapshot()
    finally:
        foreign.remove()
    for r in (run, attach):
        assert r.returncode == 2, r.stderr
        assert "busy" in r.stderr and f"kdamond 0 (pid {before['pid']}" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert after == before
