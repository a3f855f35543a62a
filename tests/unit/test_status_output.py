"""`damon-hp status` on a record as an agent writes it: what it did, refusals included."""

from __future__ import annotations

import argparse
import json
import os

from damon_hp.commands import status
from damon_hp.damon import ownership


def record(run_dir, **fields) -> None:
    me = os.getpid()  # a live process, so that the record reads as a running agent
    rec = {"agent_pid": me, "agent_start_ticks": ownership.process_start_ticks(me),
           "mode": "attach", "target_pid": 4242, "command": ["hotcold"], "promotions": 2,
           "promoted_bytes": 4 << 20, "collapsed_bytes": 4 << 20, "snapshots": 7, **fields}
    (run_dir / f"agent-{me}.json").write_text(json.dumps(rec))


def test_refused_collapses_are_listed_with_their_errors(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DAMON_HP_RUN_DIR", str(tmp_path))
    record(tmp_path, collapses_tried=7, collapse_errors={"EBUSY": 4, "EAGAIN": 1})
    assert status.main(argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    assert "[running], attach target pid 4242" in out
    assert "refused   5 collapses (EAGAIN 1, EBUSY 4)" in out


def test_no_refusal_line_when_every_collapse_went_through(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DAMON_HP_RUN_DIR", str(tmp_path))
    record(tmp_path, collapses_tried=2, collapse_errors={})
    assert status.main(argparse.Namespace(json=False)) == 0
    assert "refused" not in capsys.readouterr().out
