"""One run's result record, and reading/writing the result files of an experiment directory.

Layout of an experiment directory (DIR):
  DIR/runs/<cell id>.json   one finished run each (its existence means: do not run again)
  DIR/runs/<cell id>/       that run's stdout, stderr, agent JSON, working directory
  DIR/limits.json           memory.max chosen for each insufficient group (fixed once measured)
  DIR/environment.json      kernel, host or VM, CPU, THP settings, git commit
  DIR/results.csv/.json     all runs, flat
  DIR/analysis.json, DIR/plots/*.png, DIR/report.md

A metric that could not be measured is None (null in JSON, empty in CSV), never 0.

A run's arm (thp-never, damon-hp, oracle, ...) is its field "arm". Run files written before that
name was chosen call it "policy"; `RunResult.from_dict` reads both, so an old directory resumes
(a finished cell is known by its file name, which never changed) and its report can be rebuilt.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# Run outcomes. Only "ok" runs enter ratios; the others are listed in the report.
OK = "ok"
FAILED = "failed"  # the workload exited non-zero
OOM = "oom"  # the kernel's OOM killer killed something in the run's cgroup
TIMEOUT = "timeout"


@dataclass
class RunResult:
    cell_id: str
    workload: str
    program: str
    input: str | None
    threads: int
    arm: str
    memory: str
    rep: int
    status: str = OK
    exit_code: int | None = None
    where: str = ""  # "vm" or "host"
    mechanism: str = ""  # how the arm was applied (global THP mode, prctl, damo, agent)
    started_at: str = ""  # wall-clock ISO time, for the reader
    # time
    wall_s: float | None = None
    user_s: float | None = None
    sys_s: float | None = None
    # the workload's own figure of merit when it runs for a fixed time (ns per operation)
    ns_per_op: float | None = None
    ops: int | None = None  # operations it reported (fixed-time benchmarks)
    # the measured phase of a fixed-time benchmark (after its set-up), as it reports it: length,
    # CPU time of all its threads, and wall and CPU time per operation over the phase's last
    # third (workloads.LATE_FRACTION), where a late promotion has had time to act
    phase_s: float | None = None
    phase_cpu_s: float | None = None
    late_from_s: float | None = None
    late_ns_per_op: float | None = None
    late_cpu_ns_per_op: float | None = None
    # hypervisor steal during the run, as a share of all CPU time of the machine (/proc/stat)
    steal_frac: float | None = None
    # faults
    minflt: int | None = None
    majflt: int | None = None
    # memory
    peak_rss_bytes: int | None = None
    mean_rss_bytes: float | None = None
    anon_huge_peak_bytes: int | None = None
    anon_huge_mean_bytes: float | None = None
    pte_peak_bytes: int | None = None
    swap_peak_bytes: int | None = None
    cgroup_peak_bytes: int | None = None
    memory_max_bytes: int | None = None
    oom_kills: int | None = None
    # TLB (perf; None without a PMU)
    dtlb_load_misses: int | None = None
    dtlb_store_misses: int | None = None
    itlb_load_misses: int | None = None
    # cost of the arm itself
    agent_cpu_s: float | None = None
    kdamond_cpu_s: float | None = None
    # ground truth: how fast and how fully the hot set became huge-page backed
    time_to_hot_huge_s: float | None = None
    hot_huge_fraction_final: float | None = None
    # the agent's own view (damon-hp): first hot snapshot -> 90% of its hot set huge
    agent_hot_huge_s: float | None = None
    # physical access sources: the least share of the target's resident memory that lay in
    # the physical memory the kdamond monitors, over the run (the rest gave no evidence)
    watched_share_min: float | None = None
    accounting: str = ""  # where user/sys/faults came from: "cgroup" or "wait4"
    # app workloads (experiment/apps/): one entry per measured client test (throughput,
    # latency, server CPU per request, steal, memory), and the run's other facts (collapses,
    # churn, marks in time)
    phases: list[dict[str, Any]] = field(default_factory=list)
    app: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        names = {f.name for f in fields(cls)}
        if "arm" not in d and "policy" in d:
            d = {**d, "arm": d["policy"]}  # written before the arms were renamed (see module)
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def runtime_s(self) -> float | None:
        """Time for a fixed amount of work: wall time, or ns/op for fixed-duration benchmarks."""
        if self.ns_per_op is not None:
            return self.ns_per_op * 1e-9
        return self.wall_s

    @property
    def cpu_s(self) -> float | None:
        if self.user_s is None or self.sys_s is None:
            return None
        return self.user_s + self.sys_s

    @property
    def cpu_ns_per_op(self) -> float | None:
        """The workload's CPU time per reported operation: on a shared, noisy host steadier than
        wall time per operation. Over the measured phase alone when the benchmark reports it
        (set-up excluded: faulting in 4 GiB, with thp-always's compaction, would otherwise
        weigh as much as the speed it measures), else user+sys of the whole process."""
        cpu = self.phase_cpu_s if self.phase_cpu_s is not None else self.cpu_s
        if cpu is None or not self.ops:
            return None
        return cpu * 1e9 / self.ops

    @property
    def before_hot_huge_frac(self) -> float | None:
        """Share of the measured phase that passed before 90% of the hot set was huge (1.0 when
        it never was): how much of the run a late policy spent on 4 KiB pages."""
        if not self.phase_s or self.hot_huge_fraction_final is None:
            return None
        if self.time_to_hot_huge_s is None:
            return 1.0
        return min(1.0, max(0.0, self.time_to_hot_huge_s / self.phase_s))

    @property
    def agent_cpu_frac(self) -> float | None:
        """The arm's own CPU time (agent, damo, collapse thread) as a share of one core over the
        workload's wall time."""
        if self.agent_cpu_s is None or not self.wall_s:
            return None
        return self.agent_cpu_s / self.wall_s


SCALAR_FIELDS = [f.name for f in fields(RunResult)
                 if f.name not in ("notes", "samples", "phases", "app")]


def write_json_atomic(path: Path, data: Any) -> None:
    """Write then rename, so an interrupted write never leaves a half file that looks finished."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


def run_path(out: Path, cell_id: str) -> Path:
    return out / "runs" / f"{cell_id}.json"


def save_run(out: Path, result: RunResult) -> Path:
    path = run_path(out, result.cell_id)
    write_json_atomic(path, result.to_dict())
    return path


def load_runs(out: Path) -> list[RunResult]:
    runs = []
    for p in sorted((out / "runs").glob("*.json")):
        runs.append(RunResult.from_dict(json.loads(p.read_text())))
    return runs


def write_tables(out: Path, runs: list[RunResult], environment: dict[str, Any]) -> None:
    """results.csv (scalars, one row per run) and results.json (everything + environment)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SCALAR_FIELDS + ["notes"])
        w.writeheader()
        for r in runs:
            row = {k: getattr(r, k) for k in SCALAR_FIELDS}
            row = {k: ("" if v is None else v) for k, v in row.items()}
            row["notes"] = "; ".join(r.notes)
            w.writerow(row)
    write_json_atomic(
        out / "results.json",
        {"environment": environment, "runs": [r.to_dict() for r in runs]},
    )
