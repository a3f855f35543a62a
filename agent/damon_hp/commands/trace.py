"""Count what huge pages do to a process (or the whole system) with the hpstat BPF tool.

Per interval: user page faults; THP PMD scans and collapses by status, split by who drove them
(khugepaged, or MADV_COLLAPSE from madvise/process_madvise); compaction runs and direct-reclaim
stalls with log2 latency histograms; TLB flushes by reason; madvise and process_madvise calls
by advice. Ends on Ctrl-C, SIGTERM, --duration, or when the traced process exits, then prints
the totals.

With --pid, THP scans/collapses and process_madvise calls count when they act on that process's
memory whoever performs them (khugepaged, damon-hp); everything else counts when one of its
threads does it. Needs root (BPF) and a built hpstat (`make bpf`).

examples:
  damon-hp trace --pid 1234                   a table every second until Ctrl-C
  damon-hp trace --pid 1234 --json -i 5       JSON lines for scripts (interval, then summary)
  damon-hp trace --duration 10                the whole system for 10 s

exit codes: 0 ok, 1 runtime failure, 2 usage or environment error (not root, BPF not
permitted, hpstat not built, no such PID).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from types import FrameType

from damon_hp.errors import EXIT_OK, EXIT_USAGE, DamonHpError
from damon_hp.hpstat import HpStat, HpStatRecord, format_table


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be more than 0 seconds")
    return value


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pid", "-p", type=int, metavar="PID",
                        help="trace this process and its threads (default: the whole system)")
    parser.add_argument("--interval", "-i", type=_positive_float, default=1.0, metavar="S",
                        help="seconds between records (default 1)")
    parser.add_argument("--duration", "-d", type=_positive_float, metavar="S",
                        help="stop after S seconds (default: Ctrl-C, SIGTERM or target exit)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="JSON lines: one per interval, then {\"type\": \"summary\", ...}")
    out.add_argument("--table", action="store_true",
                     help="human tables (the default)")


def main(args: argparse.Namespace) -> int:
    if args.pid is not None and args.pid <= 0:
        print(f"damon-hp trace: --pid {args.pid}: expected a positive process id",
              file=sys.stderr)
        return EXIT_USAGE
    stop = threading.Event()

    def emit(record: HpStatRecord) -> None:
        if args.json:
            print(json.dumps(record.to_json()), flush=True)
        else:
            print(format_table(record) + "\n", flush=True)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with HpStat.start(args.pid, args.interval, args.duration, on_interval=emit) as trace:
            if not args.json:
                who = f"pid {args.pid}" if args.pid else "the whole system"
                print(f"damon-hp trace: counting events of {who} every {args.interval:g} s; "
                      "Ctrl-C for the totals", flush=True)
                for event in trace.unavailable:
                    print(f"damon-hp trace: tracepoint {event} is not in this kernel; "
                          "not counted", flush=True)
            while trace.running and not stop.wait(0.2):
                pass
            summary = trace.stop()
    except DamonHpError as exc:
        print(f"damon-hp trace: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    emit(summary.total)
    return EXIT_OK
