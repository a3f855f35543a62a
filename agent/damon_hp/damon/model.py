"""DAMON objects as plain, frozen dataclasses (Region: a NamedTuple): what DAMON measured and
what we ask of it.

Nothing here touches the kernel. Every class round-trips through `to_dict`/`from_dict` so that a
snapshot read from a real sysfs tree and one loaded from a JSON fixture are the same object.
Units are in the field names where DAMON's own units are not obvious: intervals in microseconds,
`age` in aggregation intervals (as DAMON reports it), sizes in bytes, addresses as integers with
`end` exclusive.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from damon_hp.ranges import HUGE_PAGE_BYTES, PAGE_BYTES, AddrRange

# The largest values DAMON's sysfs files accept: sizes are unsigned long, counters unsigned int.
ULONG_MAX = 2**64 - 1
UINT_MAX = 2**32 - 1


class Region(NamedTuple):
    """One DAMON region: its access count in the last aggregation interval and its age.

    `nr_accesses` counts the sampling intervals (of `aggr_us // sample_us`) in which DAMON saw
    the region accessed; `age` is how many aggregation intervals its access level has held.

    A NamedTuple, not a frozen dataclass like the rest: one is made per region per aggregation
    (~3,800 per 5 s from the host's kdamond), and with a frozen dataclass's constructor
    assembling an event cost 1.05 us where it costs 0.74 now (the recorded fixture).
    """

    start: int
    end: int
    nr_accesses: int
    age: int

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def range(self) -> AddrRange:
        return AddrRange(self.start, self.end)

    def to_dict(self) -> dict[str, int]:
        return {"start": self.start, "end": self.end, "nr_accesses": self.nr_accesses,
                "age": self.age}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Region:
        return cls(int(d["start"]), int(d["end"]), int(d["nr_accesses"]), int(d["age"]))


# What a Snapshot's regions are, by where they come from (Snapshot.space):
VIRTUAL = "virtual"
"""a vaddr kdamond's regions of one process: virtual addresses, nr_accesses in samples"""
PHYSICAL = "physical"
"""a paddr kdamond's regions: physical addresses (times addr_unit) of every process at once"""
WINDOWS = "windows"
"""one process's 2 MiB windows reverse-mapped from a physical aggregation (revmap.py): virtual
addresses, nr_accesses the share of the window's pages in accessed regions, scaled to samples"""
SPACES = (VIRTUAL, PHYSICAL, WINDOWS)


@dataclass(frozen=True)
class Snapshot:
    """All regions of one target at one aggregation, with the intervals needed to read them.

    `space` says which of three things the regions are (VIRTUAL, PHYSICAL, WINDOWS above): the
    policy reads virtual ones and windows alike, never physical ones; revmap turns physical
    ones into windows.
    """

    taken_at_s: float  # time.monotonic() when read
    pid: int
    sample_us: int
    aggr_us: int
    regions: tuple[Region, ...]
    unsteady: frozenset[int] = frozenset()
    """2 MiB range starts (virtual) whose resident pages grew during this aggregation: a page
    being faulted in reads as accessed, so their readings carry no evidence (filled by the
    per-process pipeline, pipeline.py; empty in DAMON's own snapshots)"""
    space: str = VIRTUAL

    def __post_init__(self) -> None:
        if self.space not in SPACES:
            raise ValueError(f"Snapshot.space must be one of {SPACES}, not {self.space!r}")

    @property
    def max_nr_accesses(self) -> int:
        """The largest `nr_accesses` a region can have: one per sampling interval."""
        return max(1, self.aggr_us // self.sample_us)

    def access_pct(self, region: Region) -> float:
        """Share of sampling intervals in which `region` was seen accessed, 0..100."""
        return 100.0 * min(region.nr_accesses, self.max_nr_accesses) / self.max_nr_accesses

    def age_s(self, region: Region) -> float:
        """How long, in seconds, `region` has kept its access level."""
        return region.age * self.aggr_us / 1e6

    @property
    def total_bytes(self) -> int:
        return sum(r.size for r in self.regions)

    def regions_in(self, rng: AddrRange) -> tuple[Region, ...]:
        """Regions overlapping `rng` (whole regions, not clipped)."""
        return tuple(r for r in self.regions if r.end > rng.start and r.start < rng.end)

    def to_dict(self) -> dict[str, Any]:
        return {
            "taken_at_s": self.taken_at_s,
            "pid": self.pid,
            "sample_us": self.sample_us,
            "aggr_us": self.aggr_us,
            "regions": [r.to_dict() for r in self.regions],
            **({"unsteady": sorted(self.unsteady)} if self.unsteady else {}),
            "space": self.space,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Snapshot:
        return cls(
            taken_at_s=float(d["taken_at_s"]),
            pid=int(d["pid"]),
            sample_us=int(d["sample_us"]),
            aggr_us=int(d["aggr_us"]),
            regions=tuple(Region.from_dict(r) for r in d["regions"]),
            unsteady=frozenset(int(s) for s in d.get("unsteady", ())),
            # recordings made before the field was added hold virtual snapshots or windows
            space=str(d.get("space", VIRTUAL)),
        )


@dataclass(frozen=True)
class Intervals:
    """DAMON monitoring intervals, microseconds (sysfs defaults: 5 ms, 100 ms, 60 s)."""

    sample_us: int = 5_000
    aggr_us: int = 100_000
    update_us: int = 1_000_000

    def __post_init__(self) -> None:
        if not 0 < self.sample_us <= self.aggr_us:
            raise ValueError(f"need 0 < sample_us ({self.sample_us}) <= aggr_us ({self.aggr_us})")
        if self.update_us <= 0:
            raise ValueError(f"update_us must be positive, not {self.update_us}")

    def to_dict(self) -> dict[str, int]:
        return {"sample_us": self.sample_us, "aggr_us": self.aggr_us, "update_us": self.update_us}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Intervals:
        return cls(int(d["sample_us"]), int(d["aggr_us"]), int(d["update_us"]))


@dataclass(frozen=True)
class IntervalsGoal:
    """DAMON's interval auto-tuning target (Linux 6.15+, `intervals_goal/`).

    DAMON scales the sampling interval between the two bounds so that `access_bp` (basis
    points of the observable accesses) are seen within `aggrs` aggregation intervals.
    """

    access_bp: int = 400
    aggrs: int = 3
    min_sample_us: int = 5_000
    max_sample_us: int = 10_000_000

    def to_dict(self) -> dict[str, int]:
        return {"access_bp": self.access_bp, "aggrs": self.aggrs,
                "min_sample_us": self.min_sample_us, "max_sample_us": self.max_sample_us}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IntervalsGoal:
        return cls(int(d["access_bp"]), int(d["aggrs"]), int(d["min_sample_us"]),
                   int(d["max_sample_us"]))


@dataclass(frozen=True)
class AccessPattern:
    """Which regions a DAMOS scheme applies to; every bound is inclusive, as in sysfs.

    The defaults match everything. (A scheme created in sysfs starts at [0, 0] for every
    bound and matches nothing: the sysfs layer always writes all six values.)
    """

    min_size_bytes: int = 0
    max_size_bytes: int = ULONG_MAX
    min_nr_accesses: int = 0
    max_nr_accesses: int = UINT_MAX
    min_age: int = 0  # aggregation intervals
    max_age: int = UINT_MAX

    def to_dict(self) -> dict[str, int]:
        return {
            "min_size_bytes": self.min_size_bytes, "max_size_bytes": self.max_size_bytes,
            "min_nr_accesses": self.min_nr_accesses, "max_nr_accesses": self.max_nr_accesses,
            "min_age": self.min_age, "max_age": self.max_age,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AccessPattern:
        return cls(**{k: int(v) for k, v in d.items()})


@dataclass(frozen=True)
class Scheme:
    """One DAMOS scheme: apply `action` to regions matching `pattern`.

    `addr_filters` limits the scheme to the union of these ranges (empty: no address limit).
    Quotas of 0 mean unlimited. `apply_interval_us` 0 means every aggregation interval, except
    for schemes with `addr_filters`, which the sysfs layer applies every sampling interval:
    once per aggregation, DAMON never reaches a filter range that starts inside a uniformly
    accessed region (it splits the region there and skips the rest of that pass).
    Actions DAMON knows for vaddr include: stat, hugepage, nohugepage, willneed, cold, pageout,
    and (Linux 7.2+) collapse; `OwnedKdamond.supports_action` says what this kernel takes.
    """

    action: str
    pattern: AccessPattern = field(default_factory=AccessPattern)
    addr_filters: tuple[AddrRange, ...] = ()
    quota_bytes: int = 0
    quota_ms: int = 0
    quota_reset_interval_ms: int = 0
    apply_interval_us: int = 0

    def __post_init__(self) -> None:
        # Accept lists from callers and JSON, but store a tuple so the object stays hashable.
        object.__setattr__(self, "addr_filters", tuple(self.addr_filters))

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "pattern": self.pattern.to_dict(),
            "addr_filters": [a.to_dict() for a in self.addr_filters],
            "quota_bytes": self.quota_bytes,
            "quota_ms": self.quota_ms,
            "quota_reset_interval_ms": self.quota_reset_interval_ms,
            "apply_interval_us": self.apply_interval_us,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scheme:
        return cls(
            action=str(d["action"]),
            pattern=AccessPattern.from_dict(d.get("pattern", {})),
            addr_filters=tuple(AddrRange.from_dict(a) for a in d.get("addr_filters", [])),
            quota_bytes=int(d.get("quota_bytes", 0)),
            quota_ms=int(d.get("quota_ms", 0)),
            quota_reset_interval_ms=int(d.get("quota_reset_interval_ms", 0)),
            apply_interval_us=int(d.get("apply_interval_us", 0)),
        )


@dataclass(frozen=True)
class SchemeStats:
    """DAMOS counters of one scheme since it started (sysfs `stats/`)."""

    nr_tried: int
    sz_tried: int
    nr_applied: int
    sz_applied: int
    qt_exceeds: int

    def to_dict(self) -> dict[str, int]:
        return {"nr_tried": self.nr_tried, "sz_tried": self.sz_tried,
                "nr_applied": self.nr_applied, "sz_applied": self.sz_applied,
                "qt_exceeds": self.qt_exceeds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SchemeStats:
        return cls(**{k: int(d[k]) for k in
                      ("nr_tried", "sz_tried", "nr_applied", "sz_applied", "qt_exceeds")})


@dataclass(frozen=True)
class Recording:
    """Snapshots captured from a real kernel, as stored in tests/fixtures/*.json.

    `ground_truth` maps a name ("hot", "cold") to the address range the workload reported for
    it, so tests can score decisions against what the workload really did.
    """

    kernel: str
    command: str
    snapshots: tuple[Snapshot, ...]
    ground_truth: dict[str, AddrRange] = field(default_factory=dict)
    note: str = ""
    # The workload's own JSON lines (e.g. phases' {"phase", "start", "end", "t_mono"}), whose
    # t_mono is on the same CLOCK_MONOTONIC as Snapshot.taken_at_s.
    events: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "command": self.command,
            "note": self.note,
            "ground_truth": {k: v.to_dict() for k, v in self.ground_truth.items()},
            "events": list(self.events),
            "snapshots": [s.to_dict() for s in self.snapshots],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recording:
        return cls(
            kernel=str(d["kernel"]),
            command=str(d["command"]),
            note=str(d.get("note", "")),
            ground_truth={k: AddrRange.from_dict(v)
                          for k, v in d.get("ground_truth", {}).items()},
            snapshots=tuple(Snapshot.from_dict(s) for s in d["snapshots"]),
            events=tuple(d.get("events", ())),
        )

    @classmethod
    def from_compact(cls, d: dict[str, Any]) -> Recording:
        """A compacted recording (tests/fixtures/passive-*.json.gz: regions as [start - base,
        length, nr_accesses, age] in 4 KiB pages, `hot`/`cold` as [start, end]). These predate
        the first-touch marks, so each 2 MiB range is marked unsteady in the snapshot where it
        first appears: the least the pipeline would mark."""
        base, snaps, seen = d["base"], [], set()
        for s in d["snapshots"]:
            regions = tuple(Region(base + off * PAGE_BYTES, base + (off + n) * PAGE_BYTES, acc,
                                   age) for off, n, acc, age in s["regions"])
            starts = {r.start - r.start % HUGE_PAGE_BYTES for r in regions}
            snaps.append(Snapshot(s["taken_at_s"], 1, d["sample_us"], d["aggr_us"], regions,
                                  frozenset(starts - seen)))
            seen |= starts
        return cls(kernel=str(d["kernel"]), command=str(d["command"]),
                   note=str(d.get("note", "")), snapshots=tuple(snaps),
                   ground_truth={k: AddrRange(*d[k]) for k in ("hot", "cold") if k in d})

    @classmethod
    def load(cls, path: str | Path) -> Recording:
        """A recording as `save` writes it, or a compacted one; gzipped when named *.gz."""
        raw = Path(path).read_bytes()
        d = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
        return cls.from_compact(d) if "base" in d else cls.from_dict(d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")
