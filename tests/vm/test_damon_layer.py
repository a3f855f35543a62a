"""The DAMON layer against a real DAMON (vm tier): monitoring a live process, ownership, schemes.

Every kdamond here is started through `damon_hp.damon.start_vaddr` except the deliberately
foreign one, which is made by raw sysfs writes as another tool would. The ground truth comes
from workloads/bin/hotcold, which prints the address ranges of its hot buffer (read at random
all the time) and its cold buffer (written once at start).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from damon_hp.damon import (
    OWNER_FOREIGN,
    OWNER_STALE,
    AccessPattern,
    AddrRange,
    Intervals,
    IntervalsGoal,
    KdamondStopped,
    Scheme,
    Snapshot,
    kernel_version,
    ownership,
    probe,
    reclaim_stale,
    start_vaddr,
)
from damon_hp.errors import DamonHpError, EnvironmentProblem

ROOT = Path(__file__).resolve().parents[2]
ADMIN = Path("/sys/kernel/mm/damon/admin")
HOTCOLD = ROOT / "workloads/bin/hotcold"
MiB = 1 << 20
# Short intervals so a few aggregations pass in seconds even in the slow TCG guest.
INTERVALS = Intervals(sample_us=5_000, aggr_us=100_000, update_us=1_000_000)
# Warm-up: regions split along the buffers within ~30 aggregations. Counted, not slept: an
# idle region's age grows by one per aggregation, so a region aged WARMUP_AGGRS proves at least
# that many have passed (3 s is 30 of them on a quiet guest, a third of that on a loaded TCG).
WARMUP_AGGRS = 30
WARMUP_DEADLINE_S = 180.0


def wait_until(what: str, ok, timeout_s: float = WARMUP_DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s: {what}"
        time.sleep(0.2)


def warmed_up(kd, aggrs: int = WARMUP_AGGRS) -> Snapshot:
    """Poll the kdamond's snapshots until some region is `aggrs` aggregations old."""
    deadline = time.monotonic() + WARMUP_DEADLINE_S
    while True:
        snap = kd.snapshot()
        oldest = max((r.age for r in snap.regions), default=0)
        if oldest >= aggrs:
            return snap
        assert time.monotonic() < deadline, (
            f"no region {aggrs} aggregations old within {WARMUP_DEADLINE_S} s (oldest {oldest})")
        time.sleep(0.2)


class HotCold:
    def __init__(self, proc: subprocess.Popen, hot: AddrRange, cold: AddrRange) -> None:
        self.proc, self.hot, self.cold = proc, hot, cold

    @property
    def pid(self) -> int:
        return self.proc.pid


@pytest.fixture
def hotcold() -> Iterator[HotCold]:
    proc = subprocess.Popen([str(HOTCOLD), "--hot", "64M", "--cold", "256M", "--seconds", "600"],
                            stdout=subprocess.PIPE, text=True)
    try:
        first = json.loads(proc.stdout.readline())
        yield HotCold(proc, AddrRange.from_dict(first["hot"]), AddrRange.from_dict(first["cold"]))
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(autouse=True)
def damon_is_free_before_and_after() -> Iterator[None]:
    """Each test starts from, and must leave, a DAMON with no kdamond at all."""
    assert probe().kdamonds == (), "a previous test left a kdamond behind"
    yield
    assert probe().kdamonds == (), "this test left a kdamond dir behind"


def mean_access_pct(snap: Snapshot, rng: AddrRange) -> float:
    """Byte-weighted access percentage of the regions over `rng` (clipped to it)."""
    covered = weighted = 0.0
    for r in snap.regions_in(rng):
        part = r.range.overlap(rng)
        covered += part
        weighted += part * snap.access_pct(r)
    return weighted / covered


def covered_bytes(snap: Snapshot, rng: AddrRange) -> int:
    return sum(r.range.overlap(rng) for r in snap.regions_in(rng))


def sysfs_files(root: Path) -> dict[str, str]:
    """Every readable file under `root` with its content: a kdamond's whole configuration."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            try:
                out[str(p.relative_to(root))] = p.read_text()
            except OSError:
                pass
    return out


def test_hot_buffer_shows_clearly_more_accesses_than_cold_buffer(hotcold):
    with start_vaddr(hotcold.pid, INTERVALS, 10, 200) as kd:
        warmed_up(kd)
        snaps = [kd.snapshot() for _ in range(5)]
    for s in snaps:
        assert s.pid == hotcold.pid
        assert s.max_nr_accesses == INTERVALS.aggr_us // INTERVALS.sample_us
        starts = [r.start for r in s.regions]
        assert starts == sorted(starts)
        # no overlap between neighbours
        assert all(a.end <= b.start for a, b in zip(s.regions, s.regions[1:], strict=False))
        assert all(0 <= r.nr_accesses <= s.max_nr_accesses for r in s.regions)
        # DAMON's regions tile both buffers: nothing of either is unmonitored.
        assert covered_bytes(s, hotcold.hot) == hotcold.hot.size
        assert covered_bytes(s, hotcold.cold) == hotcold.cold.size
    hot = statistics.median(mean_access_pct(s, hotcold.hot) for s in snaps)
    cold = statistics.median(mean_access_pct(s, hotcold.cold) for s in snaps)
    print(f"median access: hot {hot:.1f}%, cold {cold:.1f}% of sampling intervals")
    assert hot >= 25.0, "the continuously read buffer should be seen accessed often"
    assert cold <= 5.0, "the buffer touched once at start should be seen (nearly) idle"
    assert hot >= 5 * max(cold, 1.0)


def test_cold_buffer_ages_while_hot_buffer_reads_accessed(hotcold):
    with start_vaddr(hotcold.pid, INTERVALS, 10, 200) as kd:
        warmed_up(kd)
        snaps = [kd.snapshot() for _ in range(3)]

    def median(s: Snapshot, rng: AddrRange, field: str) -> float:
        return statistics.median(getattr(r, field) for r in s.regions_in(rng)
                                 if r.range.overlap(rng) >= r.size // 2)

    # Age counts aggregations at an unchanged access level: the idle buffer keeps its level
    # (0) and ages. The hot buffer's age is not asserted: read at random it may move by more
    # than DAMON's merge threshold (age reset) or saturate at every sample (nr_accesses 20 of
    # 20, and then it ages as fast as the cold one: a loaded fresh-clone run, 2026-11-24).
    for s in snaps:
        assert median(s, hotcold.cold, "nr_accesses") == 0
        assert median(s, hotcold.hot, "nr_accesses") > 0
    assert max(median(s, hotcold.cold, "age") for s in snaps) >= 3


def test_stop_turns_off_our_kdamond_and_leaves_nothing_behind(hotcold):
    kd = start_vaddr(hotcold.pid, INTERVALS, 10, 200)
    kdamond_pid = kd.kdamond_pid
    status = probe()
    assert [(k.index, k.pid, k.owner) for k in status.kdamonds] == [
        (kd.index, kdamond_pid, "damon-hp")]
    record = ownership.read_records()[kd.index]
    assert record.kdamond_pid == kdamond_pid and record.agent_pid == os.getpid()
    assert Path(f"/proc/{kdamond_pid}/comm").read_text().startswith("kdamond")

    kd.stop()
    assert not Path(f"/proc/{kdamond_pid}").exists()
    assert probe().kdamonds == ()
    assert (ADMIN / "kdamonds/nr_kdamonds").read_text().strip() == "0"
    assert kd.index not in ownership.read_records()
    kd.stop()  # a second stop is harmless
    assert hotcold.proc.poll() is None, "stopping monitoring must not touch the target"


def test_kdamond_stops_by_itself_when_the_target_exits(hotcold):
    kd = start_vaddr(hotcold.pid, INTERVALS, 10, 200)
    try:
        kd.snapshot()
        hotcold.proc.kill()
        hotcold.proc.wait()
        deadline = time.monotonic() + 30
        while kd.is_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not kd.is_running()
        with pytest.raises(KdamondStopped):
            kd.snapshot()
    finally:
        kd.stop()
    assert probe().kdamonds == ()


def test_foreign_kdamond_blocks_start_and_is_left_exactly_as_it_was(hotcold, tmp_path):
    # Another tool's kdamond, made the way such a tool would: raw sysfs writes, paddr.
    kds = ADMIN / "kdamonds"
    (kds / "nr_kdamonds").write_text("1")
    try:
        (kds / "0/contexts/nr_contexts").write_text("1")
        (kds / "0/contexts/0/operations").write_text("paddr")
        (kds / "0/contexts/0/targets/nr_targets").write_text("1")
        (kds / "0/state").write_text("on")
        foreign_pid = int((kds / "0/pid").read_text())
        before = sysfs_files(kds)

        status = probe()
        assert [(k.index, k.owner, k.ops) for k in status.kdamonds] == [
            (0, OWNER_FOREIGN, ("paddr",))]
        assert not status.can_add_kdamond
        with pytest.raises(EnvironmentProblem) as err:
            start_vaddr(hotcold.pid, INTERVALS, 10, 200)
        msg = str(err.value)
        assert f"kdamond 0 (pid {foreign_pid}, ops paddr)" in msg
        assert "not started by damon-hp" in msg and "nr_kdamonds is locked" in msg

        # A record that names index 0 but another kdamond pid and a dead agent proves nothing:
        # reclaiming must leave the foreign kdamond running.
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        forged = ownership.OwnerRecord(
            kdamond_index=0, kdamond_pid=foreign_pid + 1, agent_pid=dead.pid,
            agent_start_ticks=1, target_pid=hotcold.pid, created_ticks=0,
            started_at=time.time(), boot_id=ownership.boot_id())
        ownership.write_record(forged, tmp_path)
        reclaim_stale(run_dir=tmp_path)

        assert sysfs_files(kds) == before, "damon-hp changed a kdamond it did not start"
        assert (kds / "0/state").read_text().strip() == "on"
        assert int((kds / "0/pid").read_text()) == foreign_pid
    finally:
        (kds / "0/state").write_text("off")
        (kds / "nr_kdamonds").write_text("0")


AGENT = """
import sys, time
from damon_hp.damon import Intervals, start_vaddr
kd = start_vaddr(int(sys.argv[1]), Intervals(5000, 100000, 1000000), 10, 200)
print(kd.index, kd.kdamond_pid, flush=True)
time.sleep(600)
"""


def test_kdamond_of_a_killed_agent_is_reclaimed_and_replaced_by_the_next_start(hotcold):
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(hotcold.pid)],
                             stdout=subprocess.PIPE, text=True)
    index, old_pid = map(int, agent.stdout.readline().split())
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    left = probe().kdamonds
    assert [(k.index, k.pid, k.owner) for k in left] == [(index, old_pid, OWNER_STALE)]

    with start_vaddr(hotcold.pid, INTERVALS, 10, 200) as kd:
        running = probe().running
        assert [(k.pid, k.owner) for k in running] == [(kd.kdamond_pid, "damon-hp")]
        assert kd.kdamond_pid != old_pid
        assert not Path(f"/proc/{old_pid}").exists()
        assert kd.snapshot().regions
    assert probe().kdamonds == ()


def test_address_filtered_scheme_reaches_exactly_its_ranges(hotcold):
    # Two ranges that start inside uniformly accessed memory: one in the hot buffer, one in
    # the cold. DAMON must split regions at all four edges to reach them.
    ranges = [AddrRange(hotcold.hot.start + 8 * MiB, hotcold.hot.start + 16 * MiB),
              AddrRange(hotcold.cold.start + 64 * MiB, hotcold.cold.start + 80 * MiB)]
    with start_vaddr(hotcold.pid, INTERVALS, 10, 200) as kd:
        warmed_up(kd)
        kd.set_schemes([Scheme("stat", addr_filters=ranges)])
        # applied at least once before its tried regions are read (was a 1 s sleep)
        wait_until("the filtered scheme to be tried",
                   lambda: any(st.nr_tried > 0 for st in kd.scheme_stats()))
        tried = [kd.tried_bytes(1) for _ in range(7)]
        whole = kd.tried_bytes(0)
    print(f"tried bytes of the filtered scheme: {[t // MiB for t in tried]} MiB")
    assert statistics.median(tried) == sum(r.size for r in ranges)
    assert max(tried) <= sum(r.size for r in ranges)
    assert whole > hotcold.hot.size + hotcold.cold.size  # the snapshot scheme still sees all


def test_access_pattern_scheme_matches_the_hot_buffer_and_not_the_cold(hotcold):
    with start_vaddr(hotcold.pid, INTERVALS, 10, 200) as kd:
        quarter = (INTERVALS.aggr_us // INTERVALS.sample_us) // 4
        # Applied every sampling interval: a scheme added by commit runs out of phase with
        # the aggregations, and 6.7..6.13 stop waiting for its tried regions after two apply
        # intervals of wall time, which a slow kdamond can miss (reads 0).
        kd.set_schemes([Scheme("stat", pattern=AccessPattern(min_nr_accesses=quarter),
                               apply_interval_us=INTERVALS.sample_us)])
        snap = warmed_up(kd)
        tried = statistics.median(kd.tried_bytes(1) for _ in range(5))
        stats = kd.scheme_stats()
    hot_seen = sum(r.range.overlap(hotcold.hot) for r in snap.regions
                   if r.nr_accesses >= quarter)
    print(f"pattern scheme tried {tried / MiB:.1f} MiB; snapshot shows {hot_seen / MiB:.1f} "
          f"MiB of the hot buffer at >= {quarter} accesses")
    assert tried >= hotcold.hot.size // 2
    # Region edges land within a few pages of the buffer's edges, never deep in the cold.
    assert tried <= hotcold.hot.size + 4 * MiB
    assert len(stats) == 1 and stats[0].nr_tried > 0


# Both kernels in every plan: 7.3 tunes (the kernel has intervals_goal), 6.12 must be left alone.
@pytest.mark.main_kernel
@pytest.mark.both_kernels
def test_interval_autotuning_moves_the_sampling_interval_where_the_kernel_has_it(hotcold):
    """DAMON's interval auto-tuning (intervals_goal, Linux 6.15+), which `run` and `attach`
    ask for by default: where the kernel has it, the goal is written, the sampling interval
    DAMON reports (sysfs, after update_tuned_intervals) moves within the goal's bounds, and the
    snapshots carry the tuned intervals; where it has not (6.12), nothing is written and the
    intervals stay as configured. Either way snapshots still cover both buffers."""
    # Bounds on both sides of the start: the kernel shortens the interval while it sees more
    # than the goal's share of access events (kdamond_tune_intervals), which it does here (64 of
    # 320 MiB read at random), so a lower bound at the start pins it there (7.3, 2026-11-26:
    # 5000 us for 180 s).
    goal = IntervalsGoal(access_bp=400, aggrs=3, min_sample_us=INTERVALS.sample_us // 5,
                         max_sample_us=100_000)
    with start_vaddr(hotcold.pid, INTERVALS, 10, 200, intervals_goal=goal) as kd:
        iv = kd.ctx / "monitoring_attrs/intervals"
        has_goal = (iv / "intervals_goal").is_dir()
        assert has_goal == (kernel_version() >= (6, 15)), "intervals_goal vs kernel version"
        assert kd.autotuned == has_goal
        if has_goal:
            written = {k: int((iv / "intervals_goal" / k).read_text())
                       for k in goal.to_dict()}
            assert written == goal.to_dict()
            deadline = time.monotonic() + WARMUP_DEADLINE_S
            seen = []
            while True:
                snap = kd.snapshot()  # asks for the tuned intervals first
                seen.append(snap.sample_us)
                if snap.sample_us != INTERVALS.sample_us:
                    break
                assert time.monotonic() < deadline, (
                    f"sampling interval never tuned in {WARMUP_DEADLINE_S} s: {seen}")
                time.sleep(0.5)
            assert int((iv / "sample_us").read_text()) == snap.sample_us
            assert goal.min_sample_us <= snap.sample_us <= goal.max_sample_us, seen
            assert snap.aggr_us > snap.sample_us
            print(f"sampling interval tuned from {INTERVALS.sample_us} to {snap.sample_us} us "
                  f"(aggregation {snap.aggr_us} us) after {len(seen)} snapshots")
        else:
            snap = warmed_up(kd)
            assert (snap.sample_us, snap.aggr_us) == (INTERVALS.sample_us, INTERVALS.aggr_us)
            assert int((iv / "sample_us").read_text()) == INTERVALS.sample_us
            assert int((iv / "aggr_us").read_text()) == INTERVALS.aggr_us
        assert covered_bytes(snap, hotcold.hot) == hotcold.hot.size
        assert covered_bytes(snap, hotcold.cold) == hotcold.cold.size


def test_supports_action_tells_known_from_unknown_actions_without_disturbing(hotcold):
    with start_vaddr(hotcold.pid, INTERVALS, 10, 200) as kd:
        assert kd.supports_action("hugepage")
        assert kd.supports_action("nohugepage")
        assert not kd.supports_action("no_such_action")
        assert kd.supports_action("collapse") == (kernel_version() >= (7, 2))
        assert (kd.ctx / "schemes/0/action").read_text().strip() == "stat"
        assert kd.snapshot().regions


def test_failed_start_leaves_no_kdamond_dir_and_no_record(hotcold):
    with pytest.raises(DamonHpError, match="no_such_action"):
        start_vaddr(hotcold.pid, INTERVALS, 10, 200, schemes=[Scheme("no_such_action")])
    assert probe().kdamonds == ()
    assert ownership.read_records() == {}
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(EnvironmentProblem, match=f"no process with pid {dead.pid}"):
        start_vaddr(dead.pid, INTERVALS, 10, 200)
