"""Ownership records: what proves a kdamond is damon-hp's, checked against real processes.

A kdamond is a kernel thread named kdamond.N; here a child process renames itself so (prctl
PR_SET_NAME) to stand in for one, so the proof logic runs on a real /proc entry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from damon_hp.damon import ownership

FAKE_KDAMOND = """
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, b"kdamond.0", 0, 0, 0)  # PR_SET_NAME
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def kdamond_like():
    p = subprocess.Popen([sys.executable, "-c", FAKE_KDAMOND], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    yield p.pid
    p.kill()
    p.wait()


@pytest.fixture
def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def record(index=0, kdamond_pid=None, agent_pid=None, target=100, created=0,
           boot=None) -> ownership.OwnerRecord:
    me = os.getpid() if agent_pid is None else agent_pid
    return ownership.OwnerRecord(
        kdamond_index=index, kdamond_pid=kdamond_pid, agent_pid=me,
        agent_start_ticks=ownership.process_start_ticks(me) or 1, target_pid=target,
        created_ticks=created, started_at=time.time(),
        boot_id=ownership.boot_id() if boot is None else boot)


def test_record_proves_the_kdamond_whose_pid_it_holds(kdamond_like):
    rec = record(kdamond_pid=kdamond_like)
    assert rec.proves(0, kdamond_like, (100,))


def test_record_proves_nothing_for_another_pid_index_or_boot(kdamond_like):
    assert not record(kdamond_pid=kdamond_like + 1).proves(0, kdamond_like, (100,))
    assert not record(index=1, kdamond_pid=kdamond_like).proves(0, kdamond_like, (100,))
    assert not record(kdamond_pid=kdamond_like, boot="another-boot").proves(
        0, kdamond_like, (100,))


def test_record_proves_nothing_for_a_process_that_is_not_a_kdamond():
    # This test process has the right pid in the record, but it is not named kdamond*.
    assert not record(kdamond_pid=os.getpid()).proves(0, os.getpid(), (100,))


def test_provisional_record_needs_a_later_start_and_the_same_target(kdamond_like):
    started = ownership.process_start_ticks(kdamond_like)
    assert record(created=started, target=100).proves(0, kdamond_like, (100,))
    assert not record(created=started + 1, target=100).proves(0, kdamond_like, (100,))
    assert not record(created=started, target=101).proves(0, kdamond_like, (100,))


def test_agent_liveness_uses_start_time_so_a_reused_pid_is_not_alive(dead_pid):
    assert record().agent_alive()
    assert not record(agent_pid=dead_pid).agent_alive()
    reused = ownership.OwnerRecord(**{**record().to_dict(), "agent_start_ticks": 1})
    assert not reused.agent_alive()


def test_records_round_trip_through_the_run_dir(tmp_path):
    rec = record(index=3, kdamond_pid=55)
    path = ownership.write_record(rec, tmp_path)
    assert path.name == "kdamond-3.json"
    assert ownership.read_records(tmp_path) == {3: rec}
    (tmp_path / "kdamond-9.json").write_text("{not json")
    assert ownership.read_records(tmp_path) == {3: rec}  # a malformed file proves nothing


def test_remove_record_with_only_keeps_a_record_another_agent_wrote_since(tmp_path):
    mine = record(index=0, created=10)
    theirs = ownership.OwnerRecord(**{**mine.to_dict(), "created_ticks": 20})
    ownership.write_record(theirs, tmp_path)
    ownership.remove_record(0, tmp_path, only=mine)
    assert ownership.read_records(tmp_path) == {0: theirs}
    ownership.remove_record(0, tmp_path, only=theirs)
    assert ownership.read_records(tmp_path) == {}
