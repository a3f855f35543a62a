"""The access sources on a real DAMON (vm tier, system THP mode `never`): paddr, passive, and the
event stream against tried_regions.

- paddr: damon-hp's own physical-memory kdamond, reverse-mapped onto hotcold, backs the hot
  buffer and mostly not the cold one; nothing of it is left afterwards.
- passive: a paddr kdamond started here by raw sysfs writes, as another tool would, is read
  through its events only (`--source passive`, and `auto` since DAMON is busy), with DAMON sysfs
  mounted read-only around the agent; the kdamond runs on exactly as it was.
- the event stream and tried_regions of the built-in `stat` scheme describe the same
  aggregation of our vaddr kdamond.

Ground truth comes from workloads/bin/hotcold's printed ranges and /proc/PID/smaps, never from
the agent's own report. Every test also checks that nothing is left behind: no kdamond, no
tracefs instance, no status or ownership record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from damon_hp import procfs
from damon_hp.damon import Intervals, Snapshot, ownership, probe, start_vaddr
from damon_hp.damon.events import INSTANCE_PREFIX, AggregatedEventStream
from damon_hp.damon.model import Recording
from damon_hp.pipeline import PHYSICAL_MIN_ACCESS_PCT
from damon_hp.policy.hotset import range_heat
from damon_hp.ranges import HUGE_PAGE_BYTES, AddrRange, huge_range, huge_starts
from leftovers import kdamond_threads

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = str(ROOT / ".venv/bin/damon-hp")
HOTCOLD = str(ROOT / "workloads/bin/hotcold")
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
DAMON = Path("/sys/kernel/mm/damon")
KDAMONDS = DAMON / "admin/kdamonds"
INSTANCES = Path("/sys/kernel/tracing/instances")
# Behaviour, not speed (as in test_agent.py): the hot set must become huge while hotcold runs.
# Physical sources need 3 hot snapshots over 2 aggregations, DAMON first has to split its
# regions of all of RAM down to the buffers, and every snapshot costs the agent a reverse map of
# the whole target through pagemap: 1-3 s of CPU per snapshot for 1.25 GiB under TCG (about
# 0.04 s on the host), and the emulated CPU slows further with the host's load. With the host at
# load 6-7 on 2 cores (2026-11-23) the agent needed 3.5 s of CPU per snapshot of a 256M/1G
# hotcold (1.4 s for 128M/512M) and none of the physical-source tests got its hot buffer to
# 90 % within 120 s; a quarter of the size keeps them within the deadline.
HOT, COLD = "64M", "256M"
# 240 s (hotcold runs 300): beside three other fresh-clone suites the passive test saw its first
# promotion at 72 s and 44 % of the hot buffer huge at 120 s (2026-11-25). The tests stop as soon
# as the share is reached, so only a slow run waits longer.
DEADLINE_S = 240.0
HOT_SHARE = 0.90
# The physical sources (paddr, passive) against README's figures (90 % of the hot set huge, <= 2 %
# of the cold): the hot buffer must reach HOT_SHARE like vaddr's, and the cold buffer must stay
# below PHYSICAL_COLD_MAX at that moment (the test stops there). How much of the cold buffer a
# physical source promotes is physics of the frame layout under emulation: a DAMON region of
# all of RAM mixes cold frames with busy ones, so cold ranges read hot in some aggregations.
# Measured 2026-11-25 (6.12 VM, one TCG thread, host load 8-15: other sessions' VMs and suites
# and a busy loop; hotcold 64M/256M; cold share when hot reached 90 %):
#   paddr:   5.5 % (fresh VM, 13 s), 34.4 % (after other vm tests, 44 s, commit 3ea2c3a)
#   passive: 14.8 % (fresh VM, 17 s), 97.7 % (after other vm tests, 24 s: the whole cold buffer
#            followed the hot one; the old "cold below hot" check failed on it too)
# Hot reached 90 % in all four (max 96.9 %: 31 of its 32 2 MiB windows, alignment). Earlier
# loaded runs under older rules (2026-11-23/24) saw cold at 12.5-75 % after other vm tests and
# hot stuck at 69-84 %. The cold bound is set at the measured spread's edge, not at README's 2 %
# (host figure): a physical region of all of RAM mixes cold frames with busy ones under
# emulation. It caught the passive run above; README's own figures are the benchmark's
# (experiments/bench-sources.py).
PHYSICAL_COLD_MAX = 0.50

@pytest.fixture(autouse=True)
def thp_never() -> Iterator[None]:
    """THP `never` for the test, restored afterwards. Only ever inside the VM."""
    old = procfs.thp_mode()
    THP_ENABLED.write_text("never")
    yield
    THP_ENABLED.write_text(old)


def our_instances() -> list[str]:
    return sorted(n for n in os.listdir(INSTANCES) if n.startswith(INSTANCE_PREFIX))


def status_agents() -> list[dict]:
    r = subprocess.run([DAMON_HP, "status", "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["agents"]


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Before and after: no kdamond dir, no damon-hp tracefs instance, no record of ours."""
    assert probe().kdamonds == (), "a kdamond dir existed before the test"
    assert our_instances() == []
    yield
    assert probe().kdamonds == (), "the test left a kdamond dir behind"
    assert kdamond_threads() == [], "a kdamond thread is still running"
    assert our_instances() == [], "a damon-hp tracefs instance was left behind"
    assert ownership.read_records() == {}, "an ownership record was left behind"
    assert status_agents() == [], "a status record was left behind"


def system_ram() -> list[tuple[int, int]]:
    """Top-level System RAM ranges of /proc/iomem, [start, end) page-aligned."""
    out = []
    for line in Path("/proc/iomem").read_text().splitlines():
        if line.startswith(" ") or not line.endswith(": System RAM"):
            continue
        lo, hi = (int(x, 16) for x in line.split(" : ")[0].split("-"))
        start, end = -(-lo // 4096) * 4096, (hi + 1) // 4096 * 4096
        if end > start:
            out.append((start, end))
    return out


class HotCold:
    def __init__(self, line: str) -> None:
        d = json.loads(line)
        self.pid = d["pid"]
        self.hot = AddrRange(d["hot"]["start"], d["hot"]["end"])
        self.cold = AddrRange(d["cold"]["start"], d["cold"]["end"])
        self.not_huge: list[int] = []
        """the hot buffer's 2 MiB ranges not huge when the run was stopped (pagemap)"""
        self.cold_huge: list[int] = []
        """the cold buffer's 2 MiB ranges huge when the run was stopped (pagemap)"""

    def huge_shares(self) -> tuple[float, float]:
        maps = procfs.read_smaps(self.pid)
        hot = procfs.smaps_in_ranges(maps, [self.hot]).anon_huge_bytes
        cold = procfs.smaps_in_ranges(maps, [self.cold]).anon_huge_bytes
        return hot / self.hot.size, cold / self.cold.size


def recording_of(out: Path) -> Path:
    """Where run_until_hot has the agent save its snapshots (`--record`)."""
    return out.with_name(out.stem + "-snapshots.json")


def run_until_hot(args: list[str], out: Path, wrap: list[str] | None = None,
                  share: float = HOT_SHARE, hot: str = HOT, cold: str = COLD,
                  ) -> tuple[HotCold, float | None, list, str, int]:
    """`damon-hp run --json out ARGS -- hotcold`, watched through smaps until the hot buffer is
    `share` huge or DEADLINE_S passes, then stopped with SIGTERM.

    Returns (ranges, seconds to `share` or None, samples (t, hot, cold), stderr, exit code).
    """
    # A physical source tells hot from cold frames only as finely as DAMON's physical regions
    # (docs/sources.md): after the tier's earlier tests the guest's free memory is scattered,
    # and hotcold's hot and cold frames interleave. In a fresh-clone run (2026-11-25, 6.12)
    # both physical tests stalled at 62-87 % of the hot buffer while each passed alone in 14
    # and 60 s. Compact first, as on a fresh machine (VM only: anything goes there).
    Path("/proc/sys/vm/drop_caches").write_text("3")
    Path("/proc/sys/vm/compact_memory").write_text("1")
    cmd = [DAMON_HP, "run", "--progress-s", "10", "--json", str(out), "--record",
           str(recording_of(out)), *args, "--", HOTCOLD, "--hot", hot, "--cold", cold,
           "--seconds", "300"]
    proc = subprocess.Popen([*(wrap or []), *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=60)
            pytest.fail(f"damon-hp run exited before hotcold started:\n{proc.stderr.read()}")
        hc = HotCold(line)
        since = time.monotonic()
        took, samples = None, []
        while True:
            hot, cold = hc.huge_shares()
            t = time.monotonic() - since
            if t > DEADLINE_S:
                break
            samples.append((round(t, 1), round(hot, 3), round(cold, 3)))
            if hot >= share:
                took = t
                break
            time.sleep(0.5)
        samples.append(("end", *(round(x, 3) for x in hc.huge_shares())))
        # whole aligned 2 MiB ranges only: hotcold's buffers are not aligned, and the range
        # over an end also holds other memory
        hc.not_huge = [w for w in huge_starts(hc.hot)
                       if procfs.huge_bytes_in(hc.pid, [huge_range(w)]) < HUGE_PAGE_BYTES]
        hc.cold_huge = [w for w in huge_starts(hc.cold)
                        if procfs.huge_bytes_in(hc.pid, [huge_range(w)]) == HUGE_PAGE_BYTES]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    return hc, took, samples, err, proc.returncode


# --------------------------------------------------------------------------------------------
# paddr: our own physical-memory kdamond


def changes(samples: list) -> list:
    """The samples where a share changed (and the last), for a readable message."""
    return [x for i, x in enumerate(samples)
            if i == 0 or i == len(samples) - 1 or x[1:] != samples[i - 1][1:]]


def shown_busy(recording: Path, starts: list[int]) -> list[int]:
    """Those of `starts` (2 MiB ranges) that the source showed busy enough to promote: read at
    the physical sources' rate (PHYSICAL_MIN_ACCESS_PCT of DAMON's samples) in two snapshots
    in a row without gaining pages (pipeline.FirstTouch). Two such readings carry at least
    twice 30 % of 20 samples, above the 8 sampled accesses the rule asks for, so the rule must
    have promoted such a range (there is no budget here)."""
    snaps = Recording.load(recording).snapshots
    out = set()
    last: set[int] = set()
    for snap in snaps:
        heat = range_heat(snap, starts)
        now = {s for s, h in heat.items()
               if h.mean_pct >= PHYSICAL_MIN_ACCESS_PCT and s not in snap.unsteady}
        out |= now & last
        last = now
    return sorted(out)


def never_shown_busy(recording: Path, starts: list[int]) -> list[int]:
    """Those of `starts` that no snapshot showed with a region at the physical sources' rate
    (PHYSICAL_MIN_ACCESS_PCT) over any part of them: the rule has no ground to promote them
    (a loose bound: one such reading, faulting in or not, is taken as ground)."""
    shown: set[int] = set()
    for snap in Recording.load(recording).snapshots:
        shown |= {s for s, h in range_heat(snap, starts).items()
                  if h.max_pct >= PHYSICAL_MIN_ACCESS_PCT}
    return sorted(set(starts) - shown)


def assert_hot_backed_cold_not(name: str, took: float | None, samples: list, err: str,
                               hc: HotCold, out: Path) -> None:
    print(f"{name}: {HOT_SHARE:.0%} of the hot buffer huge after {took} s; samples "
          f"{changes(samples)}")
    if took is None:
        # tests/README.md's stated exception for physical sources: a hot range whose frames
        # lie scattered among DAMON's physical regions reads below the physical rate in every
        # snapshot (fresh-clone run 2026-11-26, 836cbea: 28 of 32 hot ranges huge at 10.6 s,
        # the agent's hot set held none of the other 4 from 80 s to 290 s); no rule can see
        # such a range. Those the source did show busy must have been promoted; the rest is
        # only reported.
        missing = hc.not_huge
        _, hot_end, cold_end = samples[-1]
        assert hot_end >= 0.5, (
            f"{name}: hot buffer not {HOT_SHARE:.0%} huge within {DEADLINE_S} s: "
            f"{changes(samples)}\n{err}")
        seen = shown_busy(recording_of(out), missing)
        assert not seen, (f"{name}: {len(seen)} hot ranges the source showed busy in two "
                          f"snapshots in a row stayed on 4 KiB pages: {changes(samples)}\n{err}")
        assert cold_end <= PHYSICAL_COLD_MAX, (
            f"{name}: {cold_end:.1%} of the cold buffer huge: {changes(samples)}")
        print(f"{name}: the source never showed {len(missing)} of the hot buffer's 2 MiB ranges "
              f"busy enough (tests/README.md's exception): only the rest is checked")
        return
    _, hot_then, cold_then = samples[-2]  # the sample that reached the share ("end" follows)
    assert cold_then <= PHYSICAL_COLD_MAX, (
        f"{name}: {cold_then:.1%} of the cold buffer huge when the hot one reached "
        f"{hot_then:.1%}: {changes(samples)}")


@pytest.mark.physical_frames
def test_paddr_source_backs_the_hot_buffer_and_leaves_no_kdamond(tmp_path) -> None:
    out = tmp_path / "out.json"
    hc, took, samples, err, code = run_until_hot(["--source", "paddr"], out)
    print(err[err.find("damon-hp summary"):])
    assert_hot_backed_cold_not("paddr", took, samples, err, hc, out)
    assert code == 0, err  # hotcold exits 0 on SIGTERM, passed through
    source = json.loads(out.read_text())["summary"]["source"]
    assert source["name"] == "paddr"
    assert "(ours, paddr)" in source["kdamond"]
    assert source["reader"] == "event stream + pagemap reverse map"
    assert not Path(f"/proc/{source['kdamond_pid']}").exists(), "our kdamond outlived the run"


# --------------------------------------------------------------------------------------------
# passive: a kdamond someone else started


class ForeignPaddrKdamond:
    """A paddr kdamond started by raw sysfs writes over all System RAM, with a scheme of its
    own, as another tool would (inside the VM only)."""

    # 2 s aggregations (100 samples each): the agent reverse-maps every aggregation, which
    # under TCG on the slowed host took it to 58-100 % of the guest's core at 1 s (fresh-clone
    # runs of 2026-11-28: the hot buffer 90 % huge only at 212 s of the 240-s bound in one,
    # 9 % in another); the test is about what the agent reads and does, not how soon.
    SAMPLE_US, AGGR_US = 20_000, 2_000_000

    def __init__(self) -> None:
        (KDAMONDS / "nr_kdamonds").write_text("1")
        self.dir = KDAMONDS / "0"
        ctx = self.dir / "contexts"
        (ctx / "nr_contexts").write_text("1")
        ctx = ctx / "0"
        (ctx / "operations").write_text("paddr")
        (ctx / "monitoring_attrs/intervals/sample_us").write_text(str(self.SAMPLE_US))
        (ctx / "monitoring_attrs/intervals/aggr_us").write_text(str(self.AGGR_US))
        (ctx / "monitoring_attrs/nr_regions/min").write_text("10")
        (ctx / "monitoring_attrs/nr_regions/max").write_text("1000")
        (ctx / "targets/nr_targets").write_text("1")
        ram = system_ram()
        regions = ctx / "targets/0/regions"
        (regions / "nr_regions").write_text(str(len(ram)))
        for i, (start, end) in enumerate(ram):
            (regions / f"{i}/start").write_text(str(start))
            (regions / f"{i}/end").write_text(str(end))
        # A scheme that changes nothing (stat) but is not DAMON's default: it must survive.
        (ctx / "schemes/nr_schemes").write_text("1")
        s = ctx / "schemes/0"
        (s / "action").write_text("stat")
        for name, lo, hi in (("sz", 4096, 1 << 40), ("nr_accesses", 0, 0), ("age", 10, 1 << 20)):
            (s / f"access_pattern/{name}/min").write_text(str(lo))
            (s / f"access_pattern/{name}/max").write_text(str(hi))
        (self.dir / "state").write_text("on")
        self.pid = int((self.dir / "pid").read_text())

    def files(self) -> dict[str, str]:
        """Every readable file of its dir, less what the kernel keeps updating itself (scheme
        counters, tried regions)."""
        out = {}
        for dirpath, _, names in os.walk(self.dir):
            if {"stats", "tried_regions"} & set(Path(dirpath).parts):
                continue
            for name in names:
                try:
                    out[str(Path(dirpath, name).relative_to(self.dir))] = (
                        Path(dirpath, name).read_text())
                except OSError:
                    continue
        return out

    def remove(self) -> None:
        (self.dir / "state").write_text("off")
        deadline = time.monotonic() + 30
        while (self.dir / "state").read_text().strip() != "off" and time.monotonic() < deadline:
            time.sleep(0.1)
        (KDAMONDS / "nr_kdamonds").write_text("0")


@pytest.fixture
def foreign() -> Iterator[ForeignPaddrKdamond]:
    kd = ForeignPaddrKdamond()
    try:
        yield kd
    finally:
        kd.remove()


# The agent runs in a private mount namespace in which DAMON sysfs is read-only: a write under
# it would fail there (EROFS) and show as an error, and the outside stays untouched.
READ_ONLY_DAMON = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   f"mount --bind {DAMON} {DAMON} && mount -o remount,bind,ro {DAMON} && "
                   'exec "$@"', "sh"]


# 7.3 only since 2026-11-28: on 6.12 it took 426 s of that VM's ~1,130 (the slowed host) and
# proves nothing 7.3 and the host tier do not: the tracepoint's fields are the same since 5.15
# (shared damon-facts), and the host tier reads a real foreign kdamond's events natively on
# 6.18 (tests/host/test_agent_passive.py).
@pytest.mark.physical_frames
def test_passive_source_backs_the_hot_buffer_through_a_foreign_kdamond_it_never_writes(
        tmp_path, foreign: ForeignPaddrKdamond) -> None:
    before = foreign.files()
    assert before["state"].strip() == "on"
    out = tmp_path / "out.json"
    hc, took, samples, err, code = run_until_hot(["--source", "passive"], out,
                                                 wrap=READ_ONLY_DAMON)
    after = foreign.files()
    assert_hot_backed_cold_not("passive", took, samples, err, hc, out)
    assert code == 0, err
    s = json.loads(out.read_text())["summary"]
    assert s["source"]["name"] == "passive"
    assert s["source"]["kdamond_pid"] == foreign.pid
    assert "not ours" in s["source"]["kdamond"]
    assert (s["source"]["sample_us"], s["source"]["aggr_us"]) == (
        ForeignPaddrKdamond.SAMPLE_US, ForeignPaddrKdamond.AGGR_US)
    assert s["kdamond_cpu_s"] is None, "a foreign kdamond's CPU is its owner's, not ours"
    # The foreign kdamond runs on, same thread, same intervals, regions and scheme.
    assert after == before
    assert [k.pid for k in probe().running] == [foreign.pid]
    assert kdamond_threads() == [foreign.pid]



def test_auto_picks_the_foreign_kdamond_when_damon_is_busy_and_says_why(
        tmp_path, foreign: ForeignPaddrKdamond) -> None:
    """DAMON busy with a kdamond that is not ours: vaddr and paddr are refused, auto reads the
    foreign one passively, says so on its first progress line and in --json, and writes
    nothing under DAMON sysfs (read-only around the agent). How fast it backs the hot set is
    the passive test's part."""
    before = foreign.files()
    out = tmp_path / "out.json"
    r = subprocess.run([*READ_ONLY_DAMON, DAMON_HP, "run", "--json", str(out), "--",
                        HOTCOLD, "--hot", "16M", "--cold", "16M", "--seconds", "5"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("damon-hp: access source")]
    assert said and "passive" in said[0] and f"pid {foreign.pid}" in said[0], r.stderr
    s = json.loads(out.read_text())["summary"]["source"]
    assert s["name"] == "passive" and s["kdamond_pid"] == foreign.pid
    assert s["reason"].startswith("auto: ") and "vaddr" in s["reason"], s
    assert foreign.files() == before
    assert kdamond_threads() == [foreign.pid]


def test_where_no_source_works_auto_lists_each_refusal_on_its_own_line(tmp_path) -> None:
    """DAMON busy with a foreign *vaddr* kdamond (raw sysfs writes, watching a sleep): no
    kdamond of ours can start (vaddr, paddr) and passive reads paddr kdamonds only, so `run`
    exits 2 with one line per source saying why (53333e4 once merged them into one)."""
    sleeper = subprocess.Popen(["sleep", "600"])
    kd = KDAMONDS / "0"
    try:
        (KDAMONDS / "nr_kdamonds").write_text("1")
        (kd / "contexts/nr_contexts").write_text("1")
        (kd / "contexts/0/operations").write_text("vaddr")
        (kd / "contexts/0/targets/nr_targets").write_text("1")
        (kd / "contexts/0/targets/0/pid_target").write_text(str(sleeper.pid))
        (kd / "state").write_text("on")
        r = subprocess.run([DAMON_HP, "run", "--json", str(tmp_path / "out.json"), "--",
                            "true"], capture_output=True, text=True, timeout=180)
    finally:
        if (kd / "state").exists() and (kd / "state").read_text().strip() == "on":
            (kd / "state").write_text("off")
            deadline = time.monotonic() + 30
            while (kd / "state").read_text().strip() != "off" and time.monotonic() < deadline:
                time.sleep(0.1)
        (KDAMONDS / "nr_kdamonds").write_text("0")
        sleeper.kill()
        sleeper.wait()
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    head = next(i for i, line in enumerate(lines)
                if "no DAMON access source works here:" in line)
    assert [line.split(":")[0] for line in lines[head + 1:head + 4]] == [
        "  vaddr", "  paddr", "  passive"], r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out.json").exists()

# --------------------------------------------------------------------------------------------
# the event stream and tried_regions: one aggregation, two readers

STREAM_INTERVALS = Intervals(sample_us=20_000, aggr_us=2_000_000, update_us=1_000_000)
# Stream snapshots to look through for the tried-regions aggregation: DAMON fills tried regions
# at the first or (if the request came in mid-boundary) the second apply after the request.
FOLLOWING = 3


def test_event_stream_and_tried_regions_describe_the_same_aggregation() -> None:
    """Our vaddr kdamond applies its `stat` scheme and emits its damon_aggregated events at the
    same aggregation boundary, after the regions were merged and before they are reset: the
    scheme's tried_regions and that aggregation's events are the same regions with the same
    nr_accesses and age. `OwnedKdamond.snapshot()` asks for tried regions right after a stream
    snapshot arrived, so DAMON fills them at one of the next boundaries; the stream's following
    snapshots (kept in the instance's buffer meanwhile) must include that very aggregation.
    With a 2 s aggregation interval the kdamond's work at a boundary (milliseconds) cannot
    straddle two of them, even under TCG."""
    hotcold = subprocess.Popen([HOTCOLD, "--hot", "64M", "--cold", "256M", "--seconds", "600"],
                               stdout=subprocess.PIPE, text=True)
    try:
        hc = HotCold(hotcold.stdout.readline())
        with start_vaddr(hc.pid, STREAM_INTERVALS, 10, 200) as kd:
            assert kd.kdamond_pid is not None
            with AggregatedEventStream(
                    kd.kdamond_pid, sample_us=STREAM_INTERVALS.sample_us,
                    aggr_us=STREAM_INTERVALS.aggr_us, target_pids=hc.pid,
                    max_nr_regions=200) as stream:
                instance = stream.instance
                assert instance is not None and instance.exists()
                wait_s = 3 * STREAM_INTERVALS.aggr_us / 1e6 + 5
                matches = []
                for _ in range(3):
                    assert stream.next_snapshot(timeout_s=wait_s) is not None, "no snapshot"
                    tried = kd.snapshot()
                    matches.append(find_in_stream(tried, stream, wait_s, hc))
            assert not instance.exists(), "the stream's tracefs instance outlived close()"
    finally:
        hotcold.kill()
        hotcold.wait()
    print(f"tried_regions matched the stream's next snapshot number {matches}")


def find_in_stream(tried: Snapshot, stream: AggregatedEventStream, wait_s: float,
                   hc: HotCold) -> int:
    """Which of the stream's next snapshots (1-based, at most FOLLOWING) is exactly the
    tried_regions snapshot: same regions, nr_accesses and ages."""
    assert tried.pid == hc.pid
    assert tried.regions, "tried_regions empty"
    key = [(r.start, r.end, r.nr_accesses, r.age) for r in tried.regions]
    seen = []
    for i in range(1, FOLLOWING + 1):
        s = stream.next_snapshot(timeout_s=wait_s)
        assert s is not None, f"the stream delivered no snapshot within {wait_s} s"
        assert s.pid == hc.pid
        if [(r.start, r.end, r.nr_accesses, r.age) for r in s.regions] == key:
            # The aggregation they share is a live picture: both buffers covered, the hot one
            # seen accessed.
            for rng in (hc.hot, hc.cold):
                assert sum(r.range.overlap(rng) for r in s.regions_in(rng)) == rng.size
            assert max(r.nr_accesses for r in s.regions_in(hc.hot)) > 0
            return i
        seen.append(s)
    detail = "\n".join(
        f"stream +{i}: {len(s.regions)} regions, {s.total_bytes} B, accesses "
        f"{sum(r.nr_accesses for r in s.regions)}" for i, s in enumerate(seen, 1))
    pytest.fail(f"no stream snapshot equals tried_regions ({len(tried.regions)} regions, "
                f"{tried.total_bytes} B, accesses {sum(r.nr_accesses for r in tried.regions)})"
                f":\n{detail}")
