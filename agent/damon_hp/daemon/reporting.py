"""What damon-hpd tells: journal lines, each managed process's status record, the summary,
and the `--json` report. Functions of the running Service (service.py), which owns the state.

    log(text)                        one journal line (stderr)
    status_record(svc, m, info)      a managed process's record, as `damon-hp status` reads it
    write_statuses(svc)              the records due again (status_refresh.due)
    summary(svc) / to_json(svc)      the journal summary, the --json report
    write_json(svc)                  the report, atomically, if --json was asked for
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from damon_hp import report, stagecpu, status_records
from damon_hp.daemon import status_refresh
from damon_hp.damon import ownership

if TYPE_CHECKING:
    from damon_hp.daemon.managed import Managed
    from damon_hp.daemon.service import Service


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def log(text: str) -> None:
    print(f"damon-hpd: {text}", file=sys.stderr, flush=True)


def status_record(svc: Service, m: Managed, source_info: dict[str, Any]) -> dict[str, Any]:
    assert svc.source is not None
    if svc.start_ticks is None:
        svc.start_ticks = ownership.process_start_ticks(os.getpid())
    return {
        "agent_pid": os.getpid(),
        "agent_start_ticks": svc.start_ticks,
        "mode": f"daemon (rule {m.rule})",
        "rule": m.rule,
        "target_pid": m.pid,
        "target_start_ticks": m.info.start_ticks,
        "command": list(m.info.cmdline),
        "since": m.since,
        "source": source_info,
        "kdamond_pid": svc.source.kdamond_pid,
        "snapshots": m.snapshots,
        "promotions": m.collapses,
        "promoted_bytes": m.state.promoted_bytes,
        "collapsed_bytes": m.collapsed_bytes,
        "demotions": 0,
        "anon_huge_bytes": m.huge_bytes,
        "hot_bytes": m.hot_bytes,
        "held_by_budget": m.held_by_budget,
        "budget_bytes": svc.budget_bytes,
        "skipped": m.skipped,
        "updated": time.time(),
    }


def write_statuses(svc: Service) -> None:
    """Each managed process's record, where status_refresh.due says so ("updated" is when it
    last was): rewriting every record every 2 s was 25 JSON files written and renamed a second
    at 50 processes."""
    if not svc.managed:
        return
    assert svc.source is not None
    info, now = svc.source.info(), time.monotonic()
    for m in svc.managed.values():
        rec = status_record(svc, m, info)
        if not status_refresh.due(m.status_written, rec, now):
            continue
        try:
            status_records.write_status(rec, path=status_records.status_path(os.getpid(), m.pid))
            m.status_written = (*status_refresh.split(rec), now)
        except OSError:
            pass  # status is a convenience; never let it stop the daemon


def summary(svc: Service) -> str:
    held = sum(m.held_bytes for m in svc.managed.values())
    per_rule: dict[str, int] = {}
    for m in svc.managed.values():
        per_rule[m.rule] = per_rule.get(m.rule, 0) + 1
    rules = ", ".join(f"{k}: {v}" for k, v in sorted(per_rule.items())) or "none"
    b = svc.budget_bytes
    t = svc.totals
    skipped = sum(m.skipped is not None for m in svc.managed.values())
    return (f"{len(svc.managed)} processes managed ({rules}"
            + (f"; {skipped} skipped: THP disabled by the process" if skipped else "")
            + "); huge pages held "
            f"{report.fmt_bytes(held)} of budget "
            f"{report.fmt_bytes(b) if b is not None else 'none'}; {t['collapses']} "
            f"collapses ({report.fmt_bytes(t['collapsed_bytes'])}), {t['errors']} failed; "
            f"ranges held (per snapshot) by the budget {t['held_by_budget']}, by rule "
            f"budgets {t['held_by_rule']}; "
            f"{t['rounds']} snapshots")


def to_json(svc: Service) -> dict[str, Any]:
    return {
        "config": svc.config.path,
        "source": svc.source.info() if svc.source is not None else svc.source_info,
        "budget_bytes": svc.budget_bytes,
        "rule_budgets": svc.rule_budgets(),
        "held_bytes": sum(m.held_bytes for m in svc.managed.values()),
        "processes": [m.to_json() for m in svc.managed.values()],
        "totals": dict(svc.totals),
        "rounds": svc.rounds,
        "wall_s": round(time.monotonic() - svc.started, 3),
        "cpu_s": round(own_cpu_s(), 3),
        "start_cpu_s": round(svc.start_cpu_s, 3),
        "collapse_cpu_s": round(svc.collapse_cpu_s, 3),
        "monitoring_cpu_by_stage": cpu_by_stage(svc),
    }


def cpu_by_stage(svc: Service) -> dict[str, float]:
    """The daemon's CPU per stage so far, every process's pipeline included."""
    total = stagecpu.StageCpu(dict(svc.cpu.seconds))
    for m in svc.managed.values():
        total.merge(m.pipeline.cpu.seconds)
    return total.to_dict()


def write_json(svc: Service) -> None:
    if not svc.json_path:
        return
    try:
        tmp = f"{svc.json_path}.tmp"
        # json.dumps (one string) takes the C encoder; json.dump to a file runs the Python
        # one, ~15 ms per write with 200 rounds of candidates at 50 processes.
        text = json.dumps(to_json(svc))
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, svc.json_path)
    except OSError as e:
        log(f"cannot write --json {svc.json_path}: {e.strerror}")
