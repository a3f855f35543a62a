#!/usr/bin/env python3
"""DAMOS `collapse` (the kernel's action, 7.2+) against process_madvise(MADV_COLLAPSE) as
damon-hp's actuator (issue #22). Not a test.

For each actuator (`--collapse-with damos` / `madvise`) and each repetition: start
`damon-hp run --source vaddr --json` on workloads/bin/hotcold, read hotcold's printed ranges,
and watch /proc/PID/smaps every 0.5 s until the run ends. Reported, from the kernel's page
tables (smaps AnonHugePages) and the JSON summary:

  time to 90 %   seconds from hotcold's first line until 90 % of the hot range is PMD-mapped;
  hot / cold     the largest shares of the hot and cold ranges seen huge;
  agent CPU      the agent's CPU time (RUSAGE_SELF: with madvise it includes the kernel copying
                 the promoted memory, charged to the caller) as % of one core over its wall time;
  kdamond CPU    our kdamond's CPU time, same basis (with damos the copy is charged to it);
  counted        what the summary says was promoted, beside what smaps shows huge.

Needs a free DAMON with vaddr (the test VM). DAMON_STAT (7.3 as booted) holds DAMON
exclusively: --stop-damon-stat (test VM only) turns it off for the runs and back on after.
THP: run under `never`, so that every huge page is the agent's.

  .venv/bin/damon-hp vm run -- sh -c 'echo never > /sys/kernel/mm/transparent_hugepage/enabled
      && .venv/bin/python experiments/bench-collapse.py --hot 128M --cold 256M --seconds 40
         --reps 3 --stop-damon-stat'
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
STAT_ENABLED = Path("/sys/module/damon_stat/parameters/enabled")
SHARE = 0.90

sys.path.insert(0, str(ROOT / "agent"))
from damon_hp import procfs  # noqa: E402
from damon_hp.ranges import AddrRange  # noqa: E402


def in_test_vm() -> bool:
    try:
        return (os.environ.get("DAMON_HP_IN_VM") == "1"
                and "virtme" in Path("/proc/cmdline").read_text())
    except OSError:
        return False


def shares(pid: int, hot: AddrRange, cold: AddrRange) -> tuple[float, float]:
    maps = procfs.read_smaps(pid)
    h = procfs.smaps_in_ranges(maps, [hot]).anon_huge_bytes
    c = procfs.smaps_in_ranges(maps, [cold]).anon_huge_bytes
    return h / hot.size, c / cold.size


def one_run(mode: str, args: argparse.Namespace, workdir: Path, rep: int) -> dict:
    out = workdir / f"{mode}-{rep}.json"
    cmd = [DAMON_HP, "run", "-q", "--source", "vaddr", "--collapse-with", mode, "--json",
           str(out), "--", HOTCOLD, "--hot", args.hot, "--cold", args.cold, "--seconds",
           str(args.seconds)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    ready = time.monotonic()
    if not first:
        _, err = proc.communicate()
        raise SystemExit(f"bench-collapse: {' '.join(cmd)} failed ({proc.returncode}):\n{err}")
    r = json.loads(first)
    hot = AddrRange(r["hot"]["start"], r["hot"]["end"])
    cold = AddrRange(r["cold"]["start"], r["cold"]["end"])
    # Peaks, not the last reading: the last one may catch hotcold unmapping at its exit.
    t90, last = None, (0.0, 0.0)
    while proc.poll() is None:
        try:
            now = shares(r["pid"], hot, cold)
        except (procfs.ProcessGone, OSError):
            break
        last = (max(last[0], now[0]), max(last[1], now[1]))
        if t90 is None and now[0] >= SHARE:
            t90 = time.monotonic() - ready
        time.sleep(0.5)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"bench-collapse: {' '.join(cmd)} exited {proc.returncode}:\n{err}")
    s = json.loads(out.read_text())["summary"]
    wall = s["wall_s"]
    return {
        "mode": mode, "t90_s": t90, "hot_huge_pct": 100 * last[0],
        "cold_huge_pct": 100 * last[1], "wall_s": wall,
        "agent_pct": 100 * s["agent_cpu_s"] / wall,
        "kdamond_pct": 100 * (s["kdamond_cpu_s"] or 0) / wall,
        "promoted_bytes": s["promoted_bytes"],
        "hot_huge_bytes_end": round(last[0] * hot.size),
        "final_anon_huge_bytes": s["final_anon_huge_bytes"],
    }


def fmt(values: list, digits: int = 1) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "never"
    txt = f"{statistics.median(got):.{digits}f}"
    if len(got) > 1:
        txt += f" [{min(got):.{digits}f}-{max(got):.{digits}f}]"
    if len(got) < len(values):
        txt += f" ({len(values) - len(got)} never)"
    return txt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="damos,madvise")
    p.add_argument("--hot", default="128M")
    p.add_argument("--cold", default="256M")
    p.add_argument("--seconds", type=float, default=40)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--stop-damon-stat", action="store_true",
                   help="test VM only: turn DAMON_STAT off for the runs, back on after")
    p.add_argument("--json", help="write every run's figures to this file")
    args = p.parse_args()
    restore = None
    if args.stop_damon_stat:
        if not in_test_vm():
            p.error("--stop-damon-stat is for the test VM only")
        if STAT_ENABLED.exists() and STAT_ENABLED.read_text().strip() == "Y":
            STAT_ENABLED.write_text("N")
            restore = "Y"
    modes = args.modes.split(",")
    print(f"# kernel {os.uname().release}, THP {procfs.thp_mode()}, hotcold --hot {args.hot} "
          f"--cold {args.cold} --seconds {args.seconds:g}, {args.reps} repetitions, "
          "interleaved", flush=True)
    results: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-collapse-") as tmp:
            for rep in range(args.reps):
                for mode in modes:  # interleaved: a drift in host load hits both alike
                    r = one_run(mode, args, Path(tmp), rep)
                    results.append(r)
                    print(json.dumps(r), flush=True)
    finally:
        if restore is not None:
            STAT_ENABLED.write_text(restore)
    print("\n| actuator | time to 90 % of hot huge (s) | hot huge at end % | cold huge % | "
          "agent CPU % | kdamond CPU % | agent+kdamond % | counted promoted MiB | "
          "hot huge MiB (smaps) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in modes:
        rs = [r for r in results if r["mode"] == mode]
        print(f"| {mode} | {fmt([r['t90_s'] for r in rs])} | "
              f"{fmt([r['hot_huge_pct'] for r in rs])} | {fmt([r['cold_huge_pct'] for r in rs])}"
              f" | {fmt([r['agent_pct'] for r in rs], 2)} | "
              f"{fmt([r['kdamond_pct'] for r in rs], 2)} | "
              f"{fmt([r['agent_pct'] + r['kdamond_pct'] for r in rs], 2)} | "
              f"{fmt([r['promoted_bytes'] / 2**20 for r in rs], 0)} | "
              f"{fmt([r['hot_huge_bytes_end'] / 2**20 for r in rs], 0)} |")
    print(f"(median [min-max] of {args.reps} runs)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
