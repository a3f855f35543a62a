"""report.md for app experiments: per workload and client test a table of the arms (median
[min–max] over the interleaved repetitions), the memory and the arms' own cost, and the issue's
targets as rows, each met or not with its numbers. Pure: run records in, Markdown out.

Noise, as in analysis.py: half the min..max range of thp-never's runs, or 1 % of its median,
whichever is larger. "No worse than thp-never beyond noise" = damon-hp's median within that
noise of thp-never's median, or better. "Less memory than everywhere" = less by more than the
runs' own spread (half of either arm's min..max range), and at least one huge page.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from damon_hp.experiment.results import OK, RunResult
from damon_hp.experiment.spec import Experiment
from damon_hp.experiment.writeup import fmt_bytes

NEVER, EVERYWHERE, DAMON = "thp-never", "everywhere", "damon-hp"
NOISE_FLOOR = 0.01
# per app, as its issue set them (issue 21: 70 % on Redis GET/SET; issue 23: 80 % on YCSB C)
CPU_GAIN_TARGET = {"redis": 0.7, "redis-ycsb": 0.8}
MEMORY_BELOW_EVERYWHERE = {"mariadb-ycsb": 400 << 20}  # RSS at least this far below everywhere's
RSS_TARGET = 0.02
MIN_MEMORY_GAP = 2 << 20  # one huge page: a smaller memory difference is no difference


@dataclass(frozen=True)
class Stat:
    median: float
    lo: float
    hi: float
    n: int

    @property
    def noise(self) -> float:
        return max((self.hi - self.lo) / 2, NOISE_FLOOR * abs(self.median))


def stat(values: list[float | None]) -> Stat | None:
    vs = [float(v) for v in values if v is not None]
    if not vs:
        return None
    return Stat(statistics.median(vs), min(vs), max(vs), len(vs))


def fmt(s: Stat | None, unit: str = "", digits: int = 3) -> str:
    if s is None:
        return "n/a"

    def one(v: float) -> str:
        if unit == "B":
            return fmt_bytes(v)
        if unit == "%":
            return f"{v * 100:.1f} %"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"

    if s.n == 1 or s.lo == s.hi:
        return one(s.median) + ("" if unit in ("B", "%") else f" {unit}".rstrip())
    return (f"{one(s.median)} [{one(s.lo)}–{one(s.hi)}]"
            + ("" if unit in ("B", "%") else f" {unit}".rstrip()))


def _phase(r: RunResult, test: str) -> dict[str, Any] | None:
    return next((p for p in r.phases if p.get("test") == test), None)


def _get(d: dict[str, Any] | None, *path: str) -> Any:
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def huge_90_after_warmup(r: RunResult) -> float | None:
    """Seconds from the end of the warm-up until AnonHugePages first reached 90 % of its
    peak: when the arm's collapses took effect."""
    peak = max((s.get("anon_huge") or 0 for s in r.samples), default=0)
    start = _get(r.app, "marks", "warmed_up")
    if not peak or start is None:
        return None
    for s in r.samples:
        if (s.get("anon_huge") or 0) >= 0.9 * peak:
            return max(0.0, s["t"] - start)
    return None


class Runs:
    """The ok runs of one workload, by arm."""

    def __init__(self, runs: list[RunResult]) -> None:
        self.by_arm: dict[str, list[RunResult]] = {}
        for r in runs:
            if r.status == OK:
                self.by_arm.setdefault(r.arm, []).append(r)

    def stat(self, arm: str, value: Callable[[RunResult], Any]) -> Stat | None:
        return stat([value(r) for r in self.by_arm.get(arm, [])])

    def phase_stat(self, arm: str, test: str, key: str) -> Stat | None:
        return self.stat(arm, lambda r: _get(_phase(r, test), key))

    def paired(self, value: Callable[[RunResult], Any]) -> dict[int, dict[str, float]]:
        """value per repetition and arm (runs of one repetition shared the machine)."""
        out: dict[int, dict[str, float]] = {}
        for arm, rs in self.by_arm.items():
            for r in rs:
                v = value(r)
                if v is not None:
                    out.setdefault(r.rep, {})[arm] = float(v)
        return out


def _tests(runs: list[RunResult]) -> list[str]:
    seen: list[str] = []
    for r in runs:
        for p in r.phases:
            if p.get("test") not in seen:
                seen.append(p["test"])
    return seen


def arm_table(rs: Runs, arms: list[str], test: str) -> list[str]:
    lines = ["| arm | runs | throughput (/s) | vs thp-never | latency p50 (ms) | p99 (ms) | "
             "p99.9 (ms) | server CPU per request (µs) | steal | RSS at end | AnonHugePages "
             "at end |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    never = rs.phase_stat(NEVER, test, "throughput")
    for arm in arms:
        n = len(rs.by_arm.get(arm, []))
        tp = rs.phase_stat(arm, test, "throughput")
        ratio = f"{tp.median / never.median:.3f}" if tp and never and never.median else "n/a"
        lines.append(
            f"| {arm} | {n} | {fmt(tp)} | {ratio} | {fmt(rs.phase_stat(arm, test, 'p50_ms'))} | "
            f"{fmt(rs.phase_stat(arm, test, 'p99_ms'))} | "
            f"{fmt(rs.phase_stat(arm, test, 'p999_ms'))} | "
            f"{fmt(rs.phase_stat(arm, test, 'cpu_us_per_request'))} | "
            f"{fmt(rs.phase_stat(arm, test, 'steal_frac'), '%')} | "
            f"{fmt(rs.phase_stat(arm, test, 'rss_bytes'), 'B')} | "
            f"{fmt(rs.phase_stat(arm, test, 'anon_huge_bytes'), 'B')} |")
    return lines


def _collapse_text(r: RunResult) -> str:
    c = _get(r.app, "collapse")
    if not isinstance(c, dict):
        return "–"
    errs = ", ".join(f"{k} {v}" for k, v in (c.get("errors") or {}).items())
    return (f"{c.get('ok')}/{c.get('ranges')} ({fmt_bytes(c.get('bytes'))}, "
            f"{c.get('seconds') or 0:.1f} s{', ' + errs if errs else ''})")


def memory_table(rs: Runs, arms: list[str], churn: bool) -> list[str]:
    head = ("| arm | RSS after the tests | AnonHugePages after the tests | peak RSS | "
            + ("RSS after churn | AnonHugePages after churn | " if churn else "")
            + "collapses ok/tried (bytes, time, errors), first run | AnonHugePages 90 % of "
            "peak, s after warm-up | agent CPU (% of a core) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for arm in arms:
        rs_arm = rs.by_arm.get(arm, [])
        churn_cells = ""
        if churn:
            churn_cells = (f"{fmt(rs.stat(arm, lambda r: _get(r.app, 'after_churn', 'rss_bytes')), 'B')} | "  # noqa: E501
                           f"{fmt(rs.stat(arm, lambda r: _get(r.app, 'after_churn', 'anon_huge_bytes')), 'B')} | ")  # noqa: E501
        agent = rs.stat(arm, lambda r: r.agent_cpu_frac)
        lines.append(
            f"| {arm} | {fmt(rs.stat(arm, lambda r: _get(r.app, 'measured', 'rss_bytes')), 'B')} | "  # noqa: E501
            f"{fmt(rs.stat(arm, lambda r: _get(r.app, 'measured', 'anon_huge_bytes')), 'B')} | "
            f"{fmt(rs.stat(arm, lambda r: r.peak_rss_bytes), 'B')} | {churn_cells}"
            f"{_collapse_text(rs_arm[0]) if rs_arm else 'n/a'} | "
            f"{fmt(rs.stat(arm, huge_90_after_warmup), 's')} | "
            f"{fmt(agent, '%') if arm == DAMON else '–'} |")
    return lines


@dataclass
class Target:
    what: str
    met: bool | None  # None: undefined (reason in numbers)
    numbers: str

    def row(self) -> str:
        verdict = {True: "**met**", False: "**not met**", None: "undefined"}[self.met]
        return f"| {self.what} | {verdict} | {self.numbers} |"


def _no_worse(rs: Runs, test: str, key: str, higher_is_better: bool, label: str) -> Target:
    never, damon = rs.phase_stat(NEVER, test, key), rs.phase_stat(DAMON, test, key)
    if never is None or damon is None:
        return Target(label, None, "no ok runs of both arms")
    diff = damon.median - never.median
    met = diff >= -never.noise if higher_is_better else diff <= never.noise
    few = "; fewer than 3 thp-never runs: the noise is a floor, not measured" \
        if never.n < 3 else ""
    return Target(label, met, f"damon-hp {fmt(damon)} vs thp-never {fmt(never)}: "
                  f"{diff / never.median:+.1%}, noise ±{never.noise / never.median:.1%}{few}")


def gain_kept(rs: Runs, test: str) -> tuple[float | None, str]:
    """The share of everywhere's gain in server CPU per request that damon-hp kept (medians),
    None when the gain is within noise; and the numbers behind it."""
    key = "cpu_us_per_request"
    never, every, damon = (rs.phase_stat(a, test, key) for a in (NEVER, EVERYWHERE, DAMON))
    if never is None or every is None or damon is None:
        return None, "no ok runs of all three arms"
    gain = never.median - every.median
    nums = (f"CPU per request (µs): thp-never {fmt(never)}, everywhere {fmt(every)}, damon-hp "
            f"{fmt(damon)}")
    if gain <= max(never.noise, every.noise):
        return None, (f"{nums}; everywhere's gain ({gain:+.3g} µs) is within noise, so no "
                      "share of it can be read")
    return (never.median - damon.median) / gain, nums


def _cpu_gain(rs: Runs, test: str, target: float) -> Target:
    label = (f"{test}: damon-hp keeps >= {target * 100:.0f} % of everywhere's gain in server "
             "CPU per request")
    key = "cpu_us_per_request"
    share, nums = gain_kept(rs, test)
    if share is None:
        return Target(label, None, nums)
    per_rep = []
    for vals in rs.paired(lambda r: _get(_phase(r, test), key)).values():
        if all(a in vals for a in (NEVER, EVERYWHERE, DAMON)) and vals[NEVER] != vals[EVERYWHERE]:
            per_rep.append((vals[NEVER] - vals[DAMON]) / (vals[NEVER] - vals[EVERYWHERE]))
    spread = (f" (per repetition {min(per_rep):.0%}–{max(per_rep):.0%})" if per_rep else "")
    return Target(label, share >= target, f"{nums}; share kept {share:.0%}{spread}")


def _rss(rs: Runs) -> Target:
    label = "RSS within 2 % of thp-never's (after the measured tests)"
    never = rs.stat(NEVER, lambda r: _get(r.app, "measured", "rss_bytes"))
    damon = rs.stat(DAMON, lambda r: _get(r.app, "measured", "rss_bytes"))
    if never is None or damon is None:
        return Target(label, None, "no ok runs of both arms")
    excess = damon.median / never.median - 1
    return Target(label, excess <= RSS_TARGET, f"damon-hp {fmt(damon, 'B')} vs thp-never "
                  f"{fmt(never, 'B')}: {excess:+.1%}")


def _churn(rs: Runs) -> Target:
    label = "after deleting a random half of the keys and loading new ones: less memory than " \
            "everywhere"
    every = rs.stat(EVERYWHERE, lambda r: _get(r.app, "after_churn", "rss_bytes"))
    damon = rs.stat(DAMON, lambda r: _get(r.app, "after_churn", "rss_bytes"))
    never = rs.stat(NEVER, lambda r: _get(r.app, "after_churn", "rss_bytes"))
    if every is None or damon is None:
        return Target(label, None, "no ok runs of both arms")
    # RSS is read exactly, so its noise is the runs' own spread, at least one huge page
    noise = max((every.hi - every.lo) / 2, (damon.hi - damon.lo) / 2, MIN_MEMORY_GAP)
    less = every.median - damon.median
    return Target(label, less > noise,
                  f"RSS damon-hp {fmt(damon, 'B')}, everywhere {fmt(every, 'B')}, thp-never "
                  f"{fmt(never, 'B')}: damon-hp {fmt_bytes(less)} less, noise "
                  f"±{fmt_bytes(noise)}")


def _below_everywhere(rs: Runs, gap: int) -> Target:
    label = f"RSS at least {gap >> 20} MiB below everywhere's (after the measured tests)"
    every = rs.stat(EVERYWHERE, lambda r: _get(r.app, "measured", "rss_bytes"))
    damon = rs.stat(DAMON, lambda r: _get(r.app, "measured", "rss_bytes"))
    if every is None or damon is None:
        return Target(label, None, "no ok runs of both arms")
    less = every.median - damon.median
    return Target(label, less >= gap, f"damon-hp {fmt(damon, 'B')} vs everywhere "
                  f"{fmt(every, 'B')}: {fmt_bytes(less)} less")


def skew_table(rs: Runs, tests: list[str]) -> list[str]:
    """Per test: how skewed the traffic was at huge-page granularity (damon-hp's own
    snapshots, skew.py), beside what damon-hp made huge and what it kept of everywhere's
    gain."""
    runs = [r for r in rs.by_arm.get(DAMON, []) if isinstance(r.app.get("skew"), dict)]
    if not runs:
        return []
    lines = ["| test | accesses on the hottest 10 % of 2 MiB ranges (damon-hp's snapshots) | "
             "2 MiB ranges seen / accessed | snapshots | damon-hp: share of RSS huge at the "
             "test's end | share of everywhere's CPU gain kept |", "|---|---|---|---|---|---|"]
    return lines + [_skew_row(rs, t) for t in tests]


def _skew_row(rs: Runs, test: str) -> str:
    def of(key: str) -> Stat | None:
        return rs.stat(DAMON, lambda r: _get(r.app, "skew", test, key))

    def huge(r: RunResult) -> float | None:
        p = _phase(r, test)
        rss, h = _get(p, "rss_bytes"), _get(p, "anon_huge_bytes")
        return h / rss if rss and h is not None else None

    kept, why = gain_kept(rs, test)
    na = "n/a (gain within noise)" if "within noise" in why else "n/a"
    return (f"| {test} | {fmt(of('hottest_10pct_share'), '%')} | {fmt(of('ranges'), digits=4)} / "
            f"{fmt(of('accessed_ranges'), digits=4)} | {fmt(of('snapshots'))} | "
            f"{fmt(rs.stat(DAMON, huge), '%')} | "
            f"{na if kept is None else f'{kept:.0%}'} |")


def targets(app: str, rs: Runs, tests: list[str], churn: bool) -> list[Target]:
    out = []
    for t in tests:
        out.append(_no_worse(rs, t, "throughput", True,
                             f"{t}: damon-hp throughput no worse than thp-never beyond noise"))
        out.append(_no_worse(rs, t, "p99_ms", False,
                             f"{t}: damon-hp latency p99 no worse than thp-never beyond noise"))
        # No harm: the server pays nothing for being managed (the agent's own CPU, collapses
        # holding its mmap lock, TLB-flush interrupts, compaction migrating its pages).
        out.append(_no_worse(rs, t, "cpu_us_per_request", False,
                             f"{t}: no harm: damon-hp's server CPU per request no worse than "
                             "thp-never's beyond noise"))
        if app in CPU_GAIN_TARGET:
            out.append(_cpu_gain(rs, t, CPU_GAIN_TARGET[app]))
    out.append(_rss(rs))
    if app in MEMORY_BELOW_EVERYWHERE:
        out.append(_below_everywhere(rs, MEMORY_BELOW_EVERYWHERE[app]))
    if churn:
        out.append(_churn(rs))
    return out


def render(exp: Experiment, runs: list[RunResult], planned: int, command: str,
           environment_lines: list[str], elapsed: str | None) -> str:
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.status] = counts.get(r.status, 0) + 1
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"
    lines = [f"# Experiment `{exp.name}`", ""]
    if exp.description:
        lines += [exp.description.strip(), ""]
    lines += [f"Made by: `{command}`", "",
              f"Runs: {len(runs)} of {planned} planned ({status}); {exp.repetitions} "
              f"repetition(s), arms interleaved and rotated" + (f"; took {elapsed}" if elapsed
                                                                else "") + ".", ""]
    all_targets: list[tuple[str, Target]] = []
    sections: list[str] = []
    for w in exp.workloads:
        wruns = [r for r in runs if r.workload == w.name]
        rs = Runs(wruns)
        tests = _tests(wruns)
        churn = any(r.app.get("after_churn") for r in wruns)
        arms = [a for a in exp.arms if w.arms is None or a in w.arms]
        params = ", ".join(f"{k}={v}" for k, v in w.params)
        sections += ["", f"## {w.name} ({w.app}; clients {', '.join(map(str, w.threads))}; "
                     f"{params or 'defaults'})", ""]
        for t in tests:
            sections += [f"### {t}", ""] + arm_table(rs, arms, t) + [""]
        sections += ["### Memory and the arms' cost", ""] + memory_table(rs, arms, churn)
        skew = skew_table(rs, tests)
        if skew:
            sections += ["", "### How skewed the traffic was at huge-page granularity", "",
                         "Uniform traffic puts 10 % of the accesses on the hottest 10 % of the "
                         "ranges. This is the traffic as damon-hp's snapshots show it (what it "
                         "decides on), not the client's key-level skew (see 'How the numbers "
                         "are made').", ""] + skew
        all_targets += [(w.name, t) for t in targets(w.app or "", rs, tests, churn)]
    lines += ["## Targets", "", "| workload: target | verdict | numbers (median [min–max]) |",
              "|---|---|---|"]
    lines += [f"| {name}: {t.row()[2:]}" for name, t in all_targets]
    lines += sections
    bad = [r for r in runs if r.status != OK]
    if bad:
        lines += ["", "## Runs not ok", ""]
        lines += [f"- {r.cell_id}: {r.status}: {'; '.join(r.notes)[:400]}" for r in bad]
    mechanisms: dict[str, str] = {}
    for r in runs:
        mechanisms.setdefault(r.arm, r.mechanism)
    lines += ["", "## Arms", "", "| arm | how it was applied |", "|---|---|"]
    lines += [f"| {a} | {mechanisms.get(a, 'not run')} |" for a in exp.arms]
    lines += ["", "## How the numbers are made", "",
              "- Each cell: median over the repetitions [min–max]. Runs are interleaved: every "
              "repetition runs each arm once, in an order rotated by one per repetition.",
              "- throughput and latency: the client's own figures (redis-benchmark: requests "
              "per second and its percentile distribution, per pipelined request; sysbench: "
              "transactions per second and its --histogram of transaction latency; go-ycsb: "
              "its final totals, successful operations per second and the latency "
              "percentiles of all operations, each one network round trip).",
              "- YCSB tests: go-ycsb's core workload C (100 % reads) and A (50 % reads, 50 % "
              "updates) with the request distribution named in the parameters (zipfian: "
              "go-ycsb's scrambled zipfian, hot keys spread over the key space), stopped by "
              "SIGTERM after `seconds` (go-ycsb ignores maxexecutiontime); a run with more "
              "than 1 % failed operations is not ok.",
              "- skew: per 2 MiB range of the server, the access frequency damon-hp's own "
              "snapshots gave it (DAMON nr_accesses over its maximum, byte-weighted), summed "
              "over the test; the share of that sum on the hottest 10 % of the ranges. "
              "DAMON sees a page only if it was touched within one sampling interval, and "
              "through a physical source a range reads as its median page (0 unless half its "
              "pages were seen), so lukewarm ranges read 0: it is the skew damon-hp acts on, "
              "not the client's key-level skew; 'accessed' counts the ranges above 0.",
              "- server CPU per request: utime+stime of all the server's threads "
              "(/proc/PID/stat) over one client test, divided by the requests it answered "
              "(sysbench: queries). Steadier than throughput on a shared host.",
              "- steal: the hypervisor's share of all CPU time over the test (/proc/stat).",
              "- noise: half of thp-never's min..max range, at least 1 % of its median; a "
              "target 'no worse beyond noise' is met when damon-hp's median is within it.",
              "- agent CPU: damon-hp attach's CPU time over the server's life (from its ready "
              "to its stop), as a share of one core; collapses are the agent's own counts.",
              "", "## Environment", ""] + environment_lines
    return "\n".join(lines) + "\n"
