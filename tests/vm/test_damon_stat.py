"""damon-hp out of the box where DAMON_STAT runs (vm tier, the main kernel as booted: Debian's
7.3 with DAMON_STAT monitoring from boot; system THP mode `never` for the test).

DAMON_STAT's kdamond is not in DAMON sysfs (`nr_kdamonds` 0) and its context is exclusive: no
kdamond of damon-hp's can start beside it. With no option, `damon-hp run` must find it, read its
damon_aggregated events passively (following the intervals DAMON_STAT tunes), promote the hot
buffer, and of the cold one only ranges DAMON_STAT showed busy, and write nothing under
/sys/kernel/mm/damon or /sys/module (both read-only around the agent). `doctor` must say why
damon-hp's own kdamonds cannot start (the module's exclusive context, not a lock) and that the
passive source reads DAMON_STAT; asking for vaddr must fail at once naming DAMON_STAT, not
after a 10 s wait on a "lock".

Ground truth: hotcold's printed ranges, /proc/PID/smaps and pagemap; DAMON_STAT's own
parameters; what the source showed, from the agent's `--record`.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from damon_hp import procfs
from damon_hp.damon import ownership, probe
from damon_hp.damon.events import INSTANCE_PREFIX
from damon_hp.damon.modules import module_kdamonds
from damon_hp.pipeline import PHYSICAL_MIN_ACCESS_PCT

# The physical-source harness of test_sources.py (its deadline; hotcold's sizes below).
from test_sources import DEADLINE_S, never_shown_busy, recording_of, run_until_hot

# Half the hot buffer through DAMON_STAT's events: what this test was measured at on 7.3
# (2026-11-25); the 90 % test_sources asks of paddr and passive is not measured for DAMON_STAT.
PHYSICAL_HOT_SHARE = 0.5

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = str(ROOT / ".venv/bin/damon-hp")
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
STAT_PARAMS = Path("/sys/module/damon_stat/parameters")
INSTANCES = Path("/sys/kernel/tracing/instances")

pytestmark = pytest.mark.damon_stat_on

# The agent runs in a private mount namespace where DAMON sysfs and every module's parameters
# are read-only: any write there fails (EROFS) and shows as an error; outside stays untouched.
READ_ONLY_DAMON_AND_MODULES = [
    "unshare", "--mount", "--propagation", "private", "sh", "-c",
    "mount --bind /sys/kernel/mm/damon /sys/kernel/mm/damon && "
    "mount -o remount,bind,ro /sys/kernel/mm/damon && "
    "mount --bind /sys/module /sys/module && mount -o remount,bind,ro /sys/module && "
    'exec "$@"', "sh"]


def stat_state() -> tuple[str, int]:
    return ((STAT_PARAMS / "enabled").read_text().strip(),
            int((STAT_PARAMS / "kdamond_pid").read_text()))


@pytest.fixture(autouse=True)
def thp_never() -> Iterator[None]:
    """THP `never` for the test (every huge page is the agent's), restored after."""
    old = procfs.thp_mode()
    THP_ENABLED.write_text("never")
    yield
    THP_ENABLED.write_text(old)


@pytest.fixture(autouse=True)
def damon_stat_untouched(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """DAMON_STAT runs before and after (the same kdamond, unless the test paused it on
    purpose: then a new one); no sysfs kdamond, no tracefs instance, no record of ours left.
    A test marked `fresh_damon_stat` gets DAMON_STAT restarted first (the new kdamond is the
    one that must be untouched)."""
    if request.node.get_closest_marker("fresh_damon_stat"):
        restart_damon_stat()
    before = stat_state()
    assert before[0] == "Y" and before[1] > 0, f"DAMON_STAT is not running: {before}"
    assert probe().kdamonds == (), "DAMON sysfs has a kdamond dir beside DAMON_STAT"
    yield before
    after = stat_state()
    if "pause" in request.node.name:
        assert after[0] == "Y" and after[1] > 0, f"DAMON_STAT was not turned back on: {after}"
        assert [m.pid for m in module_kdamonds()] == [after[1]], "DAMON_STAT's kdamond is gone"
    else:
        assert after == before, "DAMON_STAT was changed"
    assert probe().kdamonds == ()
    assert [n for n in os.listdir(INSTANCES) if n.startswith(INSTANCE_PREFIX)] == []
    assert ownership.read_records() == {}


def _wait_for(cond, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def restart_damon_stat() -> None:
    """DAMON_STAT off and on again (VM only): a new kdamond at the module's boot intervals."""
    (STAT_PARAMS / "enabled").write_text("N")
    assert _wait_for(lambda: stat_state()[0] == "N" and not module_kdamonds(), 60), \
        f"DAMON_STAT did not stop: {stat_state()}"
    (STAT_PARAMS / "enabled").write_text("Y")
    assert _wait_for(lambda: stat_state()[0] == "Y" and stat_state()[1] > 0
                     and len(module_kdamonds()) == 1, 60), \
        f"DAMON_STAT did not start again: {stat_state()}"


def test_damon_stat_is_found_outside_sysfs_with_its_intervals(damon_stat_untouched) -> None:
    [m] = module_kdamonds()
    assert (m.label, m.pid, m.ops, m.autotuned) == ("DAMON_STAT", damon_stat_untouched[1],
                                                     "paddr", True)
    assert m.sample_us and m.aggr_us == m.sample_us * 20
    st = probe()
    # The same kdamond, told by what does not change: DAMON_STAT retunes its intervals while
    # it runs, and a fresh clone's run (fc17, 2026-11-29) read them doubled (628 -> 1,257 ms)
    # between the two reads above.
    assert [(k.module, k.pid, k.ops, k.autotuned) for k in st.exclusive] == [
        (m.module, m.pid, m.ops, m.autotuned)], st.exclusive
    assert st.running == ()


def test_doctor_names_damon_stat_as_why_no_kdamond_starts_and_reads_it_passively() -> None:
    r = subprocess.run([DAMON_HP, "doctor", "--json"], capture_output=True, text=True,
                       timeout=300)
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    new = checks["new kdamond"]
    assert new["status"] == "LIMITED"
    assert "DAMON_STAT" in new["detail"] and "exclusive" in new["detail"], new
    assert "lock" not in new["detail"].replace("not a lock", ""), new
    for ops in ("vaddr", "paddr"):
        assert "DAMON_STAT" in checks[f"source {ops}"]["detail"], checks[f"source {ops}"]
    passive = checks["source passive"]
    assert passive["status"] == "OK" and "DAMON_STAT" in passive["detail"], passive
    assert checks["source"]["detail"] == "--source auto takes passive"


def test_asking_for_vaddr_fails_at_once_naming_damon_stat() -> None:
    t0 = time.monotonic()
    r = subprocess.run([*READ_ONLY_DAMON_AND_MODULES, DAMON_HP, "run", "--source", "vaddr",
                        "--", "true"], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    assert "DAMON_STAT" in r.stderr and "exclusive" in r.stderr, r.stderr
    assert "EBUSY) for 10 s" not in r.stderr, r.stderr
    print(f"refused after {took:.1f} s")


# DAMON_STAT lengthens its intervals while under 4 % of what it samples reads accessed
# (docs/sources.md, "DAMON_STAT's intervals and a small hot set", has the measurements): a
# 64 MiB hot buffer, ~1 % of the tier's 6 GiB guest, let its aggregations grow until the
# 240-s bound passed in stop 37's CI, and the test measured how fast the guest ran before it,
# not damon-hp. 512 MiB (~9 %) keeps them steady; 256 MiB (4.4 %) is too close to the goal.
# Restarted first, DAMON_STAT starts at its boot intervals: the state of a machine that
# booted with it, which is where a user starts damon-hp.
STAT_HOT, STAT_COLD = "512M", "256M"


@pytest.mark.fresh_damon_stat
def test_run_with_no_option_promotes_the_hot_buffer_through_damon_stats_events(
        tmp_path, damon_stat_untouched) -> None:
    out = tmp_path / "out.json"
    hc, took, samples, err, code = run_until_hot([], out, wrap=READ_ONLY_DAMON_AND_MODULES,
                                                 share=PHYSICAL_HOT_SHARE, hot=STAT_HOT,
                                                 cold=STAT_COLD)
    print(f"DAMON_STAT passive ({STAT_HOT}/{STAT_COLD}): {PHYSICAL_HOT_SHARE:.0%} of the hot "
          f"buffer huge after {took} s; samples {samples}")
    print(err[err.find("damon-hp summary"):])
    assert took is not None, (
        f"hot buffer not {PHYSICAL_HOT_SHARE:.0%} huge within {DEADLINE_S} s: {samples}\n{err}")
    # The cold side: damon-hp promotes only what its source shows busy. DAMON_STAT's physical
    # regions, restarted and adapting, often hold cold frames beside hot ones and show part of
    # the cold buffer busy, and that part is promoted: the agent's hot set read 454-730 MiB
    # for the 512 MiB hot buffer in eight runs on 2026-12-02, and in fresh clone fc23 the cold
    # buffer was 89 % huge when the hot one reached 62 % (an earlier form of this test failed
    # there for it). In the seven runs after it, every cold range promoted had been shown busy.
    # How much of the cold buffer is promoted is DAMON_STAT's resolution (printed); a cold
    # range promoted that no snapshot showed busy is damon-hp's fault.
    _, hot_then, cold_then = samples[-2]
    unfounded = never_shown_busy(recording_of(out), hc.cold_huge)
    print(f"cold buffer {cold_then:.1%} huge when the hot one was {hot_then:.1%}; cold 2 MiB "
          f"ranges huge at the end: {len(hc.cold_huge)}, of them never shown at "
          f"{PHYSICAL_MIN_ACCESS_PCT:.0f} %: {len(unfounded)}")
    assert not unfounded, (f"{len(unfounded)} cold ranges promoted that DAMON_STAT never "
                           f"showed busy: {[hex(w) for w in unfounded[:8]]}: {samples}")
    assert code == 0, err  # no EROFS: nothing was written under DAMON sysfs or /sys/module
    s = json.loads(out.read_text())["summary"]
    src = s["source"]
    assert src["name"] == "passive" and src["kdamond_pid"] == damon_stat_untouched[1], src
    assert "DAMON_STAT" in src["kdamond"], src
    assert src["reason"].startswith("auto: ") and "DAMON_STAT" in src["reason"], src
    assert s["kdamond_cpu_s"] is None, "DAMON_STAT's CPU is the kernel's, not damon-hp's"
    assert s["snapshots"] > 0 and hc.pid > 0


# --------------------------------------------------------------------------------------------
# --pause-damon-stat: the user's explicit choice of damon-hp's own kdamond


def test_pause_damon_stat_runs_vaddr_and_turns_damon_stat_back_on_at_sigterm(tmp_path) -> None:
    out = tmp_path / "out.json"
    proc = subprocess.Popen([DAMON_HP, "run", "-q", "--pause-damon-stat", "--json", str(out),
                             "--", "workloads/bin/hotcold", "--hot", "16M", "--cold", "16M",
                             "--seconds", "300"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline(), "hotcold did not start"
        assert _wait_for(lambda: stat_state()[0] == "N"), "DAMON_STAT was not paused"
        st = json.loads(subprocess.run([DAMON_HP, "status", "--json"], capture_output=True,
                                       text=True, timeout=120).stdout)
        assert [(p["module"], p["agent_pid"], p["agent_alive"]) for p in st["paused_modules"]] \
            == [("damon_stat", proc.pid, True)]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    s = json.loads(out.read_text())["summary"]["source"]
    assert s["name"] == "vaddr" and s["paused_module"] == "damon_stat", s
    assert stat_state()[0] == "Y"  # and the fixture checks it is a running kdamond again


def _ebusy_share(path: Path, seconds: float) -> float:
    """Share of plain reads of `path` (no retry) that DAMON sysfs answered with EBUSY."""
    busy = total = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        total += 1
        try:
            path.read_text()
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            busy += 1
        time.sleep(0.05)
    return busy / total


def test_paused_agent_reads_events_and_leaves_damon_sysfs_to_other_readers(tmp_path) -> None:
    """7.3 holds damon_sysfs_lock while a tried-regions update waits for the kdamond; an
    agent reading snapshots that way back to back answered EBUSY to 98 % of other readers'
    reads of its kdamond's state (measured 2026-11-26). Reading its own kdamond's events,
    with the interval tuning followed, leaves DAMON sysfs free between its commands."""
    out = tmp_path / "out.json"
    proc = subprocess.Popen([DAMON_HP, "run", "-q", "--pause-damon-stat", "--json", str(out),
                             "--", "workloads/bin/hotcold", "--hot", "16M", "--cold", "16M",
                             "--seconds", "300"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    state = Path("/sys/kernel/mm/damon/admin/kdamonds/0/state")
    try:
        assert proc.stdout.readline(), "hotcold did not start"
        assert _wait_for(lambda: probe().running != ()), "damon-hp's kdamond did not start"
        time.sleep(2)  # past the start-up writes
        share = _ebusy_share(state, 10.0)
        assert share < 0.5, f"{share:.0%} of reads of {state} answered EBUSY"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    s = json.loads(out.read_text())["summary"]["source"]
    assert (s["name"], s["reader"]) == ("vaddr", "event stream"), s


def test_pause_left_by_a_sigkilled_agent_is_undone_by_the_next_start() -> None:
    target = subprocess.Popen(["sleep", "600"])
    agent = subprocess.Popen([DAMON_HP, "attach", "-q", "--pause-damon-stat", str(target.pid)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: stat_state()[0] == "N"), "DAMON_STAT was not paused"
        assert _wait_for(lambda: probe().running != ()), "damon-hp's kdamond did not start"
        agent.kill()  # SIGKILL: no clean-up can run
        agent.wait()
        assert stat_state()[0] == "N", "nothing but the next start may turn it back on"
        r = subprocess.run([DAMON_HP, "doctor"], capture_output=True, text=True, timeout=300)
        assert "DAMON_STAT paused" in r.stdout and "which is gone" in r.stdout, r.stdout
        r = subprocess.run([DAMON_HP, "run", "-q", "--", "true"], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert stat_state()[0] == "Y"
        assert probe().running == (), "the dead agent's kdamond was not stopped"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        target.kill()
        target.wait()
