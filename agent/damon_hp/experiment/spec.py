"""Experiment files: TOML in, validated dataclasses out, and the run matrix they expand to.

An experiment file names arms, workloads (program + input set, or program + explicit args),
thread counts, memory conditions and a repetition count; `expand` turns it into the ordered list
of cells the runner executes. An arm is one way of backing memory that the experiment compares
(thp-never, damos-ethp, damon-hp, oracle, ...). Files written before the arms had that name say
`policies` for `arms` and `[policy.NAME]` for `[arm.NAME]`: both are still read (OLD_NAMES).
Order matters twice:

* interleaving: one repetition runs every arm once before the next repetition starts, and the
  arm order rotates by one each repetition, so slow drift of the machine (and any cost of
  coming right after a given arm) spreads over all arms instead of biasing one;
* dependencies: the `insufficient` memory limit is a fraction of thp-always's measured peak, so in
  every repetition the `sufficient` cells of a workload run before its `insufficient` cells.

Nothing here touches the system.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from damon_hp import sizes
from damon_hp.errors import DamonHpError, EnvironmentProblem

ARMS: dict[str, str] = {
    "thp-never": "no huge pages (system THP mode never)",
    "thp-always": "huge pages everywhere (system THP mode always)",
    "thp-madvise": "huge pages only where the program asks (system THP mode madvise)",
    "damos-ethp": "DAMON's example 'ethp' DAMOS scheme through damo (system THP madvise)",
    "damos-collapse": "upstream's DAMOS collapse action through damo: regions >= 2 MiB at "
    ">= 5 % access, 100 MiB/s quota (Linux 7.2+; system THP madvise)",
    "damon-hp": "damon-hp run with its defaults",
    "damon-hp-compact": "the program's -compact variant (small hot arrays in one huge page) "
    "under damon-hp",
    "oracle": "collapse exactly the hot ranges the benchmark prints (upper bound)",
    "everywhere": "every anonymous range of the server collapsed with "
    "process_madvise(MADV_COLLAPSE) after warm-up (app workloads; upper bound)",
}
BASELINE = "thp-never"
ALWAYS = "thp-always"
MEMORY_CONDITIONS = ("sufficient", "insufficient")
WHERE = ("vm", "host")

# Programs that print their hot ranges as JSON (the oracle needs ground truth): hotcold and
# sparse on stdout ("hot"), gups on stdout (its whole "table" is read at random),
# water_nsquared on stderr with WATER_NSQUARED_JSON=1 (VAR and each thread's force run).
GROUND_TRUTH_PROGRAMS = frozenset({"hotcold", "sparse", "gups", "water_nsquared"})
# Programs with a -compact variant (the thesis's second scheme).
COMPACT_VARIANTS = {"streamcluster": "streamcluster-compact"}
# Real applications (experiment/apps/): a server the runner starts, its loader and its client.
# Their server binary is the workload's program; only these arms apply to them.
APPS = {"redis": "redis-server", "mariadb": "mariadbd", "redis-ycsb": "redis-server",
        "mariadb-ycsb": "mariadbd"}
APP_ARMS = ("thp-never", "everywhere", "damon-hp")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")

# Old key names, from when the arms were called policies (the agent's decision rule is its
# policy): still accepted, so existing experiment files keep working.
OLD_NAMES = {"arms": "policies", "arm": "policy"}
OLD_NAMES_NOTE = "(old files may say `policies` for `arms` and [policy.NAME] for [arm.NAME])"


class SpecError(DamonHpError):
    """The experiment file is wrong; the message says where and how to fix it."""

    exit_code = 2


@dataclass(frozen=True)
class Workload:
    """One program configuration; `threads` expands into one cell per count."""

    program: str
    input: str | None = None
    args: tuple[str, ...] | None = None
    threads: tuple[int, ...] = (1,)
    label: str = ""
    # Optional narrowing of the experiment-wide lists for this workload only.
    arms: tuple[str, ...] | None = None
    memory: tuple[str, ...] | None = None
    # An application workload (APPS): its name and its [workloads.params] (checked by the app).
    app: str | None = None
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, key: str, default: Any) -> Any:
        return dict(self.params).get(key, default)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        return f"{self.program}-{self.input}" if self.input else self.program


@dataclass(frozen=True)
class Insufficient:
    """How the `insufficient` memory condition is made."""

    fraction_of_always_peak: float = 0.6
    swap: str = "zram"  # zram | none
    swap_bytes: int = 1 << 30
    # Arms that also run with insufficient memory (None: all), to keep big matrices short.
    arms: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ArmOptions:
    """Per-arm knobs: the system THP mode it runs under and extra agent arguments."""

    thp: str | None = None
    agent_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    where: str
    repetitions: int
    arms: tuple[str, ...]
    memory: tuple[str, ...]
    workloads: tuple[Workload, ...]
    insufficient: Insufficient = field(default_factory=Insufficient)
    sample_interval_s: float = 0.5
    timeout_s: float = 600.0
    warmup: bool = True
    expected_duration: str = ""
    arm_options: dict[str, ArmOptions] = field(default_factory=dict)
    source: str = ""

    def options(self, arm: str) -> ArmOptions:
        return self.arm_options.get(arm, ArmOptions())


@dataclass(frozen=True)
class Cell:
    """One run: the unit of resumption (one result file per cell)."""

    workload: Workload
    threads: int
    arm: str
    memory: str
    rep: int

    @property
    def id(self) -> str:
        return f"{self.workload.name}_t{self.threads}_{self.arm}_{self.memory}_r{self.rep}"

    @property
    def group(self) -> tuple[str, int, str]:
        """Cells that are compared with each other: same workload, threads and memory."""
        return (self.workload.name, self.threads, self.memory)


@dataclass(frozen=True)
class Skipped:
    """A combination the matrix leaves out, and why (shown in the report)."""

    workload: str
    arm: str
    reason: str


def _fail(where: str, what: str) -> SpecError:
    return SpecError(f"experiment file: {where}: {what}")


def _renamed(table: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """`table` with the old name of `key` (OLD_NAMES) read as `key`; both at once is an error."""
    old = OLD_NAMES[key]
    if old not in table:
        return table
    if key in table:
        raise _fail(where, f"has both {key!r} and its old name {old!r}; keep only {key!r}")
    out = dict(table)
    out[key] = out.pop(old)
    return out


def _str_list(value: Any, where: str, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _fail(where, f"expected a non-empty list of strings, got {value!r}")
    if allowed is not None:
        for v in value:
            if v not in allowed:
                raise _fail(where, f"unknown value {v!r}; choose from {', '.join(allowed)}")
    if len(set(value)) != len(value):
        raise _fail(where, f"duplicate entries in {value!r}")
    return tuple(value)


def parse_size(text: str | int | float) -> int:
    """'512M', '2G', '4096' -> bytes, more than 0 (sizes.parse_size: 1024-based suffixes, as the
    workloads parse them)."""
    if isinstance(text, int) and not isinstance(text, bool) and text <= 0:
        raise ValueError(f"size must be > 0, got {text}")
    # TOML reads `swap_size = 1e9` as a float; this parser has always read one through its text.
    value = sizes.parse_size(str(text) if isinstance(text, float) else text)
    if value <= 0:
        raise ValueError(f"size must be > 0, got {text!r}")
    return value


def _workload(raw: Any, i: int) -> Workload:
    where = f"[[workloads]] #{i + 1}"
    if not isinstance(raw, dict):
        raise _fail(where, "must be a table")
    raw = _renamed(raw, "arms", where)
    known = {"program", "input", "args", "threads", "label", "arms", "memory", "app", "params"}
    extra = set(raw) - known
    if extra:
        raise _fail(where, f"unknown keys {sorted(extra)}; known: {sorted(known)}")
    if "app" in raw:
        return _app_workload(raw, where)
    program = raw.get("program")
    if not isinstance(program, str) or not _NAME_RE.match(program):
        raise _fail(where, f"'program' must be a program name in workloads/bin, got {program!r}")
    inp = raw.get("input")
    args = raw.get("args")
    if (inp is None) == (args is None):
        raise _fail(
            where,
            f"{program}: give exactly one of 'input' (a PARSEC input set such as 'simsmall') "
            "or 'args' (the program's arguments; '{threads}' is replaced by the thread count)",
        )
    if inp is not None and (not isinstance(inp, str) or not _NAME_RE.match(inp)):
        raise _fail(where, f"'input' must be an input-set name, got {inp!r}")
    if args is not None:
        if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
            raise _fail(where, f"'args' must be a list of strings, got {args!r}")
        args = tuple(str(a) for a in args)
    threads = raw.get("threads", [1])
    if isinstance(threads, int):
        threads = [threads]
    if (
        not isinstance(threads, list)
        or not threads
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in threads)
        or len(set(threads)) != len(threads)
    ):
        raise _fail(where, f"'threads' must be a list of distinct integers >= 1, got {threads!r}")
    label = raw.get("label", "")
    if label and (not isinstance(label, str) or not _NAME_RE.match(label)):
        raise _fail(where, f"'label' must be a simple name (letters, digits, -_.+), got {label!r}")
    arms = raw.get("arms")
    memory = raw.get("memory")
    return Workload(
        program=program,
        input=inp,
        args=args,
        threads=tuple(threads),
        label=label,
        arms=_str_list(arms, f"{where}.arms", tuple(ARMS)) if arms else None,
        memory=_str_list(memory, f"{where}.memory", MEMORY_CONDITIONS) if memory else None,
    )


def _app_workload(raw: dict[str, Any], where: str) -> Workload:
    """`app = "redis"` (or mariadb) with an optional [workloads.params] table: the server, its
    loader and its client come from experiment/apps/, which checks the params."""
    app = raw["app"]
    if app not in APPS:
        raise _fail(f"{where}.app", f"unknown app {app!r}; choose from {', '.join(APPS)}")
    extra = set(raw) - {"app", "params", "label", "arms", "threads"}
    if extra:
        raise _fail(where, f"an app workload takes app, params, label, arms and threads; "
                    f"remove {sorted(extra)}")
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise _fail(f"{where}.params", "must be a table of the app's parameters")
    from damon_hp.experiment.apps import check_params

    try:
        check_params(app, params)
    except ValueError as e:
        raise _fail(f"{where}.params", str(e)) from None
    label = raw.get("label", "")
    if label and (not isinstance(label, str) or not _NAME_RE.match(label)):
        raise _fail(where, f"'label' must be a simple name (letters, digits, -_.+), got {label!r}")
    threads = raw.get("threads", [1])
    if isinstance(threads, int):
        threads = [threads]
    if (not isinstance(threads, list) or not threads
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1
                       for t in threads)):
        raise _fail(where, f"'threads' (client connections) must be integers >= 1, "
                    f"got {threads!r}")
    arms = raw.get("arms")
    return Workload(
        program=APPS[app], threads=tuple(threads), label=label or app,
        arms=_str_list(arms, f"{where}.arms", APP_ARMS) if arms else None,
        # lists as tuples: a Workload stays hashable
        app=app, params=tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                     for k, v in params.items())),
    )


def parse(data: dict[str, Any], source: str = "<string>") -> Experiment:
    """Validate a decoded TOML document. Every error names the key and what is allowed."""
    data = _renamed(data, "arm", "top level")
    known = {"experiment", "workloads", "insufficient", "arm"}
    extra = set(data) - known
    if extra:
        raise _fail("top level", f"unknown tables {sorted(extra)}; known: {sorted(known)}")
    exp = data.get("experiment")
    if not isinstance(exp, dict):
        raise _fail("[experiment]", "missing; it holds name, arms, memory, repetitions "
                    + OLD_NAMES_NOTE)
    exp = _renamed(exp, "arms", "[experiment]")
    known_exp = {
        "name", "description", "where", "repetitions", "arms", "memory",
        "sample_interval_s", "timeout_s", "expected_duration", "warmup",
    }  # fmt: skip
    extra = set(exp) - known_exp
    if extra:
        raise _fail("[experiment]", f"unknown keys {sorted(extra)}; known: {sorted(known_exp)}")
    name = exp.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise _fail("[experiment].name", f"must be a simple name, got {name!r}")
    where = exp.get("where", "vm")
    if where not in WHERE:
        raise _fail("[experiment].where", f"must be one of {WHERE}, got {where!r}")
    reps = exp.get("repetitions", 3)
    if not isinstance(reps, int) or isinstance(reps, bool) or reps < 1:
        raise _fail("[experiment].repetitions", f"must be an integer >= 1, got {reps!r}")
    arms = _str_list(exp.get("arms"), "[experiment].arms", tuple(ARMS))
    if BASELINE not in arms:
        raise _fail(
            "[experiment].arms",
            f"must include {BASELINE!r}: every ratio is normalised to it",
        )
    memory = _str_list(exp.get("memory", ["sufficient"]), "[experiment].memory",
                       MEMORY_CONDITIONS)
    if "insufficient" in memory and "sufficient" not in memory:
        raise _fail("[experiment].memory", "'insufficient' needs 'sufficient' too: its limit is "
                    "a fraction of thp-always's peak measured with sufficient memory")
    if "insufficient" in memory and ALWAYS not in arms:
        raise _fail("[experiment].arms", "'insufficient' memory needs 'thp-always' in the "
                    "arms: its limit is a fraction of thp-always's measured peak")
    interval = exp.get("sample_interval_s", 0.5)
    if not isinstance(interval, int | float) or not 0.01 <= interval <= 60:
        raise _fail("[experiment].sample_interval_s", f"must be 0.01..60 s, got {interval!r}")
    timeout = exp.get("timeout_s", 600)
    if not isinstance(timeout, int | float) or timeout <= 0:
        raise _fail("[experiment].timeout_s", f"must be > 0 seconds, got {timeout!r}")

    raw_workloads = data.get("workloads")
    if not isinstance(raw_workloads, list) or not raw_workloads:
        raise _fail("[[workloads]]", "at least one workload table is needed")
    workloads = tuple(_workload(w, i) for i, w in enumerate(raw_workloads))
    if len({w.app is None for w in workloads}) > 1:
        raise _fail("[[workloads]]", "app workloads (app = ...) and programs cannot share an "
                    "experiment file: their runs and reports differ; put them in two files")
    if workloads[0].app is not None:
        if where != "host":
            raise _fail("[experiment].where", 'app workloads run on the host only (where = '
                        '"host"): the servers and their data do not fit the test VM')
        wrong = [a for a in arms if a not in APP_ARMS]
        if wrong:
            raise _fail("[experiment].arms", f"app workloads take the arms "
                        f"{', '.join(APP_ARMS)}; remove {', '.join(wrong)}")
        if memory != ("sufficient",):
            raise _fail("[experiment].memory", "app workloads run with sufficient memory only")
    names = [w.name for w in workloads]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise _fail("[[workloads]]", f"two workloads are both named {dupes}; add 'label' to one")

    ins_raw = data.get("insufficient", {})
    if not isinstance(ins_raw, dict):
        raise _fail("[insufficient]", "must be a table")
    ins_raw = _renamed(ins_raw, "arms", "[insufficient]")
    extra = set(ins_raw) - {"fraction_of_always_peak", "swap", "swap_size", "arms"}
    if extra:
        raise _fail("[insufficient]", f"unknown keys {sorted(extra)}")
    frac = ins_raw.get("fraction_of_always_peak", 0.6)
    if not isinstance(frac, int | float) or not 0.05 <= frac < 1:
        raise _fail("[insufficient].fraction_of_always_peak", f"must be 0.05..0.99, got {frac!r}")
    swap = ins_raw.get("swap", "zram")
    if swap not in ("zram", "none"):
        raise _fail("[insufficient].swap", f"must be 'zram' or 'none', got {swap!r}")
    try:
        swap_bytes = parse_size(ins_raw.get("swap_size", "1G"))
    except ValueError as e:
        raise _fail("[insufficient].swap_size", str(e)) from None
    ins_arms = None
    if "arms" in ins_raw:
        ins_arms = _str_list(ins_raw["arms"], "[insufficient].arms", arms)
        for needed in (BASELINE, ALWAYS):
            if needed not in ins_arms:
                raise _fail("[insufficient].arms", f"must include {needed!r}: the ratios "
                            "under memory pressure are relative to it")

    arm_tables = data.get("arm", {})
    if not isinstance(arm_tables, dict):
        raise _fail("[arm.NAME]", "must be tables named after arms")
    options: dict[str, ArmOptions] = {}
    for aname, araw in arm_tables.items():
        where_a = f"[arm.{aname}]"
        if aname not in ARMS:
            raise _fail(where_a, f"unknown arm; choose from {', '.join(ARMS)}")
        if not isinstance(araw, dict) or set(araw) - {"thp", "agent_args"}:
            raise _fail(where_a, "allowed keys: thp (never|madvise|always), agent_args (list)")
        thp = araw.get("thp")
        if thp is not None and thp not in ("never", "madvise", "always"):
            raise _fail(f"{where_a}.thp", f"must be never, madvise or always, got {thp!r}")
        if thp is not None and aname in ("thp-never", "thp-always", "thp-madvise"):
            raise _fail(f"{where_a}.thp", "the thp-* arms are defined by their THP mode")
        agent_args = araw.get("agent_args", [])
        if not isinstance(agent_args, list) or not all(isinstance(a, str) for a in agent_args):
            raise _fail(f"{where_a}.agent_args", "must be a list of strings")
        if agent_args and aname not in ("damon-hp", "damon-hp-compact"):
            raise _fail(f"{where_a}.agent_args", "only the damon-hp arms take agent_args")
        options[aname] = ArmOptions(thp=thp, agent_args=tuple(agent_args))

    warmup = exp.get("warmup", True)
    if not isinstance(warmup, bool):
        raise _fail("[experiment].warmup", f"must be true or false, got {warmup!r}")
    description = exp.get("description", "")
    expected = exp.get("expected_duration", "")
    if not isinstance(description, str) or not isinstance(expected, str):
        raise _fail("[experiment]", "description and expected_duration must be strings")
    return Experiment(
        name=name,
        description=description,
        where=where,
        repetitions=reps,
        arms=arms,
        memory=memory,
        workloads=workloads,
        insufficient=Insufficient(float(frac), swap, swap_bytes, ins_arms),
        sample_interval_s=float(interval),
        timeout_s=float(timeout),
        warmup=warmup,
        expected_duration=expected,
        arm_options=options,
        source=source,
    )


def load(path: str | Path) -> Experiment:
    """Read and validate an experiment file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise EnvironmentProblem(
            f"cannot read experiment file {p}: {e.strerror}; "
            "the bundled ones are experiments/smoke.toml, quick.toml and thesis.toml"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"experiment file {p}: not valid TOML: {e}") from None
    return parse(data, source=str(p))


def applicable(workload: Workload, arm: str) -> str | None:
    """None when `arm` can run `workload`, else the reason it cannot."""
    if workload.app is not None and arm not in APP_ARMS:
        return f"app workloads take the arms {', '.join(APP_ARMS)}"
    if workload.app is None and arm == "everywhere":
        return "everywhere is for app workloads (a server collapsed after its warm-up)"
    if arm == "oracle" and workload.program not in GROUND_TRUTH_PROGRAMS:
        return (
            f"{workload.program} does not print its hot ranges; the oracle needs a "
            f"program that prints them ({', '.join(sorted(GROUND_TRUTH_PROGRAMS))})"
        )
    if arm == "damon-hp-compact" and workload.program not in COMPACT_VARIANTS:
        return f"{workload.program} has no -compact variant"
    return None


def _rotate(items: tuple[str, ...], k: int) -> tuple[str, ...]:
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]


def expand(exp: Experiment) -> tuple[list[Cell], list[Skipped]]:
    """The cells in run order, and the arm/workload pairs left out (with reasons)."""
    cells: list[Cell] = []
    skipped: dict[tuple[str, str], Skipped] = {}
    for rep in range(exp.repetitions):
        for w in exp.workloads:
            arms = tuple(p for p in exp.arms if w.arms is None or p in w.arms)
            runnable = []
            for p in arms:
                reason = applicable(w, p)
                if reason:
                    skipped[(w.name, p)] = Skipped(w.name, p, reason)
                else:
                    runnable.append(p)
            memory = tuple(m for m in exp.memory if w.memory is None or m in w.memory)
            for threads in w.threads:
                for mem in MEMORY_CONDITIONS:  # sufficient first: it measures the limit
                    if mem not in memory:
                        continue
                    chosen = tuple(
                        p for p in runnable
                        if mem == "sufficient" or exp.insufficient.arms is None
                        or p in exp.insufficient.arms
                    )
                    for p in _rotate(chosen, rep):
                        cells.append(Cell(w, threads, p, mem, rep))
    return cells, list(skipped.values())


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
