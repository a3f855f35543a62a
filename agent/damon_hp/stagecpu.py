"""Where an agent's monitoring CPU goes: its own thread's CPU time per stage of the pipeline.

    cpu = StageCpu()
    with cpu.stage(PROCFS):
        ...
    cpu.seconds  -> {"procfs": 0.12, ...}

CLOCK_THREAD_CPUTIME_ID (time.thread_time) counts only the calling thread, user and system: a
stage's system time inside a syscall (a pagemap read, PAGEMAP_SCAN) is the kernel's work for us
and counts; time spent waiting (select on the event stream) does not. Reading the clock costs
well under a microsecond, so a stage per snapshot and process is free to measure.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

# The stages, in pipeline order (report order).
EVENTS = "events"            # reading and parsing DAMON's aggregation (trace_pipe, sysfs)
PROCFS = "procfs"            # the target's maps, status and pagemap (frames, residency)
REVERSE_MAP = "reverse map"  # a physical snapshot onto the target's virtual ranges
DECIDE = "decide"            # the policy
ACT = "act"                  # madvise calls less the kernel's copy inside MADV_COLLAPSE
MEASURE = "measure"          # what the target holds after the actions (PAGEMAP_SCAN, status)
STAGES = (EVENTS, PROCFS, REVERSE_MAP, DECIDE, ACT, MEASURE)


@dataclass
class StageCpu:
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.thread_time()
        try:
            yield
        finally:
            self.add(name, time.thread_time() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def merge(self, other: Mapping[str, float]) -> None:
        for name, s in other.items():
            self.add(name, s)

    def to_dict(self) -> dict[str, float]:
        """Seconds per stage, in pipeline order, then any other name."""
        order = [s for s in STAGES if s in self.seconds]
        order += sorted(set(self.seconds) - set(order))
        return {s: round(self.seconds[s], 4) for s in order}


def describe(seconds: Mapping[str, float], wall_s: float) -> str:
    """'procfs 1.20 s (1.20 %), decide ...': each stage's CPU and its share of a core."""
    if not seconds or wall_s <= 0:
        return "n/a"
    return ", ".join(f"{name} {s:.2f} s ({100 * s / wall_s:.2f} %)"
                     for name, s in seconds.items())
