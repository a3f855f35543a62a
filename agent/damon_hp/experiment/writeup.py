"""The experiment's write-up, report.md: what was run, where, the headline ratios, figures and
the caveats, for a reader who never opens the code (an agent run's own summary is
damon_hp/report.py). Pure: everything comes in as arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from damon_hp.experiment.analysis import (
    METRICS,
    Analysis,
    ArmSummary,
    GroupSummary,
    Ratio,
    Spread,
)
from damon_hp.experiment.results import OK, RunResult
from damon_hp.experiment.spec import ARMS, Experiment, Skipped, format_duration


@dataclass
class ReportInput:
    experiment: Experiment
    environment: dict[str, Any]
    analysis: Analysis
    runs: list[RunResult]
    planned: int
    command: str
    skipped: list[Skipped] = field(default_factory=list)
    figures: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    figures_error: str | None = None
    limits: dict[str, int] = field(default_factory=dict)
    elapsed_s: float | None = None


def fmt_bytes(x: float | None) -> str:
    if x is None:
        return "n/a"
    if abs(x) >= 2**30:
        return f"{x / 2**30:.2f} GiB"
    return f"{x / 2**20:.1f} MiB"


def fmt_value(x: float | None, unit: str) -> str:
    if x is None:
        return "n/a"
    if unit == "B":
        return fmt_bytes(x)
    if unit == "s":
        return f"{x:.3g} s" if x >= 0.001 or x == 0 else f"{x * 1e9:.3g} ns"
    if unit == "ns":
        return f"{x:.3g} ns"
    if unit == "%":  # whole percents from 10 % on (.2g wrote 100 % as 1e+02), else 2 digits
        return f"{x * 100:.0f}%" if abs(x) >= 0.1 else f"{x * 100:.2g}%"
    if float(x).is_integer() or abs(x) >= 1000:
        return f"{x:.0f}"
    return f"{x:.3g}"


def fmt_spread(s: Spread | None, unit: str) -> str:
    if s is None or s.median is None:
        return "n/a"
    if s.n == 1 or s.lo == s.hi:
        return fmt_value(s.median, unit)
    return f"{fmt_value(s.median, unit)} [{fmt_value(s.lo, unit)}–{fmt_value(s.hi, unit)}]"


def fmt_ratio(r: Ratio | None, percent: bool = False) -> str:
    if r is None:
        return "n/a"
    if r.value is None:
        return r.undefined or "n/a"

    def one(v: float) -> str:
        return f"{v * 100:.0f}%" if percent else f"{v:.2f}"

    text = one(r.value)
    if r.lo is not None and r.hi is not None and r.n > 1:
        text += f" [{one(r.lo)}–{one(r.hi)}]"
    return text


def _runtime_unit(g: GroupSummary) -> str:
    return "ns/op" if g.runtime_basis == "ns per operation" else "s"


def _runtime(s: ArmSummary, g: GroupSummary) -> str:
    sp = s.metrics.get("runtime_s")
    if sp is None or sp.median is None:
        return "n/a"
    if g.runtime_basis == "ns per operation":
        scale = 1e9
        text = f"{sp.median * scale:.3g}"
        if sp.n > 1 and sp.lo != sp.hi:
            text += f" [{sp.lo * scale:.3g}–{sp.hi * scale:.3g}]"  # type: ignore[operator]
        return text
    return fmt_spread(sp, "s").replace(" s", "")


class _Footnotes:
    """Long "undefined: ..." reasons, printed once under a table instead of in every row."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def cell(self, r: Ratio | None, percent: bool = False) -> str:
        if r is not None and r.value is None and r.undefined and r.undefined.startswith(
                "undefined:"):
            if r.undefined not in self.reasons:
                self.reasons.append(r.undefined)
            return f"undefined ({self.reasons.index(r.undefined) + 1})"
        return fmt_ratio(r, percent)

    def lines(self) -> list[str]:
        return [f"({i + 1}) {reason.removeprefix('undefined: ')}"
                for i, reason in enumerate(self.reasons)]


def _percent(sp: Spread | None) -> str:
    if sp is None or sp.median is None:
        return "n/a"
    text = f"{sp.median:.0%}"
    if sp.n > 1 and sp.lo != sp.hi:
        text += f" [{sp.lo:.0%}–{sp.hi:.0%}]"
    return text


def _reached(s: ArmSummary) -> str:
    """Time to hot set huge, saying how many runs got there at all (a median over the runs that
    did would otherwise hide the ones that never did)."""
    t = s.metrics.get("time_to_hot_huge_s")
    frac = s.metrics.get("hot_huge_fraction_final")
    if frac is None or frac.n == 0:
        return "n/a"
    if t is None or t.n == 0:
        return f"never (0 of {frac.n} runs)"
    text = fmt_spread(t, "s")
    if t.n < frac.n:
        text += f" ({t.n} of {frac.n} runs; the others never)"
    return text


def headline_table(g: GroupSummary) -> list[str]:
    unit = _runtime_unit(g)
    notes = _Footnotes()
    lines = [
        f"| arm | runs ok | runtime ({unit}) | runtime / never | speedup preserved | "
        "CPU time (per op) | speedup preserved (CPU) | speedup preserved (CPU, last third) | "
        "peak RSS | THP memory overhead removed | AnonHugePages mean | hot range huge at end | "
        "time to hot set huge | phase before hot set huge | agent CPU (% of a core) | steal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p, s in g.arms.items():
        ok = f"{s.n_ok}" + (f" (+{s.n_not_ok} not ok)" if s.n_not_ok else "")
        cpu_op, cpu_unit = s.metrics.get("cpu_ns_per_op"), "ns"
        if cpu_op is None or cpu_op.median is None:  # fixed work: the CPU time itself
            cpu_op, cpu_unit = s.metrics.get("cpu_s"), "s"
        lines.append(
            f"| {p} | {ok} | {_runtime(s, g)} | {fmt_ratio(s.vs_never.get('runtime_s'))} | "
            f"{notes.cell(s.speedup_preserved, percent=True)} | "
            f"{fmt_spread(cpu_op, cpu_unit)} | "
            f"{notes.cell(s.speedup_preserved_cpu, percent=True) if s.speedup_preserved_cpu else 'n/a'} | "  # noqa: E501
            f"{notes.cell(s.speedup_preserved_late, percent=True) if s.speedup_preserved_late else 'n/a'} | "  # noqa: E501
            f"{fmt_spread(s.metrics.get('peak_rss_bytes'), 'B')} | "
            f"{notes.cell(s.overhead_removed, percent=True)} | "
            f"{fmt_spread(s.metrics.get('anon_huge_mean_bytes'), 'B')} | "
            f"{_percent(s.metrics.get('hot_huge_fraction_final'))} | "
            f"{_reached(s)} | "
            f"{_percent(s.metrics.get('before_hot_huge_frac'))} | "
            f"{fmt_spread(s.metrics.get('agent_cpu_frac'), '%')} | "
            f"{fmt_spread(s.metrics.get('steal_frac'), '%')} |"
        )
    if notes.reasons:
        lines += [""] + [f"{line}  " for line in notes.lines()]
    return lines


def detail_table(g: GroupSummary) -> list[str]:
    arms = list(g.arms)
    lines = ["| metric | " + " | ".join(arms) + " |", "|---" * (len(arms) + 1) + "|"]
    for key, label, unit in METRICS:
        cells = [fmt_spread(g.arms[p].metrics.get(key), unit) for p in arms]
        if all(c == "n/a" for c in cells):
            if key.startswith(("dtlb", "itlb")):
                cells = ["n/a (no PMU)"] * len(cells)
            else:
                continue
        if key == "runtime_s" and g.runtime_basis == "ns per operation":
            label = "runtime per operation"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for key in ("minflt", "dtlb_load_misses"):
        label = dict((k, lab) for k, lab, _ in METRICS)[key]
        cells = [fmt_ratio(g.arms[p].vs_never.get(key)) for p in arms]
        lines.append(f"| {label} / thp-never | " + " | ".join(cells) + " |")
    return lines


def environment_lines(env: dict[str, Any]) -> list[str]:
    where = env.get("where", "?")
    rows = [
        ("where", "inside the test VM (QEMU TCG, emulated CPU)" if where == "vm" else
         "on the host (no global THP change: per-process mechanisms only)"),
        ("kernel", env.get("kernel", "?")),
        ("CPU", f"{env.get('cpu_model', '?')} ({env.get('cpus', '?')} CPUs)"),
        ("memory", fmt_bytes(env.get("mem_total_bytes"))),
        ("THP at start", ", ".join(f"{k}={v}" for k, v in env.get("thp", {}).items()) or "?"),
        ("swap", env.get("swap", "?")),
        ("PMU (TLB counters)", env.get("pmu", "?")),
        ("git commit", env.get("git_commit", "?")),
        ("started", env.get("started_at", "?")),
    ]
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return lines


def caveats(inp: ReportInput) -> list[str]:
    env = inp.environment
    out = []
    if env.get("where") == "vm":
        out.append(
            "Timings come from an emulated CPU (QEMU TCG, no KVM), about 25x slower than the "
            "host and with a software TLB model: absolute times are not hardware times, and "
            "TLB-miss costs are not those of real hardware. Ratios between arms run under "
            "the same emulation are what to read, and even those understate or overstate what "
            "huge pages do on real hardware."
        )
    else:
        out.append(
            "Host runs: THP arms are applied per process (prctl, madvise, process_madvise), "
            "never through the global THP switch; arms that need the switch or a free DAMON "
            "did not run here."
        )
    if not any(r.dtlb_load_misses is not None for r in inp.runs):
        out.append("No hardware PMU: TLB misses are n/a (not zero) everywhere.")
    reps = inp.experiment.repetitions
    if reps < 3:
        out.append(
            f"{reps} repetition(s) per cell: medians and ranges are indicative only; host "
            "timings swing 30%+, so small differences are noise."
        )
    done = len(inp.runs)
    if done < inp.planned:
        out.append(f"Only {done} of {inp.planned} planned runs are finished; tables cover those.")
    return out


def render(inp: ReportInput) -> str:
    exp = inp.experiment
    a = inp.analysis
    counts: dict[str, int] = {}
    for r in inp.runs:
        counts[r.status] = counts.get(r.status, 0) + 1
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"
    lines = [f"# Experiment `{exp.name}`", ""]
    if exp.description:
        lines += [exp.description.strip(), ""]
    lines += [
        f"Made by: `{inp.command}`",
        "",
        f"Runs: {len(inp.runs)} of {inp.planned} planned ({status}); "
        f"{exp.repetitions} repetition(s), interleaved across arms"
        + (f"; took {format_duration(inp.elapsed_s)}" if inp.elapsed_s else "")
        + ".",
        "",
        "## Caveats",
        "",
    ]
    lines += [f"- {c}" for c in caveats(inp)]
    lines += ["", "## Environment", ""] + environment_lines(inp.environment)
    lines += ["", "## Arms", "", "| arm | what it does | how it was applied here |",
              "|---|---|---|"]
    mechanisms: dict[str, str] = {}
    for r in inp.runs:
        mechanisms.setdefault(r.arm, r.mechanism)
    for p in exp.arms:
        lines.append(f"| {p} | {ARMS.get(p, '')} | {mechanisms.get(p, 'not run')} |")
    if inp.skipped:
        lines += ["", "Left out of the matrix:", ""]
        lines += [f"- {s.arm} on {s.workload}: {s.reason}" for s in inp.skipped]

    lines += [
        "",
        "## How to read the numbers",
        "",
        "- Each cell of a table is the median over repetitions, with [min–max] when there is "
        "more than one. Ratios (x / thp-never) are medians divided by medians; their [range] is "
        "the same ratio per repetition, pairing runs of the same repetition (runs are "
        "interleaved, so a repetition's runs saw the same machine state).",
        "- runtime = wall time of the workload (from its exec to its exit, excluding agent "
        "start-up), or ns per operation for benchmarks that run for a fixed time (hotcold).",
        "- speedup preserved = (T_never − T_p) / (T_never − T_always): 100% = as fast as "
        "thp-always, 0% = no faster than thp-never.",
        "- CPU time (per op) = for fixed-time benchmarks that report their measured phase "
        "(hotcold, gups, sparse), the CPU time of all the workload's threads during that phase "
        "(after the set-up that first touches the memory) divided by the operations done in "
        "it; for others the workload's user+sys CPU time (set-up included), per reported "
        "operation, or the CPU time itself for fixed-work programs (streamcluster); speedup "
        "preserved (CPU) is the same ratio from it. \"last third\": the same ratio over the "
        "last third of the measured phase only (from the benchmark's once-a-second progress "
        "lines), where a policy that promotes late (damon-hp through a slow access source) has "
        "had time to act; \"phase before hot set huge\" = time to hot set huge / the measured "
        "phase's length (100% = never), the part of the run such a policy spent on 4 KiB "
        "pages. On a shared host a "
        "workload that waits for a CPU loses wall time, not CPU time, so this one is steadier "
        "there. agent CPU (% of a core) = the arm's own CPU time / the workload's wall time. "
        "steal = the hypervisor's steal as a share of the machine's CPU time during the run "
        "(/proc/stat).",
        "- THP memory overhead removed = (M_always − M_p) / (M_always − M_never), M = peak RSS: "
        "100% = uses no more than thp-never, 0% = as much as thp-always.",
        "- Both ratios are *undefined* (and say why) when thp-always was not faster, or did not "
        "use more memory, than thp-never, or when that difference is within run-to-run noise "
        "(half the min–max range of either baseline, or 1% of thp-never's median; for memory "
        "at least one huge page, 2 MiB).",
        "- time to hot set huge: seconds from the start of the benchmark's hot phase (it prints "
        "its hot range after touching all its memory) until at least 90% of that range was "
        "backed by huge pages, read exactly from the page tables (PAGEMAP_SCAN) at each "
        "sample; only for benchmarks that print their hot range. \"time to agent's hot set "
        "huge\" is damon-hp's own view from its timeline: from its first snapshot with a hot "
        "set until 90% of the hot set it saw was huge.",
    ]
    if inp.limits:
        lines += ["", "Insufficient-memory limits (memory.max, "
                  f"{exp.insufficient.fraction_of_always_peak:.0%} of thp-always's median "
                  "cgroup memory peak with sufficient memory):", ""]
        lines += [f"- {k}: {fmt_bytes(v)}" for k, v in sorted(inp.limits.items())]

    lines += ["", "## Headline", ""]
    for g in a.groups:
        lines += [f"### {g.workload}, {g.threads} thread(s), {g.memory} memory", ""]
        lines += headline_table(g) + [""]

    if a.pressure:
        lines += ["## Memory pressure", "",
                  "Runtime with insufficient memory divided by runtime with sufficient memory "
                  "(same arm, paired by repetition):", "",
                  "| workload | threads | arm | slowdown |", "|---|---|---|---|"]
        for e in a.pressure:
            lines.append(f"| {e.workload} | {e.threads} | {e.arm} | {fmt_ratio(e.slowdown)} |")
        lines.append("")

    lines += ["## Per workload", ""]
    workloads: list[str] = []
    for g in a.groups:
        if g.workload not in workloads:
            workloads.append(g.workload)
    for wl in workloads:
        lines += [f"### {wl}", ""]
        for caption, path in inp.figures.get(wl, []):
            lines += [f"![{caption}]({path})", "", f"*{caption}*", ""]
        for g in a.groups:
            if g.workload != wl:
                continue
            lines += [f"All metrics, {g.threads} thread(s), {g.memory} memory:", ""]
            lines += detail_table(g) + [""]
    if inp.figures_error:
        lines += [f"Figures were not drawn: {inp.figures_error}", ""]

    if a.not_ok:
        lines += ["## Runs that did not finish ok", "", "| run | status | exit code | notes |",
                  "|---|---|---|---|"]
        for d in a.not_ok:
            notes = "; ".join(d.get("notes") or [])
            lines.append(f"| {d['cell_id']} | {d['status']} | {d.get('exit_code')} | {notes} |")
        lines.append("")
    ok = sum(1 for r in inp.runs if r.status == OK)
    lines += ["## Files", "",
              f"- `results.csv`, `results.json`: all {len(inp.runs)} runs ({ok} ok), one row "
              "each, with the environment; `runs/<run>.json`: each run with its samples; "
              "`runs/<run>/`: its stdout, stderr and agent output.",
              "- `analysis.json`: every number in this report.", ""]
    return "\n".join(lines)
