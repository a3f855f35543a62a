"""Parsing damon_aggregated trace lines and grouping them into whole snapshots.

The fixture is the raw trace_pipe text of two whole aggregations of this host's foreign paddr
kdamond (tests/fixtures/capture_damon_events.py). Partial, lost and interleaved bursts are
derived from it by dropping or shifting real events; the multi-target case (vaddr contexts
only, none runs here) is built from a few explained synthetic events.
"""

from __future__ import annotations

import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest
from damon_hp.damon.assembler import SnapshotAssembler
from damon_hp.damon.event_lines import (
    AggregatedEvent,
    lost_events,
    parse_event_block,
    parse_event_line,
)
from damon_hp.damon.events import (
    INSTANCE_PREFIX,
    AggregatedEventStream,
    buffer_size_kb,
    instance_name,
    remove_stale_instances,
)
from damon_hp.damon.text_reader import TextFeed
from damon_hp.errors import EnvironmentProblem

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/damon-aggregated-paddr-host-6.18.txt"
SAMPLE_US, AGGR_US = 500_000, 5_000_000  # the recorded kdamond's intervals (see header)


def fixture_lines() -> list[str]:
    return FIXTURE.read_text().splitlines()


def fixture_events() -> list[AggregatedEvent]:
    events = [parse_event_line(line) for line in fixture_lines()[1:]]
    assert all(e is not None for e in events)
    return events  # type: ignore[return-value]


def bursts(events: list[AggregatedEvent]) -> list[list[AggregatedEvent]]:
    """The fixture's aggregations, split where nr_regions events have been seen."""
    out: list[list[AggregatedEvent]] = []
    i = 0
    while i < len(events):
        n = events[i].nr_regions
        out.append(events[i : i + n])
        i += n
    return out


def assembler(**kw) -> SnapshotAssembler:
    return SnapshotAssembler(sample_us=SAMPLE_US, aggr_us=AGGR_US, clock=lambda: 42.0, **kw)


# -- the fixture ---------------------------------------------------------------------------


def test_fixture_says_which_kernel_and_command_made_it():
    header = fixture_lines()[0]
    assert header.startswith("# kernel 6.18")
    assert "common_pid ==" in header and "hotcold" in header and "paddr" in header


def test_fixture_holds_whole_aggregations():
    groups = bursts(fixture_events())
    assert len(groups) >= 2
    for g in groups:
        assert len(g) == g[0].nr_regions
        assert {e.nr_regions for e in g} == {g[0].nr_regions}


# -- parse_event_line ----------------------------------------------------------------------


def test_parse_reads_every_field_of_a_real_line():
    line = ("       kdamond.0-77      [001] .N...   885.305779: damon_aggregated: "
            "target_id=0 nr_regions=1413 4304596992-4314697728: 3 4")
    assert parse_event_line(line) == AggregatedEvent(
        pid=77, timestamp_s=885.305779, target_id=0, nr_regions=1413,
        start=4304596992, end=4314697728, nr_accesses=3, age=4,
    )


def test_parse_accepts_tgid_column_missing_flags_and_odd_comms():
    payload = "damon_aggregated: target_id=2 nr_regions=3 4096-8192: 0 1"
    for head, pid in [
        ("  kdamond.0-77    (     77) [000] d..1.    12.5: ", 77),  # record-tgid option
        ("  kdamond.0-77    [000]    12.5: ", 77),  # irq-info option off
        ("  my-odd comm-1234   [003] .....    12.5: ", 1234),  # '-' and ' ' in the comm
    ]:
        ev = parse_event_line(head + payload)
        assert ev is not None and ev.pid == pid and ev.target_id == 2
        assert (ev.start, ev.end, ev.nr_accesses, ev.age) == (4096, 8192, 0, 1)


def test_parse_returns_none_for_other_lines():
    for line in ["", "# tracer: nop", "CPU:1 [LOST 12 EVENTS]",
                 "  kdamond.0-77 [001] ..... 1.0: damos_before_apply: ctx_idx=0 scheme_idx=0",
                 "  kdamond.0-77 [001] ..... 1.0: damon_aggregated: target_id=0 garbled"]:
        assert parse_event_line(line) is None


def test_lost_line_reports_how_many_events_were_dropped():
    assert lost_events("CPU:1 [LOST 1234 EVENTS]") == 1234
    assert lost_events(fixture_lines()[1]) == 0


# -- parse_event_block: a whole read at once ------------------------------------------------


def line_by_line(text: str) -> list[AggregatedEvent | None]:
    return [parse_event_line(line) for line in text.splitlines()]


def test_block_of_the_recorded_aggregations_equals_the_line_by_line_events():
    text = "\n".join(fixture_lines()[1:]) + "\n"
    events = parse_event_block(text)
    assert events is not None and len(events) == len(fixture_lines()) - 1
    assert events == line_by_line(text)


ODD_LINES = [
    "CPU:1 [LOST 12 EVENTS]",
    "  kdamond.0-77 [001] ..... 1.0: damon_monitor_intervals_tune: sample_us=5000",
    "  kdamond.0-77    (     77) [000] d..1.    12.5: damon_aggregated: "
    "target_id=2 nr_regions=3 4096-8192: 0 1",  # tgid column: line by line reads it
    "  kdamond.0-77    [000]    12.5: damon_aggregated: target_id=2 nr_regions=3 4096-8192: 0 1",
    "  kdamond.0-77 [001] ..... 1.0: damon_aggregated: target_id=0 nr_regions=3 1-2: 0 1   ",
    "  kdamond.0-77 [001] ..... 1: damon_aggregated: target_id=0 nr_regions=3 1-2: 0 1",
    "  kdamond.0-77 [001] ..... 1.0: damon_aggregated: target_id=0 garbled",
    "  kdamond.0-77 [001] ..... 1.0: damon_aggregated: target_id=0 nr_regions=3 1-2:\r0 1",
    "",
]


def test_a_block_with_any_other_line_is_left_to_the_line_by_line_path():
    good = fixture_lines()[1:4]
    # two events joined by a separator splitlines cuts at and `.` crosses: two lines to the
    # line by line path, one (the second) to a regular expression over "\n"-lines
    joined = good[0] + "\r" + good[1]
    assert len(line_by_line(joined + "\n")) == 2
    for odd in [*ODD_LINES, joined]:
        for at in (0, 1, 3):
            lines = [*good[:at], odd, *good[at:]]
            assert parse_event_block("\n".join(lines) + "\n") is None, (odd, at)
    # and a block cut mid-line (the reader keeps the tail for the next read)
    assert parse_event_block("\n".join(good)) is None
    assert parse_event_block("") is None


def test_what_the_block_reads_is_what_each_line_reads_for_comms_and_numbers():
    payload = "damon_aggregated: target_id=7 nr_regions=2 8192-16384: 19 123"
    heads = ["  kdamond.3-4021    [000] d..1.    12.500001: ",
             "  my-odd comm-1234   [003] .....    0.000000: ",  # '-' and ' ' in the comm
             "kdamond.0-1 [1] . 99999.999999: "]
    text = "".join(h + payload + "\n" for h in heads)
    events = parse_event_block(text)
    assert events == line_by_line(text)
    assert [(e.pid, e.target_id, e.nr_accesses, e.age) for e in events] == [
        (4021, 7, 19, 123), (1234, 7, 19, 123), (1, 7, 19, 123)]


def test_stream_reads_blocks_and_odd_lines_alike():
    """The reader's two paths give the same snapshots: the recorded aggregations fed in reads
    of any size, with and without a LOST marker between them."""
    text = "\n".join(fixture_lines()[1:]) + "\n"
    for size in (100, 4096, 1 << 16, len(text)):
        pipe, asm = TextFeed(follow_tuning=False), assembler()
        data = text.encode()
        snaps = []
        for i in range(0, len(data), size):
            snaps += pipe.feed_bytes(data[i:i + size], asm)[0]
        expect = assembler().feed_all(fixture_events())
        assert [s.regions for s in snaps] == [s.regions for s in expect], size
    first, second = bursts(fixture_events())[:2]
    lines = fixture_lines()[1:]
    cut = len(first) // 2
    lost = [*lines[:cut], "CPU:0 [LOST 3 EVENTS]", *lines[cut:]]
    feed = TextFeed(follow_tuning=False)
    snaps, n = feed.feed_bytes(("\n".join(lost) + "\n").encode(), assembler())
    assert n == 3
    assert [s.regions for s in snaps] == [assembler().feed_all(second)[0].regions]


# -- SnapshotAssembler -------------------------------------------------------------------------


def test_whole_aggregations_become_contiguous_sorted_snapshots():
    events = fixture_events()
    snaps = assembler().feed_all(events)
    assert len(snaps) == len(bursts(events))
    for snap, burst in zip(snaps, bursts(events), strict=True):
        assert len(snap.regions) == burst[0].nr_regions
        assert (snap.pid, snap.sample_us, snap.aggr_us, snap.taken_at_s) == (
            0, SAMPLE_US, AGGR_US, 42.0)
        assert all(a.end == b.start for a, b in pairwise(snap.regions))
        assert all(r.size >= 4096 and r.start % 4096 == 0 for r in snap.regions)
        assert snap.total_bytes == snap.regions[-1].end - snap.regions[0].start
        assert max(r.nr_accesses for r in snap.regions) <= snap.max_nr_accesses


def test_a_burst_joined_midway_is_dropped_not_returned():
    events = fixture_events()
    asm = assembler()
    snaps = asm.feed_all(events[100:])
    assert len(snaps) == len(bursts(events)) - 1
    assert len(snaps[0].regions) == bursts(events)[1][0].nr_regions
    assert asm.dropped_groups == 1


def test_a_burst_missing_its_tail_is_dropped_when_the_next_begins():
    first, second = bursts(fixture_events())[:2]
    asm = assembler()
    snaps = asm.feed_all(first[:-5] + second)
    assert [len(s.regions) for s in snaps] == [len(second)]
    assert asm.dropped_groups == 1


def test_a_time_gap_splits_bursts_even_when_addresses_keep_rising():
    # The tail of one aggregation followed by the head of the next, a whole aggregation
    # later, with the same count: only the gap tells them apart, and neither is whole.
    first = bursts(fixture_events())[0]
    k = len(first) // 2
    later = [e._replace(timestamp_s=e.timestamp_s + AGGR_US / 1e6) for e in first]
    asm = assembler()
    assert asm.feed_all(first[:k] + later[k:]) == []
    assert asm.feed_all(later[:k]) == []  # the head alone, starting below the tail's end
    assert asm.dropped_groups == 2


def test_reset_after_lost_events_drops_the_group_in_progress():
    first, second = bursts(fixture_events())[:2]
    asm = assembler()
    asm.feed_all(first[:10])
    asm.reset()
    snaps = asm.feed_all(first[10:] + second)
    assert [len(s.regions) for s in snaps] == [len(second)]


def test_each_target_gets_its_own_snapshot_and_pid():
    # A vaddr context with two targets: DAMON emits all of target 0's regions, then target
    # 1's, each with its own nr_regions; regions of one target need not be adjacent.
    def ev(t, n, start, end, acc):
        return AggregatedEvent(77, 1.0, t, n, start, end, acc, 0)

    events = [ev(0, 2, 0x1000, 0x3000, 1), ev(0, 2, 0x8000, 0x9000, 2),
              ev(1, 1, 0x5000, 0x6000, 3), ev(7, 1, 0x1000, 0x2000, 0)]
    asm = assembler(target_pids={0: 100, 1: 200})
    snaps = asm.feed_all(events)
    assert [(s.pid, len(s.regions)) for s in snaps] == [(100, 2), (200, 1)]
    assert asm.ignored_events == 1  # target 7 is not in the mapping


def test_intervals_must_be_sane():
    with pytest.raises(ValueError):
        SnapshotAssembler(sample_us=10, aggr_us=5)


# -- instances and the stream, without a kernel ------------------------------------------------


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_instances_of_dead_damon_hp_processes_are_removed_others_kept(tmp_path):
    inst = tmp_path / "instances"
    inst.mkdir()
    gone = dead_pid()
    names = [instance_name(gone, 0), instance_name(gone, 3), instance_name(os.getpid(), 0),
             f"{INSTANCE_PREFIX}{gone}", f"{INSTANCE_PREFIX}x-0", f"other-{gone}-0", "foo"]
    for n in names:
        (inst / n).mkdir()
    removed = remove_stale_instances(str(tmp_path))
    assert sorted(removed) == sorted([instance_name(gone, 0), instance_name(gone, 3)])
    assert sorted(os.listdir(inst)) == sorted(names[2:])


def test_missing_tracefs_says_how_to_mount_it(tmp_path):
    with pytest.raises(EnvironmentProblem, match="mount -t tracefs nodev"):
        AggregatedEventStream(os.getpid(), sample_us=1, aggr_us=2, tracefs=str(tmp_path)).open()


def test_missing_tracepoint_is_an_environment_problem(tmp_path):
    (tmp_path / "instances").mkdir()
    stream = AggregatedEventStream(os.getpid(), sample_us=1, aggr_us=2, tracefs=str(tmp_path))
    with pytest.raises(EnvironmentProblem, match="no damon:damon_aggregated tracepoint"):
        stream.open()
    assert os.listdir(tmp_path / "instances") == []


def test_buffer_holds_two_bursts_of_the_largest_region_count():
    # A damon_aggregated event takes 52 bytes in the ring buffer (48 of fields, a 4-byte
    # header), a little more with time extends.
    assert buffer_size_kb(10) == 128
    assert buffer_size_kb(8192) * 1024 >= 2 * 8192 * 56


def test_feeding_a_read_at_once_gives_what_feeding_each_event_gives():
    """The reader feeds each whole read at once (feed_many, plain tuples from
    parse_event_rows): the snapshots and the counts of dropped and ignored events are those of
    feeding the same events one at a time, however the reads cut the stream, on bursts that
    tear, repeat, change their region count, come late or belong to no target."""
    import random

    rng = random.Random(17)
    events: list[AggregatedEvent] = []
    t = 1.0
    for _ in range(300):
        target = rng.choice([0, 0, 1, 9])  # 9: no pid
        nr = rng.choice([1, 2, 3, 5])
        n = nr if rng.random() < 0.7 else rng.randrange(1, nr + 1)
        t += rng.choice([0.0, 1.0, 1.0, 0.3])
        start = rng.randrange(0, 1 << 20, 4096)
        for k in range(n):
            nr_k = nr if rng.random() < 0.95 else nr + 1
            events.append(AggregatedEvent(77, t + k * 1e-5, target, nr_k, start + k * 4096,
                                          start + (k + 1) * 4096, rng.randrange(5),
                                          rng.randrange(9)))
            if rng.random() < 0.03:
                start -= 8192  # the next one starts below: a new burst
    pids = {0: 100, 1: 101}

    def fresh() -> SnapshotAssembler:
        return SnapshotAssembler(sample_us=SAMPLE_US, aggr_us=AGGR_US, target_pids=pids,
                                 clock=None)

    one = fresh()
    expect = one.feed_all(events)
    for _ in range(20):
        many, got, i = fresh(), [], 0
        while i < len(events):
            j = i + rng.choice([1, 2, 7, 50, 400])
            got += many.feed_many([tuple(e) for e in events[i:j]])
            i = j
        assert got == expect
        assert (many.dropped_groups, many.ignored_events) == (one.dropped_groups,
                                                             one.ignored_events)
    assert len(expect) > 50 and one.dropped_groups > 10 and one.ignored_events > 10
