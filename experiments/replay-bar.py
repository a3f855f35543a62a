#!/usr/bin/env python3
"""Replay recorded snapshots through the decision rule under other evidence bars. Not a test.

A recording is what `damon-hp run|attach --record FILE` writes (the apps experiment keeps one
per damon-hp run: runs/<cell>/agent-record.json). Each recording is replayed from its first
snapshot with every planned collapse taken as done, once per bar (`--bar ACCESSES:PCT`, the
promotion evidence: that many sampled accesses at that share of the samples; the physical
sources' default is 8:30). Printed per bar and recording: the memory promoted, and where the
recording holds its workload's ground truth (hot and cold ranges, as the test fixtures do), the
share of each promoted. Its mappings are the ground truth's ranges, or else the extent of the
recorded regions.

  .venv/bin/python experiments/replay-bar.py --physical --bar 8:30 --bar 8:20 --bar 8:10 \\
      --bar 6:10 --bar 4:10 tests/fixtures/passive-hotcold-1g-3g-host-6.18.json.gz \\
      APPS_OUT/runs/redis-ycsb-5m_t16_damon-hp_sufficient_r0/agent-record.json

The rule of another commit replays the same recordings with PYTHONPATH=CHECKOUT/agent
(`git worktree add /tmp/before COMMIT`); `--bar 1:5` without `--physical` is the vaddr rule's
default.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "agent"))  # after PYTHONPATH: another checkout's agent can replay

from damon_hp.damon.model import Recording, Snapshot  # noqa: E402
from damon_hp.pipeline import params_for_source  # noqa: E402
from damon_hp.policy import PolicyParams, PolicyState, decide, record_outcomes  # noqa: E402
from damon_hp.ranges import HUGE_PAGE_BYTES as H  # noqa: E402
from damon_hp.ranges import AddrRange, merge_adjacent  # noqa: E402

MIB = 1 << 20


def load(path: Path) -> tuple[list[Snapshot], dict[str, AddrRange]]:
    """Snapshots and ground truth of a recording: damon-hp's own format, or the compact one of
    tests/fixtures/passive-*.json.gz (damon.model.Recording.load reads both)."""
    rec = Recording.load(path)
    return list(rec.snapshots), rec.ground_truth


def promoted(snaps: list[Snapshot], params: PolicyParams,
             mappings: list[AddrRange]) -> set[int]:
    state, out = PolicyState(), set()
    for snap in snaps:
        dec, state = decide(snap, state, params, mappings=mappings)
        state = record_outcomes(state, {s: None for s in dec.promote}, params, snap.taken_at_s)
        out.update(dec.promote)
    return out


def bar_arg(text: str) -> tuple[float, float]:
    try:
        accesses, pct = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not ACCESSES:PCT (sampled accesses, then percent of samples; the "
            "physical default is 8:30)") from None
    if accesses < 0 or not 0 <= pct <= 100:
        raise argparse.ArgumentTypeError(f"{text!r}: accesses must be >= 0, PCT within 0..100")
    return accesses, pct


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recordings", nargs="+", type=Path)
    ap.add_argument("--bar", action="append", required=True, metavar="ACCESSES:PCT", type=bar_arg,
                    help="promotion evidence to replay with (repeat for several)")
    ap.add_argument("--physical", action="store_true",
                    help="the physical sources' rule (no age seed, no demotion)")
    args = ap.parse_args()
    base = params_for_source(PolicyParams(), physical=args.physical, can_demote=False)
    missing = [p for p in args.recordings if not p.is_file()]
    if missing:
        ap.error(f"no such recording: {', '.join(map(str, missing))} (damon-hp run --record "
                 "writes one)")
    recs = {p: load(p) for p in args.recordings}
    for accesses, pct in args.bar:
        bar = f"{accesses:g}:{pct:g}"
        params = dataclasses.replace(base, promote_min_accesses=accesses,
                                     promote_access_pct=pct)
        for path, (snaps, truth) in recs.items():
            maps = (sorted(truth.values()) if truth else
                    merge_adjacent(AddrRange(r.start, r.end) for s in snaps for r in s.regions))
            got = promoted(snaps, params, maps)
            shares = "".join(
                f", {name} {sum(1 for s in got if r.start <= s < r.end) * H / r.size:.1%}"
                for name, r in truth.items())
            print(f"bar {bar}: {path}: {len(got) * H / MIB:.0f} MiB promoted{shares}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
