#!/usr/bin/env python3
"""What each DAMON access source costs and how soon it backs a hot set (issue #10). Not a test.

For every source that works where it runs (vaddr, paddr, passive; or those named with
--sources), and for each repetition: start `damon-hp run --json` on workloads/bin/hotcold, read
hotcold's printed hot and cold ranges, wait for the run to end, and report from the JSON:

  agent CPU      the agent's own CPU time (user + system, RUSAGE_SELF, so not hotcold's) as
                 % of one core over the agent's wall time; "watching" is that less the CPU
                 spent inside MADV_COLLAPSE calls (thread CPU time around each call: the
                 kernel copying the promoted memory, charged to the caller, a one-off per
                 promoted range), i.e. the cost of reading DAMON and deciding; beside it, the
                 wall time spent in those calls (on a loaded machine it also holds time spent
                 waiting for a CPU);
  kdamond CPU    our kdamond's CPU time as % of one core over the same wall time (vaddr, paddr;
                 the agent samples it every 2 s, so up to the last 2 s are missing). A passive
                 source's kdamond is not ours: its CPU is its owner's cost ("not ours");
  time to 90 %   seconds from hotcold's first line (every page of both buffers written, the hot
                 phase starts) until the 2 MiB ranges the agent collapsed inside the hot range
                 cover 90 % of it (the JSON's action log, placed on the clock of its timeline);
  hot/cold huge  the shares of the hot and cold ranges the agent collapsed by the end.

THP: run where the system mode cannot make huge pages on its own (`never`, or `madvise` with
a workload that does not madvise, like hotcold), so that every huge page is the agent's.

Passive in the test VM: --foreign-kdamond SAMPLE_US,AGGR_US starts a paddr kdamond over all
System RAM by raw sysfs writes, as another tool would, after the vaddr and paddr repetitions
(which need a free DAMON) and stops it at the end. Refused outside the test VM.

--compact (test VM only) compacts memory before every run, so that each hotcold gets frames
in long physical runs as on a fresh machine: physical sources tell hot from cold frames only as
finely as DAMON's regions, and scattered free lists interleave them.

Examples (from the project root):
  .venv/bin/python experiments/bench-sources.py --hot 1G --cold 3G --seconds 60 --reps 3
  .venv/bin/damon-hp vm run -- sh -c 'echo never > /sys/kernel/mm/transparent_hugepage/enabled
      && .venv/bin/python experiments/bench-sources.py --hot 256M --cold 1G --seconds 30
         --reps 3 --compact --foreign-kdamond 20000,1000000'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAMON_HP = str(ROOT / ".venv/bin/damon-hp")
HOTCOLD = str(ROOT / "workloads/bin/hotcold")
HUGE = 2 << 20
KDAMONDS = Path("/sys/kernel/mm/damon/admin/kdamonds")
SHARE = 0.90

sys.path.insert(0, str(ROOT / "agent"))
from damon_hp.damon import OWNER_FOREIGN, plan_start, probe  # noqa: E402
from damon_hp.errors import EnvironmentProblem  # noqa: E402
from damon_hp.vmguard import in_vm  # noqa: E402


def available_sources() -> dict[str, str]:
    """source -> why it cannot run here ('' when it can); read-only."""
    found = probe()
    out = {}
    for kind in ("vaddr", "paddr"):
        try:
            plan_start(found, kind)
            out[kind] = ""
        except EnvironmentProblem as e:
            out[kind] = str(e).removeprefix("damon-hp: ").splitlines()[0]
    foreign = [k for k in found.running if k.owner == OWNER_FOREIGN and k.ops[:1] == ("paddr",)]
    out["passive"] = "" if foreign else "no running paddr kdamond that is not damon-hp's"
    return out


def in_test_vm() -> bool:
    try:
        return in_vm() and "virtme" in Path("/proc/cmdline").read_text()
    except OSError:
        return False


class ForeignKdamond:
    """A paddr kdamond over every System RAM range, started by raw sysfs writes (test VM only)."""

    def __init__(self, sample_us: int, aggr_us: int) -> None:
        if not in_test_vm():
            raise SystemExit("bench-sources: --foreign-kdamond is for the test VM only: on a "
                             "real machine DAMON belongs to its administrator")
        ram = []
        for line in Path("/proc/iomem").read_text().splitlines():
            if not line.startswith(" ") and line.endswith(": System RAM"):
                lo, hi = (int(x, 16) for x in line.split(" : ")[0].split("-"))
                if (hi + 1) // 4096 > -(-lo // 4096):
                    ram.append((-(-lo // 4096) * 4096, (hi + 1) // 4096 * 4096))
        (KDAMONDS / "nr_kdamonds").write_text("1")
        self.dir = KDAMONDS / "0"
        (self.dir / "contexts/nr_contexts").write_text("1")
        ctx = self.dir / "contexts/0"
        (ctx / "operations").write_text("paddr")
        (ctx / "monitoring_attrs/intervals/sample_us").write_text(str(sample_us))
        (ctx / "monitoring_attrs/intervals/aggr_us").write_text(str(aggr_us))
        (ctx / "monitoring_attrs/nr_regions/min").write_text("10")
        (ctx / "monitoring_attrs/nr_regions/max").write_text("1000")
        (ctx / "targets/nr_targets").write_text("1")
        (ctx / "targets/0/regions/nr_regions").write_text(str(len(ram)))
        for i, (start, end) in enumerate(ram):
            (ctx / f"targets/0/regions/{i}/start").write_text(str(start))
            (ctx / f"targets/0/regions/{i}/end").write_text(str(end))
        (self.dir / "state").write_text("on")

    def stop(self) -> None:
        (self.dir / "state").write_text("off")
        deadline = time.monotonic() + 30
        while (self.dir / "state").read_text().strip() != "off" and time.monotonic() < deadline:
            time.sleep(0.1)
        (KDAMONDS / "nr_kdamonds").write_text("0")


def covered_at(actions: list[dict], lo: int, hi: int) -> list[tuple[float, int]]:
    """(t_s, bytes of [lo, hi) collapsed so far) after each successful collapse inside it."""
    done: set[int] = set()
    out = []
    for a in actions:
        if a.get("action") != "collapse" or a.get("error") or a.get("start") is None:
            continue
        if lo <= a["start"] and a["end"] <= hi and a["start"] not in done:
            done.add(a["start"])
            out.append((a["t_s"], len(done) * HUGE))
    return out


def one_run(source: str, args: argparse.Namespace, workdir: Path, rep: int) -> dict:
    if args.compact:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3")
        Path("/proc/sys/vm/compact_memory").write_text("1")
    out = workdir / f"{source}-{rep}.json"
    cmd = [args.damon_hp, "run", "-q", "--source", source, "--json", str(out), "--", HOTCOLD,
           "--hot", args.hot, "--cold", args.cold, "--seconds", str(args.seconds)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    ready = time.monotonic()
    _, err = proc.communicate()
    if proc.returncode != 0 or not first:
        raise SystemExit(f"bench-sources: {' '.join(cmd)} failed ({proc.returncode}):\n{err}")
    ranges = json.loads(first)
    d = json.loads(out.read_text())
    s, timeline = d["summary"], d["timeline"]
    # Timeline entries carry both clocks: the agent's start on CLOCK_MONOTONIC.
    started = timeline[0]["monotonic_s"] - timeline[0]["t_s"]
    hot_lo, hot_hi = ranges["hot"]["start"], ranges["hot"]["end"]
    cold_lo, cold_hi = ranges["cold"]["start"], ranges["cold"]["end"]
    hot = covered_at(d["actions"], hot_lo, hot_hi)
    cold = covered_at(d["actions"], cold_lo, cold_hi)
    t90 = next((started + t - ready for t, b in hot if b >= SHARE * (hot_hi - hot_lo)), None)
    wall = s["wall_s"]
    copy_cpu = sum(s[k].get("cpu_seconds", 0.0) for k in ("collapse", "recollapse") if k in s)
    return {
        "source": s["source"]["name"],
        "kdamond": s["source"]["kdamond"],
        "intervals_us": (s["source"]["sample_us"], s["source"]["aggr_us"]),
        "wall_s": wall,
        "agent_cpu_s": s["agent_cpu_s"],
        "agent_pct": 100 * s["agent_cpu_s"] / wall,
        "collapse_s": s["collapse"]["seconds"],
        "collapse_pct": 100 * s["collapse"]["seconds"] / wall,
        "collapse_cpu_s": copy_cpu,
        "watch_pct": 100 * (s["agent_cpu_s"] - copy_cpu) / wall,
        "kdamond_cpu_s": s["kdamond_cpu_s"],
        "kdamond_pct": (100 * s["kdamond_cpu_s"] / wall
                        if s["kdamond_cpu_s"] is not None else None),
        "t90_s": t90,
        "hot_huge_pct": 100 * (hot[-1][1] if hot else 0) / (hot_hi - hot_lo),
        "cold_huge_pct": 100 * (cold[-1][1] if cold else 0) / (cold_hi - cold_lo),
        "snapshots": s["snapshots"],
    }


def fmt(values: list, unit: str = "", digits: int = 1, missing: str = "never") -> str:
    """median [min-max]; `missing` (a run that did not get there) counted apart."""
    got = [v for v in values if v is not None]
    if not got:
        return missing if values else "-"
    med = statistics.median(got)
    txt = f"{med:.{digits}f}{unit}"
    if len(got) > 1:
        txt += f" [{min(got):.{digits}f}-{max(got):.{digits}f}]"
    if len(got) < len(values):
        txt += f" ({len(values) - len(got)} {missing})"
    return txt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sources", help="comma-separated (default: every source that works here)")
    p.add_argument("--hot", default="1G")
    p.add_argument("--cold", default="3G")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--foreign-kdamond", metavar="SAMPLE_US,AGGR_US",
                   help="test VM only: start a paddr kdamond for the passive source")
    p.add_argument("--compact", action="store_true",
                   help="test VM only: drop caches and compact memory before every run")
    p.add_argument("--json", help="write every run's figures to this file")
    p.add_argument("--damon-hp", default=DAMON_HP,
                   help="the damon-hp to run (default: this tree's; another build's for a "
                        "before/after comparison)")
    args = p.parse_args()
    if args.compact and not in_test_vm():
        p.error("--compact is for the test VM only: memory of a real machine is its "
                "administrator's")

    avail = available_sources()
    wanted = args.sources.split(",") if args.sources else ["vaddr", "paddr", "passive"]
    if args.foreign_kdamond and "passive" in wanted:
        avail["passive"] = ""  # started below, after the sources that need a free DAMON
    for kind in wanted:
        if avail.get(kind):
            print(f"# {kind}: not available here: {avail[kind]}", flush=True)
    runs = [k for k in wanted if avail.get(k) == ""]
    print(f"# kernel {os.uname().release}, THP "
          f"{Path('/sys/kernel/mm/transparent_hugepage/enabled').read_text().strip()}, "
          f"hotcold --hot {args.hot} --cold {args.cold} --seconds {args.seconds:g}, "
          f"{args.reps} repetitions of {', '.join(runs) or 'nothing'}", flush=True)

    results: list[dict] = []
    foreign = None
    with tempfile.TemporaryDirectory(prefix="bench-sources-") as tmp:
        try:
            for kind in runs:
                if kind == "passive" and args.foreign_kdamond:
                    sample_us, aggr_us = (int(x) for x in args.foreign_kdamond.split(","))
                    foreign = ForeignKdamond(sample_us, aggr_us)
                for rep in range(args.reps):
                    r = one_run(kind, args, Path(tmp), rep)
                    results.append(r)
                    print(json.dumps(r), flush=True)
        finally:
            if foreign is not None:
                foreign.stop()

    print("\n| source | kdamond (sample/aggr) | agent CPU % of a core | of it watching | "
          "in collapse calls (wall %) | kdamond CPU % | agent+kdamond % | "
          "time to 90 % of hot huge (s) | hot huge at end | cold huge |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in runs:
        rs = [r for r in results if r["source"] == kind]
        if not rs:
            continue
        iv = rs[0]["intervals_us"]
        total = [r["agent_pct"] + (r["kdamond_pct"] or 0) for r in rs]
        print(f"| {kind} | {rs[0]['kdamond']} ({iv[0] / 1000:g} ms/{iv[1] / 1000:g} ms) | "
              f"{fmt([r['agent_pct'] for r in rs], ' %', 2)} | "
              f"{fmt([r['watch_pct'] for r in rs], ' %', 2)} | "
              f"{fmt([r['collapse_pct'] for r in rs], ' %', 2)} | "
              f"{fmt([r['kdamond_pct'] for r in rs], ' %', 2, 'not ours')} | "
              f"{fmt(total, ' %', 2)} | "
              f"{fmt([r['t90_s'] for r in rs])} | {fmt([r['hot_huge_pct'] for r in rs], ' %')} |"
              f" {fmt([r['cold_huge_pct'] for r in rs], ' %')} |")
    print(f"(median [min-max] of {args.reps} runs)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
