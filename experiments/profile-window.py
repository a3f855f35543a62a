#!/usr/bin/env python3
"""Profile one stretch of a `damon-hp run` or `attach` (issue 26). Not a test.

Runs the damon-hp command line in this process with cProfile switched on from --from to --to
seconds after it starts (a timer, SIGALRM), so the start-up or the steady state can be looked at
alone, then prints the stretch's dearest functions by cumulative time and keeps the pstats
file. cProfile's wall clock counts the waits for DAMON's next aggregation (select) too, and
its per-call overhead inflates Python-heavy stages roughly twofold: compare stages within one
profile, and take CPU figures from the run's own --json (experiments/cost-phases.py).

  .venv/bin/python experiments/profile-window.py --from 18 --to 62 --out /tmp/pw.pstats -- \\
      run --quiet --json /tmp/pw.json -- workloads/bin/hotcold --hot 1G --cold 3G --seconds 75

`advise` is refused: it times its own watch with SIGALRM.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "agent"))  # after PYTHONPATH: another commit's agent comes first


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--from", dest="start", type=float, required=True, metavar="S",
                    help="seconds after the start when profiling begins")
    ap.add_argument("--to", dest="end", type=float, required=True, metavar="S",
                    help="seconds after the start when it ends (the command must still run)")
    ap.add_argument("--out", type=Path, default=Path("profile-window.pstats"),
                    help="the pstats file written (default profile-window.pstats)")
    ap.add_argument("--top", type=int, default=40, help="functions printed (default 40)")
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="-- then damon-hp's arguments: run ... or attach ...")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not 0 <= args.start < args.end:
        ap.error(f"--from and --to: need 0 <= from < to, not {args.start} and {args.end}")
    if not command or command[0] not in ("run", "attach"):
        ap.error("give `-- run ...` or `-- attach ...` (advise times itself with SIGALRM; the "
                 "other commands are not the monitoring loop)")

    from damon_hp.cli import main as damon_hp_main

    prof = cProfile.Profile()
    profiled = []

    def on_timer(_signum: int, _frame: object) -> None:
        if not profiled:
            profiled.append(True)
            prof.enable()
            signal.setitimer(signal.ITIMER_REAL, args.end - args.start)
        else:
            prof.disable()
            profiled.append(False)

    signal.signal(signal.SIGALRM, on_timer)
    signal.setitimer(signal.ITIMER_REAL, args.start or 1e-6)
    try:
        rc = damon_hp_main(command)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        prof.disable()
    if len(profiled) < 2:
        print(f"profile-window: the command ended before {args.end} s: no whole stretch "
              "profiled (nothing written); give a later --to or a longer run", file=sys.stderr)
        return 1
    prof.dump_stats(args.out)
    pstats.Stats(str(args.out)).sort_stats("cumulative").print_stats(args.top)
    print(f"profile-window: {args.start}-{args.end} s profiled, written to {args.out}; the "
          f"command exited {rc}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
