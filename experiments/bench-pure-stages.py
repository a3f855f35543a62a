#!/usr/bin/env python3
"""CPU per aggregation of the two pipeline stages that need no live process (issue 26). Not a
test.

  reader  the event reader's Python, both ways it reads: the per-CPU trace_pipe_raw pages it
          reads where tracefs gives their layout (raw_reader.decode_cpus, then the
          assembler's feed_array), from tests/fixtures/damon-raw-paddr-host-6.18.json.gz; and
          the trace_pipe text it falls back to (text_reader.TextFeed, fed in 64 KiB reads),
          the recorded text of this host's foreign kdamond
          (tests/fixtures/damon-aggregated-paddr-host-6.18.txt);
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
import base64
import gzip
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "agent"))  # after PYTHONPATH: another commit's agent comes first

from damon_hp.damon.assembler import SnapshotAssembler  # noqa: E402
from damon_hp.damon.event_pages import (  # noqa: E402
    AGGREGATED_FIELDS,
    TUNE_FIELDS,
    page_layout,
    record_layout,
)
from damon_hp.damon.model import Recording  # noqa: E402
from damon_hp.damon.raw_reader import RawLayouts, decode_cpus  # noqa: E402
from damon_hp.damon.text_reader import TextFeed  # noqa: E402
from damon_hp.pipeline import params_for_source  # noqa: E402
from damon_hp.policy import PolicyParams, PolicyState, decide, record_outcomes  # noqa: E402
from damon_hp.ranges import HUGE_PAGE_BYTES, AddrRange  # noqa: E402

TRACE = ROOT / "tests/fixtures/damon-aggregated-paddr-host-6.18.txt"
RAW = ROOT / "tests/fixtures/damon-raw-paddr-host-6.18.json.gz"
PASSIVE = ROOT / "tests/fixtures/passive-hotcold-1g-3g-host-6.18.json.gz"
READ_BYTES = 1 << 16


def reader_ms(reps: int) -> tuple[float, int]:
    """Text: fastest ms per aggregation, and regions per aggregation."""
    lines = [ln for ln in TRACE.read_text().splitlines(keepends=True) if not ln.startswith("#")]
    data = "".join(lines).encode()
    best, snaps = float("inf"), 0
    for _ in range(reps):
        feed = TextFeed(follow_tuning=False)
        assembler = SnapshotAssembler(sample_us=500_000, aggr_us=5_000_000, clock=None)
        got = []
        t0 = time.process_time()
        for i in range(0, len(data), READ_BYTES):
            got += feed.feed_bytes(data[i:i + READ_BYTES], assembler)[0]
        best = min(best, time.process_time() - t0)
        snaps = len(got)
    if snaps == 0:
        sys.exit("bench-pure-stages: the recorded trace gave no snapshot")
    return 1e3 * best / snaps, len(lines) // snaps


def raw_reader_ms(reps: int) -> tuple[float, float, int]:
    """Pages: fastest ms per aggregation, of it the fastest decoding alone, and regions per
    aggregation: what RawPipes.read does with what it read (raw_reader.decode_cpus, then the
    assembler)."""
    with gzip.open(RAW, "rt") as f:
        rec = json.load(f)
    layouts = RawLayouts(page_layout(rec["header_page"]),
                         record_layout(rec["format"], AGGREGATED_FIELDS),
                         record_layout(rec["tune_format"], TUNE_FIELDS))
    by_cpu: dict[int, list[bytes]] = {}
    for cpu, raw in rec["pages"]:
        by_cpu.setdefault(cpu, []).append(base64.b64decode(raw))
    best, best_decode, snaps, regions = float("inf"), float("inf"), [], 0
    for _ in range(reps):
        assembler = SnapshotAssembler(sample_us=500_000, aggr_us=5_000_000, clock=None)
        t0 = time.process_time()
        got = decode_cpus(by_cpu.values(), layouts)
        t1 = time.process_time()
        snaps = assembler.feed_array(got.events) if got is not None else []
        best = min(best, time.process_time() - t0)
        best_decode = min(best_decode, t1 - t0)
        regions = len(got.events) if got is not None else 0
    if not snaps:
        sys.exit("bench-pure-stages: the recorded pages gave no snapshot")
    return 1e3 * best / len(snaps), 1e3 * best_decode / len(snaps), regions // len(snaps)


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
    raw, raw_decode, raw_regions = raw_reader_ms(args.reps)
    reader, regions = reader_ms(args.reps)
    decided = [(*decide_ms(args.reps, c),) for c in counts]
    if args.json:
        print(json.dumps({"raw_reader_ms_per_aggregation": round(raw, 3),
                          "raw_decode_ms_per_aggregation": round(raw_decode, 3),
                          "raw_regions": raw_regions,
                          "reader_ms_per_aggregation": round(reader, 3), "regions": regions,
                          "decide_ms_per_snapshot": {str(n): round(ms, 3)
                                                     for ms, n in decided}}))
        return 0
    print(f"reader, pages: {raw:.2f} ms per aggregation of {raw_regions} regions "
          f"(decoding them {raw_decode:.2f})")
    print(f"reader, text: {reader:.2f} ms per aggregation of {regions} regions")
    for ms, n in decided:
        print(f"decide: {ms:.2f} ms per snapshot, {n} mappings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
