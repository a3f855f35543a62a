#!/usr/bin/env python3
"""Does damon-hpd leak over a long run with processes coming and going (issue 26)? Not a test
(its 3-minute version is tests/host/test_daemon_soak.py, in `make test`).

On this host, through the passive source (a foreign paddr kdamond must run): damon-hpd with a
private run directory and a config whose one rule selects only hotcold copies in a fresh
temporary folder, a budget (--budget, 64M) smaller than the long-lived hot sets together;
--long hotcold processes (--hot 16M --cold 32M) for the whole run, and --short-per-minute
short-lived ones (8M + 8M, 3-9 s each), all at nice 19. The daemon rescans /proc every
--scan-every-s (8: longer than one 5 s aggregation, so that how soon an exited process's record
goes is the daemon's own exit check, not its rescan).

Measured (tests/host/daemon_soak.py does the run; its docstring says how each is looked at):
  fds, instances, records, VmRSS   what the daemon holds at three quiet points (no short-lived
                 process left, each let go): at the start, after the warm-up (--warmup-s of
                 churn) and at the end; growth = end - after the warm-up. Also their maximum
                 over the samples taken every --sample-s while processes come and go;
  budget         the managed processes' AnonHugePages together (smaps, every 0.5 s): its
                 maximum, and every look over the budget;
  record lag     for each exited process that was managed: how long its status record outlived
                 it (0.1 s looks at its pidfd and its record file);
  daemon CPU     utime + stime over the wall time between the last two quiet points, % of one
                 core.
Exits 1 when a soak condition broke (RSS growth > 5 MiB, fds / instances / records not back to
their post-warm-up values, a record that outlived its process by more than one aggregation or
3 s (tests/host/daemon_soak.py RECORD_LAG_MAX_S), the budget exceeded, a non-zero exit or
something left after SIGTERM), 2 for a bad setup.

Example (from the project root; --minutes counts the warm-up too):
  .venv/bin/python experiments/soak-daemon.py --minutes 30 --json /tmp/soak30.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for sub in ("agent", "tests", "tests/host"):
    sys.path.insert(0, str(ROOT / sub))
from daemon_host import HOTCOLD, MIB  # noqa: E402
from daemon_soak import RECORD_LAG_MAX_S, Plan, Soak  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30, help="churn time, warm-up included")
    p.add_argument("--warmup-s", type=float, default=120)
    p.add_argument("--long", type=int, default=10, help="long-lived processes")
    p.add_argument("--short-per-minute", type=float, default=100)
    p.add_argument("--budget", default="64M")
    p.add_argument("--scan-every-s", type=float, default=8.0)
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--json", help="write the figures and every sample to this file")
    args = p.parse_args()
    if args.minutes * 60 <= args.warmup_s:
        p.error("--minutes must be longer than --warmup-s")
    if not HOTCOLD.exists():
        print(f"soak-daemon: {HOTCOLD} is missing: run `make setup`", file=sys.stderr)
        return 2
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    if "[always]" in thp:
        print("soak-daemon: THP is `always`: hotcold would get huge pages without the daemon "
              "and the budget figure would not be the daemon's", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="soak-daemon-") as tmp:
        plan = Plan(Path(tmp), args.warmup_s, args.minutes * 60 - args.warmup_s,
                    long=args.long, short_per_minute=args.short_per_minute,
                    budget=args.budget, scan_every_s=args.scan_every_s, sample_s=args.sample_s)
        print(f"# damon-hpd soak: {args.long} long-lived, {args.short_per_minute:g} short-lived "
              f"a minute, {args.minutes:g} min ({args.warmup_s:g} s warm-up), budget "
              f"{args.budget}, scan every {args.scan_every_s:g} s, THP {thp}", flush=True)
        res = Soak(plan, say=lambda s: print(s, flush=True)).run()
        log_tail = (Path(tmp) / "daemon.err").read_text().splitlines()[-5:]
    j = res.to_json()
    if args.json:
        Path(args.json).write_text(json.dumps(j, indent=1))
    w, e, s = res.warm, res.end, res.start
    lag = j["record_lag_s"]
    if w and e and s:
        print(f"\nfds {s.fds} / {w.fds} / {e.fds} (start / after warm-up / end; max "
              f"{j['fds_max']}), instances {s.instances} / {w.instances} / {e.instances}, "
              f"records {s.records} / {w.records} / {e.records} (max {j['records_max']})")
        print(f"VmRSS {s.rss / MIB:.1f} / {w.rss / MIB:.1f} / {e.rss / MIB:.1f} MiB, growth "
              f"after the warm-up {(e.rss - w.rss) / MIB:+.2f} MiB (max "
              f"{j['rss_max'] / MIB:.1f} MiB)")
        print(f"daemon CPU {res.soak_cpu_pct():.2f} % of a core over "
              f"{e.t_s - w.t_s:.0f} s after the warm-up")
    print(f"processes: {len(res.long_pids)} long-lived, {res.short_started} short-lived "
          f"started, {res.short_managed} of them managed")
    if lag["n"]:
        print(f"record lag over {lag['n']} exits: median {lag['median']:.2f} s, p95 "
              f"{lag['p95']:.2f} s, max {lag['max']:.2f} s (aggregation {res.aggr_s:g} s, "
              f"bound {min(res.aggr_s, RECORD_LAG_MAX_S):g} s)")
    print(f"budget {res.budget_bytes / MIB:.0f} MiB: most huge at once "
          f"{res.huge_max / MIB:.0f} MiB over {res.budget_looks} looks, "
          f"{len(res.budget_broken)} over it")
    print(f"damon-hpd exit {res.daemon_exit}; log tail:\n  " + "\n  ".join(log_tail))
    problems = res.problems()
    for problem in problems:
        print(f"BROKEN: {problem}")
    print("soak: " + ("held" if not problems else f"{len(problems)} conditions broke"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
