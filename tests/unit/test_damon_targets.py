"""target_id -> pid across online target updates (damon/targets.py), and the assembler
giving each target's snapshot the pid of its time."""

from __future__ import annotations

from damon_hp.damon.assembler import SnapshotAssembler
from damon_hp.damon.event_lines import AggregatedEvent
from damon_hp.damon.targets import TargetMap, plan_slots


def test_plan_keeps_the_order_of_those_staying_and_appends_new_ones() -> None:
    assert plan_slots((), {30, 10}) == (10, 30)
    assert plan_slots((10, 30), {10, 20, 30}) == (10, 30, 20)
    assert plan_slots((10, 30, 20), {20, 10}) == (10, 20)
    assert plan_slots((10, 20), set()) == ()


def test_events_follow_the_list_of_their_time() -> None:
    m = TargetMap(stale_s=3.0)
    m.started((10, 20), written_s=100.0, settled_s=100.5)
    assert m.pid_of(0, 100.2) is None  # before the kdamond ran
    assert (m.pid_of(0, 101.0), m.pid_of(1, 101.0), m.pid_of(2, 101.0)) == (10, 20, None)
    m.committed((10, 20, 30), written_s=110.0, settled_s=111.0)
    assert m.pid_of(2, 109.9) is None      # slot 2 did not exist yet
    assert m.pid_of(1, 109.9) == 20        # old events, read late
    assert m.pid_of(0, 110.5) is None      # commit in flight: cannot tell
    assert m.pid_of(1, 111.2) == 20        # unchanged slot: at once
    assert m.pid_of(2, 111.2) is None      # new slot: regions not built yet
    assert m.pid_of(2, 114.1) == 30


def test_a_pid_moved_down_a_slot_is_not_read_in_its_predecessors_regions() -> None:
    m = TargetMap(stale_s=3.0)
    m.started((10, 20, 30), 0.0, 0.1)
    m.committed((10, 30), written_s=5.0, settled_s=5.2)  # 20 left: 30 moves to slot 1
    assert m.pid_of(1, 4.0) == 20
    assert m.pid_of(1, 6.0) is None        # 30 in 20's old regions
    assert m.pid_of(0, 6.0) == 10
    assert m.pid_of(1, 8.3) == 30
    # a later commit that leaves slot 1 alone keeps its wait
    m.committed((10, 30, 40), written_s=6.0, settled_s=6.1)
    assert m.pid_of(1, 7.0) is None
    assert m.pid_of(1, 8.3) == 30
    m.stopped()
    assert m.pid_of(0, 9.0) is None


def _ev(tid: int, start: int, end: int, ts: float, n: int = 2) -> AggregatedEvent:
    return AggregatedEvent(pid=99, timestamp_s=ts, target_id=tid, nr_regions=n, start=start,
                           end=end, nr_accesses=1, age=0)


def test_assembler_names_each_snapshot_by_the_pid_of_its_time() -> None:
    m = TargetMap(stale_s=1.0)
    m.started((10, 20), 0.0, 0.1)
    a = SnapshotAssembler(sample_us=20_000, aggr_us=400_000, target_pids=m.pid_of, clock=None)
    got = a.feed_all([_ev(0, 0, 4096, 1.0), _ev(0, 4096, 8192, 1.0),
                      _ev(1, 0, 4096, 1.0), _ev(1, 4096, 8192, 1.0)])
    assert [s.pid for s in got] == [10, 20]
    m.committed((20,), written_s=1.3, settled_s=1.5)      # 10 left: 20 moves to slot 0
    got = a.feed_all([_ev(0, 0, 4096, 1.4), _ev(0, 4096, 8192, 1.4),   # in flight
                      _ev(0, 0, 4096, 1.8), _ev(0, 4096, 8192, 1.8),   # 10's old regions
                      _ev(0, 0, 4096, 2.8), _ev(0, 4096, 8192, 2.8)])
    assert [(s.pid, s.taken_at_s) for s in got] == [(20, 2.8)]
    assert a.ignored_events == 4
