"""List the damon-hp agents running on this system: target, since when, what they did.

Each running agent keeps a status record in /run/damon-hp (DAMON_HP_RUN_DIR) that it refreshes
every second and removes when it exits (damon-hpd keeps one per managed process, rewritten when
its figures change; a snapshot count that alone moved, at most every 15 s). A record whose agent
is gone (it was killed) is shown as stale; the next `damon-hp run` or `attach` also stops a
kdamond such an agent left behind.
Read-only: needs no root unless the run directory is private.

examples:
  damon-hp status
  damon-hp status --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from damon_hp import status_records
from damon_hp.damon import module_pause
from damon_hp.errors import DamonHpError
from damon_hp.report import fmt_bytes


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the records as JSON")


def _since(wall: float | None) -> str:
    if not wall:
        return "?"
    age = max(0, int(time.time() - wall))
    h, rem = divmod(age, 3600)
    m, s = divmod(rem, 60)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall))
    return f"{stamp} ({h}:{m:02d}:{s:02d} ago)"


def main(args: argparse.Namespace) -> int:
    try:
        found = status_records.read_statuses(include_invalid=True)
    except DamonHpError as e:
        print(f"damon-hp status: {str(e).removeprefix('damon-hp: ')}", file=sys.stderr)
        return e.exit_code
    records = [r for r in found if "invalid" not in r]
    invalid = [r for r in found if "invalid" in r]
    for r in invalid:
        print(f"damon-hp status: ignored {r['path']}: {r['invalid']} (the next damon-hp run or "
              "attach removes it)", file=sys.stderr)
    paused = module_pause.read_records()
    if args.json:
        print(json.dumps({"agents": records,
                          "invalid_records": [r["path"] for r in invalid],
                          "paused_modules": [{**asdict(p), "agent_alive": p.agent_alive()}
                                             for p in paused]}, indent=1))
        return 0
    for p in paused:
        print(f"damon-hp: {p.describe()}")
    if not records:
        print("damon-hp: no damon-hp agents are running")
        return 0
    for r in records:
        cmd = " ".join(r.get("command") or []) or "?"
        state = "running" if r["alive"] else "STALE (agent gone; its kdamond is stopped at "\
            "the next damon-hp start)"
        if r.get("starting") and r["alive"]:
            state = "starting"
        print(f"agent pid {r.get('agent_pid')} [{state}], {r.get('mode')} "
              f"target pid {r.get('target_pid')}: {cmd}")
        print(f"  since     {_since(r.get('since'))}")
        print(f"  kdamond   {_kdamond(r)}")
        print(f"  promoted  {r.get('promotions', 0)} ranges, holds "
              f"{fmt_bytes(r.get('promoted_bytes'))} promoted, collapsed "
              f"{fmt_bytes(r.get('collapsed_bytes'))}; demoted {r.get('demotions', 0)}")
        print(f"  memory    AnonHugePages {fmt_bytes(r.get('anon_huge_bytes'))}, hot "
              f"{fmt_bytes(r.get('hot_bytes'))}; {r.get('snapshots', 0)} snapshots")
        if r.get("collapse_errors"):
            why = ", ".join(f"{k} {v}" for k, v in sorted(r["collapse_errors"].items()))
            print(f"  refused   {sum(r['collapse_errors'].values())} collapses ({why})")
        if r.get("skipped"):
            print(f"  skipped   {r['skipped']}")
    sys.stdout.flush()
    return 0


def _kdamond(r: dict) -> str:
    index, pid = r.get("kdamond_index"), r.get("kdamond_pid")
    if index is not None:
        return f"{index} (pid {pid})"
    # Passive sources (run, attach, damon-hpd) read a kdamond they did not start: no index
    # of theirs to show.
    return f"pid {pid}, read only (not started by this agent)" if pid else "none"
