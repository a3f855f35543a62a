"""Status records of running agents, one JSON file each, read by `damon-hp status`.

A record names its agent by pid and start time, so a record left by a SIGKILLed agent is known
as dead (and dropped by the next agent) rather than shown as running.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from damon_hp.damon import ownership


def status_path(agent_pid: int | None = None) -> Path:
    return ownership.run_dir() / f"agent-{agent_pid or os.getpid()}.json"


def write_status(rec: dict[str, Any]) -> None:
    path = status_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec) + "\n")
    os.replace(tmp, path)


def remove_status() -> None:
    try:
        status_path().unlink()
    except FileNotFoundError:
        pass


def remove_stale_statuses() -> None:
    """Drop the status records of agents that died without cleaning up (e.g. SIGKILL)."""
    for rec in read_statuses():
        if not rec["alive"]:
            try:
                Path(rec["path"]).unlink()
            except OSError:
                pass


def read_statuses() -> list[dict[str, Any]]:
    """Every agent status record, each with `alive` telling whether its agent still runs."""
    out = []
    for p in sorted(ownership.run_dir().glob("agent-*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        rec["alive"] = (
            ownership.process_start_ticks(int(rec.get("agent_pid", 0)))
            == rec.get("agent_start_ticks")
        )
        rec["path"] = str(p)
        out.append(rec)
    return out


