"""`damon_aggregated` events of one kdamond -> whole per-target snapshots, pure.

The middle of the event stream's three layers (event_lines.py parses a line, events.py owns
the tracefs instance): it relies on the order in which a kdamond emits them: at the end of an
aggregation kdamond_reset_aggregated() traces every region of every target, target by target,
each target's regions in list (address) order, in one burst.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

from damon_hp.numpy_lean import np

from .event_lines import AggregatedEvent, EventFields
from .model import PHYSICAL, VIRTUAL, Region, Snapshot

# Region._make without its length check: a third faster, and the rows are 4-tuples by dtype
_new_region = partial(tuple.__new__, Region)

# pid by target_id: one for all, a fixed mapping, or a function of (target_id, event time)
TargetPids = Mapping[int, int] | int | Callable[[int, float], int | None]


@dataclass
class _Group:
    """Regions of one target seen so far in the current burst."""

    nr_regions: int
    pid: int
    regions: list[Region] = field(default_factory=list)
    last_ts: float = 0.0


class SnapshotAssembler:
    """Groups `damon_aggregated` events of one kdamond into whole per-target snapshots.

    Pure apart from `clock` (time.monotonic by default), which stamps `Snapshot.taken_at_s`
    when the snapshot completes; with `clock=None` the snapshot carries the time of its last
    event instead (the aggregation's end, on the trace clock), so snapshots read late, several
    at once, keep the times DAMON made them at. A target's
    snapshot is complete when `nr_regions` events have arrived for it; DAMON emits a target's
    regions in address order within a few milliseconds, so a group ends early -- and is
    dropped, never returned torn -- when an event starts below the previous one (the next
    aggregation began), reports a different `nr_regions`, or follows the previous event by more
    than half an aggregation interval. That drops the burst a reader joins midway and any burst
    that lost events in the ring buffer.

    target_pids: the pid to put in each target's snapshots, by target_id (the target's index in
    the kdamond's context), or one pid for every target (0 for paddr), or a function of
    (target_id, event time) for a kdamond whose targets change while it runs (targets.py).
    Events of a target_id without a pid are ignored.

    The snapshots are physical (model.PHYSICAL) where every target's pid is 0 (a paddr
    kdamond's, which has no process), else virtual.
    """

    def __init__(
        self,
        *,
        sample_us: int,
        aggr_us: int,
        target_pids: TargetPids = 0,
        clock: Callable[[], float] | None = time.monotonic,
    ) -> None:
        if not 0 < sample_us <= aggr_us:
            raise ValueError(f"need 0 < sample_us ({sample_us}) <= aggr_us ({aggr_us})")
        self.sample_us = sample_us
        self.aggr_us = aggr_us
        self._target_pids = target_pids
        self.space = PHYSICAL if target_pids == 0 else VIRTUAL
        self._clock = clock
        self._groups: dict[int, _Group] = {}
        # Within a burst events are microseconds apart; bursts are an aggregation apart.
        self._burst_gap_s = aggr_us / 2e6
        self.dropped_groups = 0
        self.ignored_events = 0
        self.retunes = 0

    def _pid_of(self, target_id: int, at_s: float) -> int | None:
        if isinstance(self._target_pids, int):
            return self._target_pids
        if callable(self._target_pids):
            return self._target_pids(target_id, at_s)
        return self._target_pids.get(target_id)

    def feed(self, event: AggregatedEvent) -> Snapshot | None:
        """Add one event; return the target's snapshot if this event completed it."""
        done = self.feed_many((event,))
        return done[0] if done else None

    def feed_many(self, events: Iterable[EventFields]) -> list[Snapshot]:
        """Add events in order (AggregatedEvents, or plain tuples of their fields in their
        order: event_lines.parse_event_rows); every snapshot they complete, in order.

        One loop for a whole read: per event, a call to `feed`, an AggregatedEvent and the
        attribute lookups were a fifth of the reader's CPU per line (2.7 to 2.2 us on the
        recorded fixture; ~3,800 events per 5 s from the host's kdamond)."""
        out: list[Snapshot] = []
        groups, fixed = self._groups, self._target_pids
        if not isinstance(fixed, int):
            fixed = None
        for _, ts, target, nr, start, end, acc, age in events:
            pid = fixed if fixed is not None else self._pid_of(target, ts)
            if pid is None or nr <= 0:
                self.ignored_events += 1
                continue
            group = groups.get(target)
            # A new burst: an event below the previous one (the next aggregation began), a
            # different region count, or more than half an aggregation after the previous.
            if group is not None and (group.pid != pid or start < group.regions[-1].end
                                      or nr != group.nr_regions
                                      or ts - group.last_ts > self._burst_gap_s):
                self.dropped_groups += 1
                group = None
            if group is None:
                group = groups[target] = _Group(nr, pid)
            group.regions.append(Region(start, end, acc, age))
            group.last_ts = ts
            if len(group.regions) < nr:
                continue
            del groups[target]
            out.append(self._snapshot(pid, group, ts))
        return out

    def feed_array(self, events: np.ndarray) -> list[Snapshot]:
        """`feed_many` for an array of event_pages.EVENT_DTYPE, in order: the same snapshots,
        drops and counts, with the bursts found by numpy where every event is of one target
        and the pid is fixed (a paddr kdamond's: its only target is 0), else row by row.

        Per event, only a Region is made in Python (~0.3 us); the row by row loop cost
        ~0.55 us more (~3,000 events per 5 s from the host's kdamond)."""
        if not len(events):
            return []
        targets = events["target_id"]
        if not isinstance(self._target_pids, int) or (targets != targets[0]).any():
            return self.feed_many(events.tolist())
        target, pid = int(targets[0]), self._target_pids
        nr, start, end, ts = (events[k] for k in ("nr_regions", "start", "end", "timestamp_s"))
        if not (nr > 0).all():
            return self.feed_many(events.tolist())
        # Where feed_many would end a group before the event (the same tests, pairwise)
        breaks = np.flatnonzero((start[1:] < end[:-1]) | (nr[1:] != nr[:-1])
                                | (ts[1:] - ts[:-1] > self._burst_gap_s)) + 1
        regions = list(map(_new_region, events[["start", "end", "nr_accesses", "age"]].tolist()))
        out: list[Snapshot] = []
        group = self._groups.get(target)
        first = 0
        for stop in [*breaks.tolist(), len(events)]:
            count = int(nr[first])
            if group is not None:
                if (group.pid != pid or int(start[first]) < group.regions[-1].end
                        or count != group.nr_regions
                        or float(ts[first]) - group.last_ts > self._burst_gap_s):
                    self.dropped_groups += 1
                    group = None
            at = first
            while at < stop:
                if group is None:
                    group = _Group(count, pid)
                take = min(stop - at, count - len(group.regions))
                group.regions.extend(regions[at:at + take])
                at += take
                group.last_ts = float(ts[at - 1])
                if len(group.regions) == count:
                    out.append(self._snapshot(pid, group, group.last_ts))
                    group = None
            first = stop
        if group is None:
            self._groups.pop(target, None)
        else:
            self._groups[target] = group
        return out

    def _snapshot(self, pid: int, group: _Group, ts: float) -> Snapshot:
        return Snapshot(
            taken_at_s=self._clock() if self._clock is not None else ts,
            pid=pid,
            sample_us=self.sample_us,
            aggr_us=self.aggr_us,
            regions=tuple(group.regions),
            space=self.space,
        )

    def retune(self, sample_us: int) -> None:
        """The kdamond tuned its sampling interval to `sample_us`: the kernel keeps the
        aggregation interval the same number of samples (kdamond_tune_intervals), so later
        snapshots carry the new pair and the same nr_accesses scale."""
        samples = max(1, round(self.aggr_us / self.sample_us))
        self.sample_us, self.aggr_us = sample_us, sample_us * samples
        self._burst_gap_s = self.aggr_us / 2e6
        self.retunes += 1

    def reset(self) -> None:
        """Drop every group in progress (the kernel lost events: none of them can complete)."""
        self.dropped_groups += len(self._groups)
        self._groups.clear()

    def feed_all(self, events: Iterable[AggregatedEvent]) -> list[Snapshot]:
        """Every snapshot the events complete, in order (for fixtures and tests): feed, event
        by event."""
        return [s for s in map(self.feed, events) if s is not None]
