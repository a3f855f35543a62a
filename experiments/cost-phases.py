#!/usr/bin/env python3
"""Where one `damon-hp run` spent its monitoring CPU, read from its `--json` (issue 26). Not a
test.

The summary gives the run's monitoring CPU and its stages over the whole run; the timeline gives
each snapshot's stage CPU so far, stage by stage (`stage_cpu_by_stage_s`). This splits the run
in three:

  start-up and the rest  monitoring CPU outside the stages: the interpreter and imports, opening
                         the access source, the report at the end (once per run)
  until steady           each stage's CPU from the start to the last snapshot before
                         `--steady-after-s` (the first look, the target's fill, the promotions)
  steady                 each stage's median CPU per aggregation after it, what the stretch cost
                         as a share of a core, its dearest aggregations (full pagemap reads), and
                         the median regions from DAMON and frame extents it grows with

  .venv/bin/damon-hp run --quiet --json /tmp/run.json -- \
      workloads/bin/hotcold --hot 1G --cold 3G --seconds 120
  .venv/bin/python experiments/cost-phases.py /tmp/run.json [--steady-after-s 60] [--json]

Several files print one block each. A run whose timeline lacks `stage_cpu_by_stage_s` (made
before it existed) is refused.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

DEAREST = 3  # steady aggregations listed by cost


class NoStageTimeline(ValueError):
    pass


def phases(report: dict[str, Any], steady_after_s: float) -> dict[str, Any]:
    """The run's monitoring CPU split into start-up, until steady and steady (module doc)."""
    s, timeline = report["summary"], report["timeline"]
    if not timeline or any(e.get("stage_cpu_by_stage_s") is None for e in timeline):
        raise NoStageTimeline("the timeline has no stage_cpu_by_stage_s (a run made before "
                              "it existed, or with no snapshot)")
    stages = list(s["monitoring_cpu_by_stage"])
    prev: dict[str, float] = {}
    steps = []  # (t_s, {stage: CPU s of this snapshot})
    for e in timeline:
        now = e["stage_cpu_by_stage_s"]
        steps.append((e["t_s"], {st: now.get(st, 0.0) - prev.get(st, 0.0) for st in stages}))
        prev = now
    last = timeline[-1]["stage_cpu_s"]
    early = [(t, d) for t, d in steps if t < steady_after_s]
    steady = [(t, d) for t, d in steps if t >= steady_after_s]
    out: dict[str, Any] = {
        "wall_s": s["wall_s"],
        "monitoring_cpu_s": s["monitoring_cpu_s"],
        "monitoring_pct": round(100 * s["monitoring_cpu_s"] / s["wall_s"], 2),
        "start_up_and_rest_s": round(s["monitoring_cpu_s"] - last, 4),
        "until_steady": {
            "snapshots": len(early),
            "by_stage_s": {st: round(sum(d[st] for _, d in early), 4) for st in stages},
        },
        "steady": None,
    }
    if steady:
        # The stretch the steady snapshots stand for: from the snapshot before the first one.
        before = early[-1][0] if early else 0.0
        span = steady[-1][0] - before
        total = sum(sum(d.values()) for _, d in steady)
        dearest = sorted(steady, key=lambda td: sum(td[1].values()), reverse=True)[:DEAREST]
        out["steady"] = {
            "snapshots": len(steady),
            "from_s": steady_after_s,
            "cpu_s": round(total, 4),
            "pct_of_core": round(100 * total / span, 3) if span > 0 else None,
            "median_ms_per_aggregation": {
                st: round(1000 * statistics.median(d[st] for _, d in steady), 2)
                for st in stages},
            "dearest": [{"t_s": t, "ms": round(1000 * sum(d.values()), 1),
                         "stage": max(d, key=d.__getitem__)} for t, d in dearest],
            # What the events' and the reverse map's CPU grow with (timeline fields since
            # 2026-12-02; None in older runs).
            "median_source_regions": _median_of(timeline, "source_regions", steady_after_s),
            "median_frame_extents": _median_of(timeline, "frame_extents", steady_after_s),
        }
    return out


def _median_of(timeline: list[dict[str, Any]], key: str, after_s: float) -> float | None:
    values = [e[key] for e in timeline if e["t_s"] >= after_s and e.get(key) is not None]
    return statistics.median(values) if values else None


def describe(name: str, p: dict[str, Any]) -> str:
    lines = [f"{name}: {p['monitoring_cpu_s']:.2f} s of monitoring CPU over {p['wall_s']:.1f} s "
             f"({p['monitoring_pct']:.2f} % of a core)",
             f"  start-up and the rest   {p['start_up_and_rest_s']:.2f} s"]
    u = p["until_steady"]
    parts = ", ".join(f"{st} {v:.2f}" for st, v in u["by_stage_s"].items())
    lines.append(f"  until steady            {sum(u['by_stage_s'].values()):.2f} s over "
                 f"{u['snapshots']} snapshots ({parts})")
    st = p["steady"]
    if st is None:
        lines.append("  steady                  no snapshot after --steady-after-s")
    else:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in st["median_ms_per_aggregation"].items())
        pct = "n/a" if st["pct_of_core"] is None else f"{st['pct_of_core']:.2f} % of a core"
        dear = ", ".join(f"{d['ms']:.0f} ms at {d['t_s']:.0f} s ({d['stage']})"
                         for d in st["dearest"])
        lines += [f"  steady from {st['from_s']:.0f} s       {st['cpu_s']:.2f} s over "
                  f"{st['snapshots']} snapshots, {pct}",
                  f"    median per aggregation, ms: {parts}",
                  f"    dearest: {dear}"]
        if st["median_source_regions"] is not None:
            extents = st["median_frame_extents"]
            lines.append(f"    median regions from DAMON {st['median_source_regions']:.0f}, "
                         f"frame extents {'n/a' if extents is None else f'{extents:.0f}'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("runs", nargs="+", type=Path, help="`damon-hp run --json` files")
    ap.add_argument("--steady-after-s", type=float, default=60.0,
                    help="where the steady stretch begins, seconds after monitoring started "
                         "(default 60)")
    ap.add_argument("--json", action="store_true", help="print JSON, one object per file")
    args = ap.parse_args(argv)
    if args.steady_after_s < 0:
        ap.error("--steady-after-s must be 0 or more")
    results = {}
    for path in args.runs:
        try:
            report = json.loads(path.read_text())
            results[str(path)] = phases(report, args.steady_after_s)
        except json.JSONDecodeError as err:
            print(f"cost-phases: {path}: not JSON ({err}); give the file `damon-hp run --json "
                  "FILE` wrote", file=sys.stderr)
            return 1
        except (OSError, ValueError) as err:
            print(f"cost-phases: {path}: {err}", file=sys.stderr)
            return 1
        except (KeyError, TypeError) as err:
            print(f"cost-phases: {path}: not the --json of `damon-hp run` or `attach` (no {err} "
                  "where one is expected); give the file `--json FILE` wrote", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print("\n\n".join(describe(name, p) for name, p in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
