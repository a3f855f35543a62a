"""How soon damon-hp acts on what the foreign kdamond shows, on this host's passive source.

Speed in seconds is physics here (the kdamond's 5-s aggregations, how its regions split around
the target's frames, the machine's load); the claim this test holds is in the kdamond's own
terms: once the kdamond has read a hot range as busy enough for the rule -- its latest steady
readings holding 8 sampled accesses at 30 % of the samples (one reading of 8 of 10, two of 4,
three of 3) -- the range is
collapsed in that same step or the next (rate limit, a refused collapse retried), and no range
is collapsed that the kdamond never read accessed. Judged on the agent's own recording of what
it was given (`--record`: the reverse-mapped readings with first-touch marks) and its action
log; the time in seconds to a huge hot set is a benchmark figure (docs/results.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from damon_hp.damon.model import Recording
from damon_hp.ranges import HUGE_PAGE_BYTES as H
from foreign_view import SEES_HOT_SHARE, foreign_intervals, kdamond_sees

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = str(Path(sys.executable).parent / "damon-hp")
HOTCOLD = str(ROOT / "workloads/bin/hotcold")
# hotcold writes its cold buffer first: a cold buffer of a few GiB takes up the small free
# blocks of a long-running machine, so the hot buffer's frames come from whole blocks, where the
# foreign paddr kdamond can tell them apart. On this host after an afternoon of VM runs a
# 512 MiB buffer lay in 6,917 physical 2 MiB blocks (256 would hold it) and read idle to the
# kdamond; hotcold 1G/3G (test_agent_passive) was seen and promoted.
ABSORBING_COLD = "3G"


def test_a_hot_range_the_kdamond_shows_busy_is_collapsed_within_one_step(
        tmp_path, foreign_kdamond) -> None:
    out, rec_path = tmp_path / "run.json", tmp_path / "rec.json"
    env = {**os.environ, "DAMON_HP_RUN_DIR": str(tmp_path / "run")}
    p = subprocess.Popen([DAMON_HP, "run", "-q", "--json", str(out), "--record", str(rec_path),
                          "--", HOTCOLD, "--hot", "512M", "--cold", ABSORBING_COLD,
                          "--seconds", "45"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = json.loads(p.stdout.readline())
        hot, cold = first["hot"], first["cold"]
        # What the kdamond itself shows of the hot buffer, read beside the run (not through
        # damon-hp's reverse map): whether a physical source can act on it at all. One
        # aggregation later: the one in progress holds the buffer's first touch.
        time.sleep(foreign_intervals(foreign_kdamond.dir)["aggr_us"] / 1e6)
        sees = kdamond_sees(first["pid"], hot["start"], hot["end"], foreign_kdamond.dir,
                            foreign_kdamond.pid)
        _, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, stderr
    report = json.loads(out.read_text())
    assert report["summary"]["source"]["name"] == "passive"
    rec = Recording.load(rec_path)
    timeline = report["timeline"]
    offset = timeline[0]["monotonic_s"] - timeline[0]["t_s"]  # agent start, monotonic
    collapsed: dict[int, float] = {}  # range -> monotonic time of its first successful collapse
    for a in report["actions"]:
        if a["action"] == "collapse" and a["error"] is None:
            collapsed.setdefault(a["start"], a["t_s"] + offset)

    def readings(snap) -> dict[int, float]:
        """range -> its reading as a share of the samples, times 10 (the host's 10 per
        aggregation)"""
        return {r.start - r.start % H: 10 * r.nr_accesses / snap.max_nr_accesses
                for r in snap.regions if r.end - r.start <= H}

    seen = [(s.taken_at_s, readings(s), s.unsteady) for s in rec.snapshots]
    assert seen, "no snapshot reached the agent"
    # Hot ranges whose evidence sufficed, and the snapshot after which it did: a run of steady
    # readings up to this one (newest first; two idle ones in a row end it) reaching 8 accesses
    # at 30 % of 10 samples each.
    due: dict[int, int] = {}
    for i, (_, now, unsteady) in enumerate(seen):
        for start in now:
            if not hot["start"] <= start < hot["end"] or start in due or start in unsteady:
                continue
            total, idle = 0.0, 0
            for k, (_, then, withheld) in enumerate(reversed(seen[: i + 1])):
                if start in withheld or start not in then:
                    break
                idle = idle + 1 if then[start] == 0 else 0
                if idle > 1:
                    break
                total += then[start]
                if total >= 8 and total >= 0.3 * 10 * (k + 1):
                    due[start] = i
                    break
    hot_ranges = (hot["end"] - hot["start"]) // H
    print(f"the kdamond read {sees:.0%} of the hot buffer accessed; {len(due)} of {hot_ranges} "
          f"hot ranges read busy enough; {len(collapsed)} collapsed; snapshots {len(seen)}; "
          f"{report['summary']['unsteady_readings']} readings withheld")
    # Precondition, from the kdamond's own record: where it read the hot buffer accessed, the
    # reverse map must show it busy (else the reverse map is broken). Where it read it idle (the
    # process's frames scattered among busy and idle frames of others in every region of a
    # fragmented machine, foreign_view.SEES_HOT_SHARE) no physical source can act: only the
    # checks below that need no hot set are made, and the line above says so.
    if sees >= SEES_HOT_SHARE:
        assert len(due) >= 0.1 * hot_ranges, (
            f"the kdamond read {sees:.0%} of the hot buffer accessed, but damon-hp's readings "
            f"showed only {len(due)} of {hot_ranges} hot ranges busy enough")
    late = []
    for start, i in due.items():
        # collapsed by the end of the next step (the next snapshot's time, or the run's end)
        deadline = seen[i + 2][0] if i + 2 < len(seen) else float("inf")
        if collapsed.get(start, float("inf")) > deadline:
            late.append(start)
    assert len(late) <= 0.1 * len(due), f"{len(late)} of {len(due)} ranges late: {late[:5]}"
    # No collapse without evidence: every collapsed range read accessed in a steady reading
    # before its collapse.
    for start, t in collapsed.items():
        assert any(now.get(start, 0) > 0 and start not in unsteady
                   for taken, now, unsteady in seen if taken <= t), hex(start)
    cold_collapsed = [s for s in collapsed if cold["start"] <= s < cold["end"]]
    assert len(cold_collapsed) <= len([s for s in collapsed if hot["start"] <= s < hot["end"]])
