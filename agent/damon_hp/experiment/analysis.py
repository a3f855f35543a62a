"""Pure analysis of run records: medians, spread, ratios to thp-never, and the DAMON paper's two
headline ratios, with honest "undefined" verdicts where a denominator is ~0.

Conventions (the report repeats them for readers):
* Runs are compared only within a group: same workload, thread count and memory condition.
* A headline value is computed from medians over repetitions. Its spread is the range (min..max)
  of the same quantity computed per repetition, pairing each arm's run with the thp-never
  (and thp-always) run of the same repetition: runs are interleaved, so a repetition's runs
  shared the machine's state.
* Runtime is the time for a fixed amount of work: wall time, or ns per operation for benchmarks
  that run for a fixed time (hotcold).
* speedup preserved = (T_never - T_p) / (T_never - T_always), from runtime; the same ratio from
  the workload's CPU time per operation (fixed-time benchmarks: over the measured phase, after
  the set-up, when the benchmark reports it) is given beside it: on a shared host a workload
  that waits for a CPU loses wall time but not CPU time; and the CPU ratio over the phase's
  last third, which a policy that promotes late reaches only once it has promoted
  THP memory overhead removed = (M_always - M_p) / (M_always - M_never)
  Both are undefined, with the reason stated, when the denominator is not clearly positive:
  when thp-always was not faster (or did not use more memory) than thp-never, or when the gap is
  within run-to-run noise (half the min..max range of either baseline's runs, or 1% of the
  thp-never median, whichever is larger; for memory at least one huge page, 2 MiB).
* Only runs with status "ok" enter any number; the others are listed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from damon_hp.experiment.results import OK, RunResult
from damon_hp.experiment.spec import ALWAYS, BASELINE

NOISE_FLOOR_FRACTION = 0.01
# A memory difference smaller than one huge page is not a THP memory overhead.
MIN_MEMORY_GAP_BYTES = 2 << 20

# (key, label, unit) of the per-arm metrics the report tabulates.
METRICS: list[tuple[str, str, str]] = [
    ("runtime_s", "runtime", "s"),
    ("wall_s", "wall time", "s"),
    ("cpu_s", "user+sys CPU", "s"),
    ("cpu_ns_per_op", "CPU time per operation", "ns"),
    ("late_ns_per_op", "runtime per operation, last third of the phase", "ns"),
    ("late_cpu_ns_per_op", "CPU time per operation, last third of the phase", "ns"),
    ("steal_frac", "steal (share of machine CPU time)", "%"),
    ("minflt", "minor faults", ""),
    ("majflt", "major faults", ""),
    ("peak_rss_bytes", "peak RSS", "B"),
    ("mean_rss_bytes", "mean RSS", "B"),
    ("anon_huge_peak_bytes", "AnonHugePages peak", "B"),
    ("anon_huge_mean_bytes", "AnonHugePages mean", "B"),
    ("pte_peak_bytes", "page tables peak", "B"),
    ("swap_peak_bytes", "swap peak", "B"),
    ("cgroup_peak_bytes", "cgroup memory peak", "B"),
    ("dtlb_load_misses", "dTLB load misses", ""),
    ("dtlb_store_misses", "dTLB store misses", ""),
    ("itlb_load_misses", "iTLB load misses", ""),
    ("agent_cpu_s", "agent CPU", "s"),
    ("agent_cpu_frac", "agent CPU (share of one core)", "%"),
    ("kdamond_cpu_s", "kdamond CPU", "s"),
    ("time_to_hot_huge_s", "time to hot set huge", "s"),
    ("before_hot_huge_frac", "share of the measured phase before the hot set was huge", "%"),
    ("hot_huge_fraction_final", "hot set huge at end", ""),
    ("agent_hot_huge_s", "time to agent's hot set huge", "s"),
    ("watched_share_min", "memory the kdamond watches (least over the run)", "%"),
    ("oom_kills", "OOM kills", ""),
]
# Metrics normalised to thp-never (lower is better for all of them).
NORMALISED = [
    "runtime_s",
    "minflt",
    "majflt",
    "dtlb_load_misses",
    "dtlb_store_misses",
    "itlb_load_misses",
    "cpu_s",
    "cpu_ns_per_op",
    "peak_rss_bytes",
]
TLB_METRICS = ("dtlb_load_misses", "dtlb_store_misses", "itlb_load_misses")
MEMORY_METRIC = "peak_rss_bytes"
# (repetition index, value) of one metric for one arm in one group
Pairs = list[tuple[int, float]]


@dataclass(frozen=True)
class Spread:
    """Median and min..max of one metric over the ok runs of one arm."""

    median: float | None
    lo: float | None
    hi: float | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "lo": self.lo, "hi": self.hi, "n": self.n}


@dataclass(frozen=True)
class Ratio:
    """A ratio from medians, its per-repetition range, or the reason it is undefined."""

    value: float | None
    lo: float | None = None
    hi: float | None = None
    n: int = 0  # repetitions that gave a defined per-repetition value
    undefined: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value, "lo": self.lo, "hi": self.hi, "n": self.n,
            "undefined": self.undefined,
        }  # fmt: skip


@dataclass
class ArmSummary:
    arm: str
    n_ok: int
    n_not_ok: int
    metrics: dict[str, Spread] = field(default_factory=dict)
    vs_never: dict[str, Ratio] = field(default_factory=dict)
    speedup_preserved: Ratio | None = None
    speedup_preserved_cpu: Ratio | None = None  # from CPU time per operation
    # from CPU time per operation over the last third of the measured phase
    speedup_preserved_late: Ratio | None = None
    overhead_removed: Ratio | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "n_ok": self.n_ok,
            "n_not_ok": self.n_not_ok,
            "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
            "vs_never": {k: v.to_dict() for k, v in self.vs_never.items()},
            "speedup_preserved": self.speedup_preserved.to_dict()
            if self.speedup_preserved
            else None,
            "speedup_preserved_cpu": self.speedup_preserved_cpu.to_dict()
            if self.speedup_preserved_cpu
            else None,
            "speedup_preserved_late": self.speedup_preserved_late.to_dict()
            if self.speedup_preserved_late
            else None,
            "overhead_removed": self.overhead_removed.to_dict() if self.overhead_removed else None,
        }


@dataclass
class GroupSummary:
    workload: str
    threads: int
    memory: str
    runtime_basis: str  # "wall time" or "ns per operation"
    arms: dict[str, ArmSummary]

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.workload, self.threads, self.memory)

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "threads": self.threads,
            "memory": self.memory,
            "runtime_basis": self.runtime_basis,
            "arms": {k: v.to_dict() for k, v in self.arms.items()},
        }


@dataclass
class PressureEffect:
    """Runtime with insufficient memory relative to sufficient, per arm (paired by rep)."""

    workload: str
    threads: int
    arm: str
    slowdown: Ratio

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload, "threads": self.threads, "arm": self.arm,
            "slowdown": self.slowdown.to_dict(),
        }  # fmt: skip


@dataclass
class Analysis:
    groups: list[GroupSummary]
    pressure: list[PressureEffect]
    not_ok: list[dict[str, Any]]

    def group(self, workload: str, threads: int, memory: str) -> GroupSummary | None:
        for g in self.groups:
            if g.key == (workload, threads, memory):
                return g
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": [g.to_dict() for g in self.groups],
            "pressure": [p.to_dict() for p in self.pressure],
            "not_ok": self.not_ok,
        }


def _values(runs: Iterable[RunResult], metric: str) -> list[float]:
    out = []
    for r in runs:
        v = getattr(r, metric)
        if v is not None:
            out.append(float(v))
    return out


def spread(values: list[float]) -> Spread:
    if not values:
        return Spread(None, None, None, 0)
    return Spread(statistics.median(values), min(values), max(values), len(values))


def _noise(*spreads: Spread, reference: float, floor: float = 0.0) -> float:
    halves = [(s.hi - s.lo) / 2 for s in spreads if s.n and s.hi is not None and s.lo is not None]
    return max([NOISE_FLOOR_FRACTION * abs(reference), floor, *halves])


def _fmt(x: float, unit: str) -> str:
    if unit == "B":
        return f"{x / 2**20:.1f} MiB"
    if unit == "s":
        return f"{x * 1e9:.4g} ns" if abs(x) < 1e-3 else f"{x:.4g} s"
    if unit == "ns":
        return f"{x:.4g} ns"
    return f"{x:.4g}"


def simple_ratio(
    p: Pairs,
    base: Pairs,
    what: str,
    base_name: str = BASELINE,
) -> Ratio:
    """median(p)/median(base); spread from per-repetition pairs (same rep index)."""
    if not p:
        return Ratio(None, undefined=f"no {what} values")
    if not base:
        return Ratio(None, undefined=f"no {what} values for {base_name}")
    mp = statistics.median(v for _, v in p)
    mb = statistics.median(v for _, v in base)
    if mb == 0:
        return Ratio(None, undefined=f"{base_name}'s median {what} was 0")
    base_by_rep = dict(base)
    per_rep = [v / base_by_rep[r] for r, v in p if base_by_rep.get(r)]
    return Ratio(
        mp / mb,
        min(per_rep) if per_rep else None,
        max(per_rep) if per_rep else None,
        len(per_rep),
    )


def gap_ratio(
    p: Pairs,
    never: Pairs,
    always: Pairs,
    *,
    numerator: Callable[[float, float, float], float],
    denominator: Callable[[float, float], float],
    undefined_if_not_positive: str,
    unit: str,
    min_gap: float = 0.0,
) -> Ratio:
    """numerator(never, always, p) / denominator(never, always), guarded against ~0.

    `denominator` is written so that a positive value means thp-always made the difference the
    ratio is about (faster, or more memory); otherwise the ratio is meaningless.
    """
    if not p or not never or not always:
        return Ratio(None, undefined="missing runs of this arm, thp-never or thp-always")
    s_p, s_n, s_a = (spread([v for _, v in x]) for x in (p, never, always))
    assert s_p.median is not None and s_n.median is not None and s_a.median is not None
    gap = denominator(s_n.median, s_a.median)
    noise = _noise(s_n, s_a, reference=s_n.median, floor=min_gap)
    if gap <= 0:
        return Ratio(
            None,
            undefined=f"undefined: {undefined_if_not_positive} (medians: thp-never "
            f"{_fmt(s_n.median, unit)}, thp-always {_fmt(s_a.median, unit)})",
        )
    if gap <= noise:
        return Ratio(
            None,
            undefined=f"undefined: the thp-never/thp-always difference ({_fmt(gap, unit)}) is "
            f"within run-to-run noise (±{_fmt(noise, unit)})",
        )
    value = numerator(s_n.median, s_a.median, s_p.median) / gap
    nb, ab = dict(never), dict(always)
    per_rep = []
    for r, v in p:
        if r in nb and r in ab:
            g = denominator(nb[r], ab[r])
            if g > noise:
                per_rep.append(numerator(nb[r], ab[r], v) / g)
    return Ratio(
        value,
        min(per_rep) if per_rep else None,
        max(per_rep) if per_rep else None,
        len(per_rep),
    )


def speedup_preserved(p: Pairs, never: Pairs, always: Pairs, unit: str = "s") -> Ratio:
    """(T_never - T_p) / (T_never - T_always); lists of (rep, runtime)."""
    return gap_ratio(
        p, never, always,
        numerator=lambda n, a, x: n - x,
        denominator=lambda n, a: n - a,
        undefined_if_not_positive="thp-always was not faster than thp-never",
        unit=unit,
    )  # fmt: skip


def overhead_removed(p: Pairs, never: Pairs, always: Pairs) -> Ratio:
    """(M_always - M_p) / (M_always - M_never); lists of (rep, memory)."""
    return gap_ratio(
        p, never, always,
        numerator=lambda n, a, x: a - x,
        denominator=lambda n, a: a - n,
        undefined_if_not_positive="thp-always used no more memory than thp-never",
        unit="B",
        min_gap=MIN_MEMORY_GAP_BYTES,
    )  # fmt: skip


def _pairs(runs: list[RunResult], metric: str) -> Pairs:
    out = []
    for r in runs:
        v = getattr(r, metric)
        if v is not None:
            out.append((r.rep, float(v)))
    return out


def _summarise_group(
    workload: str, threads: int, memory: str, runs: list[RunResult], order: list[str]
) -> GroupSummary:
    by_arm: dict[str, list[RunResult]] = {}
    for r in runs:
        by_arm.setdefault(r.arm, []).append(r)
    ok = {p: [r for r in rs if r.status == OK] for p, rs in by_arm.items()}
    basis = "ns per operation" if any(r.ns_per_op is not None for r in runs) else "wall time"
    never = ok.get(BASELINE, [])
    always = ok.get(ALWAYS, [])
    summaries: dict[str, ArmSummary] = {}
    for arm in [p for p in order if p in by_arm]:
        rs = ok[arm]
        s = ArmSummary(arm, len(rs), len(by_arm[arm]) - len(rs))
        for key, _, _ in METRICS:
            s.metrics[key] = spread(_values(rs, key))
        for key in NORMALISED:
            if key in TLB_METRICS and not _values(rs, key):
                s.vs_never[key] = Ratio(None, undefined="n/a (no PMU)")
            else:
                s.vs_never[key] = simple_ratio(_pairs(rs, key), _pairs(never, key), key)
        s.speedup_preserved = speedup_preserved(
            _pairs(rs, "runtime_s"), _pairs(never, "runtime_s"), _pairs(always, "runtime_s")
        )
        # Fixed-time benchmarks: CPU time per operation; fixed work: the CPU time itself.
        cpu_key = "cpu_ns_per_op" if _values(rs, "cpu_ns_per_op") else "cpu_s"
        if _values(rs, cpu_key):
            s.speedup_preserved_cpu = speedup_preserved(
                _pairs(rs, cpu_key), _pairs(never, cpu_key), _pairs(always, cpu_key),
                unit="ns" if cpu_key == "cpu_ns_per_op" else "s")
        if _values(rs, "late_cpu_ns_per_op"):
            s.speedup_preserved_late = speedup_preserved(
                _pairs(rs, "late_cpu_ns_per_op"), _pairs(never, "late_cpu_ns_per_op"),
                _pairs(always, "late_cpu_ns_per_op"), unit="ns")
        s.overhead_removed = overhead_removed(
            _pairs(rs, MEMORY_METRIC), _pairs(never, MEMORY_METRIC), _pairs(always, MEMORY_METRIC)
        )
        summaries[arm] = s
    return GroupSummary(workload, threads, memory, basis, summaries)


def analyse(runs: list[RunResult], arm_order: list[str] | None = None) -> Analysis:
    """Group, summarise and compare. `arm_order` fixes the order of arms in the output."""
    order = list(arm_order or [])
    for r in runs:
        if r.arm not in order:
            order.append(r.arm)
    groups: dict[tuple[str, int, str], list[RunResult]] = {}
    for r in runs:
        groups.setdefault((r.workload, r.threads, r.memory), []).append(r)
    mem_rank = {"sufficient": 0, "insufficient": 1}
    keys = sorted(groups, key=lambda k: (k[0], k[1], mem_rank.get(k[2], 9)))
    summaries = [_summarise_group(*k, groups[k], order) for k in keys]

    pressure = []
    for (wl, th, mem) in keys:
        if mem != "insufficient" or (wl, th, "sufficient") not in groups:
            continue
        for arm in order:
            lo = [r for r in groups[(wl, th, "insufficient")] if r.arm == arm]
            hi = [r for r in groups[(wl, th, "sufficient")] if r.arm == arm]
            if not lo or not hi:
                continue
            p_lo = _pairs([r for r in lo if r.status == OK], "runtime_s")
            p_hi = _pairs([r for r in hi if r.status == OK], "runtime_s")
            if p_lo:
                ratio = simple_ratio(p_lo, p_hi, "runtime", "sufficient memory")
            else:
                statuses = ", ".join(sorted({r.status for r in lo}))
                ratio = Ratio(None, undefined=f"no ok run with insufficient memory ({statuses})")
            pressure.append(PressureEffect(wl, th, arm, ratio))

    not_ok = [
        {"cell_id": r.cell_id, "status": r.status, "exit_code": r.exit_code, "notes": r.notes}
        for r in runs
        if r.status != OK
    ]
    return Analysis(summaries, pressure, not_ok)
