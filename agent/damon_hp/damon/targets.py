"""Which process a `damon_aggregated` event's target_id means, across online target updates.

A vaddr context with several targets names each in its events by its index in the context's
target list. Linux 6.12 updates the targets of a running kdamond by position (`commit`): the
i-th target written becomes the i-th target of the running context, and keeps the regions the
previous i-th target had. Removing a target from the middle therefore moves every later pid
one slot down, each into the regions of the process before it, until DAMON's next ops update
(`update_us`) re-reads that process's mappings. Seen in the test VM (6.12.95).

`TargetMap` keeps each commit's slot list with the times the commit was written and returned:

- events stamped before a commit was written follow the list before it;
- events stamped while it was in flight are dropped (DAMON applies it between an aggregation
  and that aggregation's events: which list an event follows cannot be told);
- a slot whose pid changed carries its previous occupant's regions, so its events are dropped
  until `stale_s` after the commit (at least two ops updates).

Pure: times are CLOCK_MONOTONIC seconds, the trace clock of our tracefs instance.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_EPOCHS = 16


@dataclass(frozen=True)
class Epoch:
    written_s: float
    settled_s: float
    pids: tuple[int, ...]
    fresh_from_s: dict[int, float] = field(default_factory=dict)
    """per slot: events before this time carry another process's regions"""


def plan_slots(current: tuple[int, ...], wanted: Iterable[int]) -> tuple[int, ...]:
    """The next slot list: pids still wanted keep their order, new ones follow in pid order.

    Keeping the order means a pid only ever moves down, and only when one before it leaves.
    """
    want = set(wanted)
    kept = tuple(p for p in current if p in want)
    return kept + tuple(sorted(want - set(kept)))


class TargetMap:
    def __init__(self, stale_s: float) -> None:
        self.stale_s = stale_s
        self.epochs: list[Epoch] = []

    @property
    def pids(self) -> tuple[int, ...]:
        return self.epochs[-1].pids if self.epochs else ()

    def started(self, pids: tuple[int, ...], written_s: float, settled_s: float) -> None:
        """A new kdamond with `pids`: DAMON built every target's regions at start."""
        self.epochs = [Epoch(written_s, settled_s, pids)]

    def committed(self, pids: tuple[int, ...], written_s: float, settled_s: float) -> None:
        prev = self.epochs[-1] if self.epochs else Epoch(written_s, written_s, ())
        fresh = {}
        for slot, pid in enumerate(pids):
            if slot < len(prev.pids) and prev.pids[slot] == pid:
                if prev.fresh_from_s.get(slot, 0.0) > settled_s:
                    fresh[slot] = prev.fresh_from_s[slot]
            else:
                fresh[slot] = settled_s + self.stale_s
        self.epochs.append(Epoch(written_s, settled_s, pids, fresh))
        del self.epochs[:-MAX_EPOCHS]

    def stopped(self) -> None:
        self.epochs = []

    def pid_of(self, target_id: int, at_s: float) -> int | None:
        """The pid whose memory target_id's event stamped `at_s` describes, or None."""
        for e in reversed(self.epochs):
            if at_s >= e.settled_s:
                if target_id >= len(e.pids) or at_s < e.fresh_from_s.get(target_id, 0.0):
                    return None
                return e.pids[target_id]
            if at_s >= e.written_s:
                return None  # in flight
        return None  # before the kdamond we know of
