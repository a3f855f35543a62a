#!/usr/bin/env python3
"""CPU per aggregation of the two pipeline stages that need no live process (issue 26). Not a
test.

  reader  the event reader's Python (events.AggregatedEventStream fed the bytes trace_pipe
          gave): the recorded trace_pipe text of two aggregations of this host's foreign
          kdamond (tests/fixtures/damon-aggregated-paddr-host-6.18.txt), fed in 64 KiB reads;
  decide  the decision rule (policy.decide + record_outcomes) over the recorded passive run
          of hotcold 1 GiB / 3 GiB (tests/fixtures/passive-hotcold-1g-3g-host-6.18.json.gz),
          with the target's two buffers as its mappings, or each cut into pieces
          (`--mappings N`: a server with hundreds of mappings, as MariaDB has).

Each figure is the fastest of `--reps` passes (process CPU time): the least disturbed pass,
for comparing two commits on one machine. Compare commits by running this file from each:

  .venv/bin/python experiments/bench-pure-stages.py --mappings 2,400
  git worktree add /tmp/before COMMIT
  PYTHONPATH=/tmp/before/agent .venv/bin/python experiments/bench-pure-stages.py --mappings 2,400
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "agent"))  # after PYTHONPATH: another commit's agent comes first

from damon_hp.damon.events import AggregatedEventStream  # noqa: E402
from damon_hp.damon.model import Recording  # noqa: E402
from damon_hp.pipeline import params_for_source  # noqa: E402
from damon_hp.policy import PolicyParams, PolicyState, decide, record_outcomes  # noqa: E402
from damon_hp.ranges import HUGE_PAGE_BYTES, AddrRange  # noqa: E402

TRACE = ROOT / "tests/fixtures/damon-aggregated-paddr-host-6.18.txt"
PASSIVE = ROOT / "tests/fixtures/passive-hotcold-1g-3g-host-6.18.json.gz"
READ_BYTES = 1 << 16


def reader_ms(reps: int) -> tuple[float, int]:
    """Fastest ms per aggregation, and regions per aggregation."""
    lines = [ln for ln in TRACE.read_text().splitlines(keepends=True) if not ln.startswith("#")]
    data = "".join(lines).encode()
    best, snaps = float("inf"), 0
    for _ in range(reps):
        stream = AggregatedEventStream(77, sample_us=500_000, aggr_us=5_000_000)
        t0 = time.process_time()
        for i in range(0, len(data), READ_BYTES):
            stream._feed_bytes(data[i:i + READ_BYTES])
        best = min(best, time.process_time() - t0)
        snaps = len(stream._ready)
    if snaps == 0:
        sys.exit("bench-pure-stages: the recorded trace gave no snapshot")
    return 1e3 * best / snaps, len(lines) // snaps


def cut(r: AddrRange, pieces: int) -> list[AddrRange]:
    step = max(HUGE_PAGE_BYTES, r.size // pieces // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES)
    starts = range(r.start, r.end, step)
    return [AddrRange(s, min(r.end, s + step)) for s in starts]


def decide_ms(reps: int, mappings: int) -> tuple[float, int]:
    """Fastest ms per snapshot, and the number of mappings given."""
    rec = Recording.load(PASSIVE)
    hot, cold = rec.ground_truth["hot"], rec.ground_truth["cold"]
    maps = [hot, cold] if mappings <= 2 else cut(hot, mappings // 4) + cut(cold, mappings
                                                                          - mappings // 4)
    params = params_for_source(PolicyParams(), physical=True, can_demote=False)
    best = float("inf")
    for _ in range(reps):
        state = PolicyState()
        t0 = time.process_time()
        for snap in rec.snapshots:
            d, state = decide(snap, state, params, mappings=maps)
            state = record_outcomes(state, {s: None for s in d.promote}, params,
                                    snap.taken_at_s)
        best = min(best, time.process_time() - t0)
    return 1e3 * best / len(rec.snapshots), len(maps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15, help="passes; the fastest counts (15)")
    ap.add_argument("--mappings", default="2,400",
                    help="comma-separated mapping counts for decide (default 2,400)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.mappings.split(",")]
    except ValueError:
        ap.error(f"--mappings: comma-separated integers, not {args.mappings!r}")
    if args.reps < 1 or any(c < 1 for c in counts):
        ap.error("--reps and every --mappings count must be at least 1")
    reader, regions = reader_ms(args.reps)
    decided = [(*decide_ms(args.reps, c),) for c in counts]
    if args.json:
        print(json.dumps({"reader_ms_per_aggregation": round(reader, 3), "regions": regions,
                          "decide_ms_per_snapshot": {str(n): round(ms, 3)
                                                     for ms, n in decided}}))
        return 0
    print(f"reader: {reader:.2f} ms per aggregation of {regions} regions")
    for ms, n in decided:
        print(f"decide: {ms:.2f} ms per snapshot, {n} mappings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
