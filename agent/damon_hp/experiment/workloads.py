"""Turn an experiment's workload (program + input set, or program + args) and a thread count into
a command: argv, working directory and stdin.

PARSEC input sets go through workloads/inputsets.py (the workloads' own single place for
(program, set, threads) -> command); explicit args are used as given, with `{threads}` replaced.
Fixed-time benchmarks report their own figure of merit on stdout; `figure_of_merit` reads it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from damon_hp.errors import EnvironmentProblem
from damon_hp.experiment.spec import COMPACT_VARIANTS, Workload
from damon_hp.ranges import AddrRange

PROJECT_ROOT = Path(__file__).resolve().parents[3]
WORKLOADS_DIR = PROJECT_ROOT / "workloads"
BIN_DIR = WORKLOADS_DIR / "bin"


@dataclass(frozen=True)
class Command:
    argv: list[str]
    cwd: Path
    stdin: Path | None


_MODULE_NAME = "damon_hp_workloads_inputsets"


def _inputsets() -> ModuleType:
    """workloads/inputsets.py, imported by path (workloads/ is not a package)."""
    if _MODULE_NAME in sys.modules:
        return sys.modules[_MODULE_NAME]
    path = WORKLOADS_DIR / "inputsets.py"
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
    if spec is None or spec.loader is None or not path.exists():
        raise EnvironmentProblem(f"{path} is missing: it maps (program, set, threads) to a "
                                 "command; restore it from git")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE_NAME] = mod  # its dataclasses look their module up while being built
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[_MODULE_NAME]
        raise
    return mod


def program_for(workload: Workload, arm: str) -> str:
    """The binary an arm runs: the -compact variant for damon-hp-compact."""
    if arm == "damon-hp-compact":
        return COMPACT_VARIANTS[workload.program]
    return workload.program


def resolve(workload: Workload, threads: int, arm: str, rundir: Path) -> Command:
    """The command for one run; `rundir` is its private working directory (created here)."""
    program = program_for(workload, arm)
    binary = BIN_DIR / program
    if not binary.exists():
        raise EnvironmentProblem(
            f"{binary} is not built; run `make workloads` (or `make setup`)"
        )
    rundir.mkdir(parents=True, exist_ok=True)
    if workload.input is not None:
        mod = _inputsets()
        try:
            spec = mod.command(program, workload.input, threads, rundir=rundir)
        except ValueError as e:  # InputSetError
            raise EnvironmentProblem(f"workload {workload.name}: {e}") from None
        argv = list(spec.argv)
        return Command(argv, Path(spec.cwd), Path(spec.stdin) if spec.stdin else None)
    args = [a.replace("{threads}", str(threads)) for a in workload.args or ()]
    return Command([str(binary), *args], rundir, None)


def check_built(programs: set[str]) -> list[str]:
    """Programs of `programs` that are not in workloads/bin."""
    return sorted(p for p in programs if not (BIN_DIR / p).exists() and not shutil.which(p))


def _json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def ground_truth_env(program: str) -> dict[str, str]:
    """Environment that makes a program print its hot ranges (set for every arm alike)."""
    return {"WATER_NSQUARED_JSON": "1"} if program == "water_nsquared" else {}


def _range(d: object) -> AddrRange | None:
    if isinstance(d, dict) and isinstance(d.get("start"), int) and isinstance(d.get("end"), int) \
            and 0 <= d["start"] < d["end"]:
        return AddrRange(int(d["start"]), int(d["end"]))
    return None


def hot_ranges(text: str) -> list[AddrRange] | None:
    """The ground-truth hot ranges a program printed, if any: hotcold's and sparse's
    {"hot": {...}}, gups's {"table": {...}} (all of it is read at random), or
    water_nsquared's {"event": "layout"} (VAR and each thread's PFORCES node run, the large
    hot data of workloads-spec B.19)."""
    for obj in _json_lines(text):
        hot = _range(obj.get("hot")) or _range(obj.get("table"))
        if hot:
            return [hot]
        if obj.get("event") == "layout":
            ranges = [_range(obj.get("VAR"))]
            for p in obj.get("pforces") or []:
                ranges.append(_range(p.get("nodes")) if isinstance(p, dict) else None)
            found = [r for r in ranges if r is not None]
            return found or None
    return None


def operations(stdout_text: str) -> int | None:
    """Operations a fixed-time benchmark reports doing (hotcold/sparse/phases `ops`, gups
    `updates`), else None."""
    for obj in reversed(_json_lines(stdout_text)):
        for key in ("ops", "updates"):
            v = obj.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0 and (
                    "seconds" in obj):
                return v
    return None


def figure_of_merit(stdout_text: str) -> float | None:
    """ns per operation reported by a fixed-time benchmark (hotcold, phases, gups), else None."""
    for obj in reversed(_json_lines(stdout_text)):
        if isinstance(obj.get("ns_per_update"), int | float):
            return float(obj["ns_per_update"])
        rate = obj.get("ops_per_s")
        if isinstance(rate, int | float) and rate > 0:
            return 1e9 / float(rate)
    return None


# The late part of a fixed-time benchmark's measured phase: its last third. A policy that backs
# the hot set with huge pages some seconds into the run (damon-hp through a slow access source)
# is judged over the whole phase, delay included, and over this window, the same for every arm,
# which shows what it keeps once it has promoted.
LATE_FRACTION = 1 / 3


@dataclass(frozen=True)
class Phase:
    """What a fixed-time benchmark says about its measured phase (after its set-up)."""

    seconds: float
    cpu_s: float | None = None  # CPU time of all its threads during the phase
    late_from_s: float | None = None  # where the late window starts, seconds into the phase
    late_ns_per_op: float | None = None
    late_cpu_ns_per_op: float | None = None


def _num(obj: dict, key: str) -> float | None:
    v = obj.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def measured_phase(stdout_text: str) -> Phase | None:
    """The measured phase of a fixed-time benchmark that prints its phase CPU time ("cpu_s" in
    its final line) and, once a second, {"progress": {"t", "ops", "cpu_s"}}; None for others."""
    objs = _json_lines(stdout_text)
    final = next((o for o in reversed(objs) if "stopped_by" in o and "seconds" in o), None)
    if final is None:
        return None
    seconds = _num(final, "seconds")
    ops = next((_num(final, k) for k in ("ops", "updates") if _num(final, k)), None)
    if not seconds or not ops:
        return None
    cpu = _num(final, "cpu_s")
    points = [(_num(p, "t"), _num(p, "ops"), _num(p, "cpu_s"))
              for o in objs if isinstance(p := o.get("progress"), dict)]
    late_from = seconds * (1 - LATE_FRACTION)
    start = next(((t, n, c) for t, n, c in points
                  if t is not None and n is not None and t >= late_from), None)
    if start is None or start[0] is None or start[1] is None or ops <= start[1] \
            or seconds - start[0] < 1.0:
        return Phase(seconds, cpu)
    t_a, n_a, c_a = start
    late_ops = ops - n_a
    late_cpu = None
    if cpu is not None and c_a is not None and cpu >= c_a:
        late_cpu = (cpu - c_a) * 1e9 / late_ops
    return Phase(seconds, cpu, t_a, (seconds - t_a) * 1e9 / late_ops, late_cpu)
