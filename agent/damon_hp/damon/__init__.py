"""The DAMON layer: the only code that reads or writes /sys/kernel/mm/damon or reads DAMON's
tracepoints. Everything above it sees plain dataclasses.

One module per job:
    io.py            the one reader and writer of DAMON sysfs files (EBUSY retry, turn_off)
    status.py        read-only: what DAMON offers, which kdamonds run, whose they are
    modules.py       read-only: kdamonds of the kernel's DAMON modules (DAMON_STAT) sysfs omits
    module_pause.py  pausing DAMON_STAT for one run, on explicit request only
    placement.py     pure: where a new kdamond of ours may go, or every reason it may not
    kdamond.py       kdamonds we start: start (vaddr, paddr), schemes, tried-regions, stop
    schemes.py       how a DAMOS Scheme becomes sysfs writes (kdamond.py calls it)
    ownership.py     records that prove a kdamond ours
    events.py        the damon_aggregated event stream of any kdamond, as whole snapshots
    raw_reader.py    the instance's per-CPU trace_pipe_raw files -> events (events.py uses)
    event_pages.py   pure: trace_pipe_raw pages -> events (binary)
    event_lines.py   pure: one trace_pipe line -> one event (text: fixtures, unknown layouts)
    assembler.py     pure: events -> whole per-target snapshots
    targets.py       which process an event's target_id means while targets change
    revmap.py        physical regions -> one process's per-2 MiB access picture (pagemap)
    sources.py       vaddr, paddr and passive access sources behind one interface
    model.py         DAMON objects as dataclasses

Stable API (other modules import from here, not from the submodules):

model (pure data, JSON round-trip with to_dict/from_dict):
    Region(start, end, nr_accesses, age)            age in aggregation intervals; .size, .range
    Snapshot(taken_at_s, pid, sample_us, aggr_us, regions: tuple[Region, ...], unsteady, space)
        space: VIRTUAL (a vaddr kdamond's regions), PHYSICAL (a paddr kdamond's), WINDOWS (one
        process's 2 MiB windows reverse-mapped from a physical snapshot, revmap.py)
        .max_nr_accesses (= aggr_us // sample_us), .access_pct(region) -> 0..100,
        .age_s(region) -> seconds, .total_bytes, .regions_in(AddrRange)
    Intervals(sample_us=5000, aggr_us=100000, update_us=1000000)
    IntervalsGoal(access_bp=400, aggrs=3, min_sample_us=5000, max_sample_us=10000000)
    AccessPattern(min_size_bytes, max_size_bytes, min_nr_accesses, max_nr_accesses,
                  min_age, max_age)                  defaults match every region
    AddrRange(start, end)                            end exclusive; .size, .overlap(other)
    Scheme(action, pattern=AccessPattern(), addr_filters=(AddrRange, ...),
           quota_bytes=0, quota_ms=0, quota_reset_interval_ms=0, apply_interval_us=0)
        addr_filters limits the scheme to the union of the ranges (empty = no limit)
    SchemeStats(nr_tried, sz_tried, nr_applied, sz_applied, qt_exceeds)
    Recording(kernel, command, snapshots, ground_truth: dict[str, AddrRange], note)
        .load(path) / .save(path): the format of tests/fixtures/damon-*.json

probe / placement / kdamond:
    probe() -> DamonStatus                           read-only; safe anywhere (doctor uses it)
        .sysfs_present, .readable, .avail_ops, .kdamonds: tuple[KdamondInfo, ...],
        .running, .foreign_running, .can_add_kdamond, .features: dict[str, bool]
    KdamondInfo(index, state, pid, ops, target_pids, owner, agent_pid)
        owner: OWNER_DAMON_HP | OWNER_STALE | OWNER_FOREIGN | OWNER_NONE; .running, .describe()
    plan_start(status) -> StartPlan                  pure; raises EnvironmentProblem naming
                                                     every reason (no vaddr, busy, ...)
    plan_placement(status) -> StartPlan              pure; only the "is a kdamond slot free" part
    start_vaddr(pid, intervals=None, min_nr_regions=10, max_nr_regions=1000, schemes=(),
                intervals_goal=None) -> OwnedKdamond
        raises EnvironmentProblem (exit 2) naming any foreign running kdamond; writes nothing
        in that case. Reclaims kdamonds left by dead damon-hp agents first.
    OwnedKdamond                                     the only handle that changes a kdamond
        .index, .kdamond_pid, .target_pid, .intervals, .schemes, .autotuned
        .snapshot() -> Snapshot                      via the built-in `stat` scheme's
                                                     tried_regions; blocks ~one aggr interval
        .tried_bytes(scheme=0) -> int                cheaper total only (6.6+)
        .set_schemes(schemes)                        replace the caller's schemes + commit
        .scheme_stats() -> list[SchemeStats]         one per caller scheme, same order
        .supports_action(name) -> bool               e.g. "collapse" (7.2+)
        .is_running() -> bool                        False once the target has exited
        .stop()                                      idempotent; only if the live pid is ours
        context manager: `with start_vaddr(...) as kd:` stops on exit
    reclaim_stale() -> list[str]                     stop kdamonds of dead damon-hp agents
    KdamondStopped(DamonHpError)                     raised by reads once ours has stopped

Ownership records: $DAMON_HP_RUN_DIR (default /run/damon-hp)/kdamond-<index>.json.
"""

from .kdamond import (
    KdamondStopped,
    OwnedKdamond,
    reclaim_stale,
    start_paddr,
    start_vaddr,
)
from .model import (
    UINT_MAX,
    ULONG_MAX,
    AccessPattern,
    AddrRange,
    Intervals,
    IntervalsGoal,
    Recording,
    Region,
    Scheme,
    SchemeStats,
    Snapshot,
)
from .placement import StartPlan, busy_message, plan_placement, plan_start
from .status import (
    OWNER_DAMON_HP,
    OWNER_FOREIGN,
    OWNER_NONE,
    OWNER_STALE,
    DamonStatus,
    KdamondInfo,
    kernel_version,
    probe,
    read_intervals,
    running_kdamond_pids,
    scheme_actions,
)

__all__ = [
    "UINT_MAX", "ULONG_MAX", "AccessPattern", "AddrRange", "Intervals", "IntervalsGoal",
    "Recording", "Region", "Scheme", "SchemeStats", "Snapshot",
    "OWNER_DAMON_HP", "OWNER_FOREIGN", "OWNER_NONE", "OWNER_STALE", "DamonStatus",
    "KdamondInfo", "KdamondStopped", "OwnedKdamond", "StartPlan", "plan_placement",
    "plan_start", "probe", "reclaim_stale", "start_vaddr", "start_paddr", "busy_message",
    "kernel_version", "read_intervals", "running_kdamond_pids",
    "scheme_actions",
]
