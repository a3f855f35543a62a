"""kdamonds DAMON sysfs does not list (DAMON_STAT, DAMON_RECLAIM, DAMON_LRU_SORT): found from
/sys/module and /proc, never written; they block every start and are read passively.

The /sys/module and /proc trees are built here with the values read in the test VM on Debian's
7.3.4+deb13-amd64 as booted (`damon-hp vm run -- sh -c 'cat /sys/module/damon_stat/parameters/*;
ps -eo pid,comm | grep kdamond'`, 2026-11-25): DAMON_STAT enabled, kdamond_pid 55, comm
`kdamond.0`, aggr_interval_us 400000; DAMON_RECLAIM and DAMON_LRU_SORT present and off.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from damon_hp.damon import DamonStatus, plan_placement, plan_start
from damon_hp.damon.assembler import SnapshotAssembler
from damon_hp.damon.event_lines import parse_tune_line
from damon_hp.damon.modules import ModuleKdamond, module_kdamonds, unlisted_kdamonds
from damon_hp.damon.sources import _pick_module
from damon_hp.errors import EnvironmentProblem


def _tree(tmp_path: Path, *, stat_on: bool = True, aggr_us: str = "400000",
          extra_kdamonds: tuple[int, ...] = ()) -> tuple[Path, Path]:
    sysmod, proc = tmp_path / "module", tmp_path / "proc"
    params = {
        "damon_stat": {"enabled": "Y" if stat_on else "N", "kdamond_pid": "55" if stat_on
                       else "-1", "aggr_interval_us": aggr_us},
        "damon_reclaim": {"enabled": "N", "kdamond_pid": "-1", "sample_interval": "5000",
                          "aggr_interval": "100000", "autotune_monitoring_intervals": "N"},
        "damon_lru_sort": {"enabled": "N", "kdamond_pid": "-1", "sample_interval": "5000",
                           "aggr_interval": "100000", "autotune_monitoring_intervals": "N"},
    }
    for mod, values in params.items():
        d = sysmod / mod / "parameters"
        d.mkdir(parents=True)
        for name, value in values.items():
            (d / name).write_text(value + "\n")
    threads = {1: "systemd", 2: "kthreadd", 300: "python3"}
    if stat_on:
        threads[55] = "kdamond.0"
    threads.update({pid: f"kdamond.{i + 1}" for i, pid in enumerate(extra_kdamonds)})
    for pid, comm in threads.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
    return sysmod, proc


def test_damon_stat_is_found_with_its_current_intervals(tmp_path):
    sysmod, proc = _tree(tmp_path)
    [m] = module_kdamonds(sysmod, proc)
    assert (m.module, m.label, m.pid, m.ops) == ("damon_stat", "DAMON_STAT", 55, "paddr")
    # aggr_interval_us is the tuned one; the kernel keeps aggr = 20 samples (stat.c, core.c).
    assert (m.sample_us, m.aggr_us, m.autotuned) == (20_000, 400_000, True)


def test_damon_stat_before_its_first_refresh_has_its_start_intervals(tmp_path):
    sysmod, proc = _tree(tmp_path, aggr_us="0")
    [m] = module_kdamonds(sysmod, proc)
    assert (m.sample_us, m.aggr_us) == (5_000, 100_000)


def test_modules_that_are_off_are_not_reported(tmp_path):
    sysmod, proc = _tree(tmp_path, stat_on=False)
    assert module_kdamonds(sysmod, proc) == []
    assert unlisted_kdamonds(set(), sysmod, proc) == []


def test_a_kdamond_thread_neither_sysfs_nor_a_module_lists_is_reported_as_unknown(tmp_path):
    sysmod, proc = _tree(tmp_path, extra_kdamonds=(70, 71))
    found = unlisted_kdamonds({70}, sysmod, proc)  # 70 is a sysfs kdamond
    assert [(m.module, m.pid) for m in found] == [("damon_stat", 55), ("", 71)]
    assert found[1].label == "an in-kernel DAMON user"


STAT = ModuleKdamond("damon_stat", 55, 20_000, 400_000, True)


def test_a_running_module_blocks_every_start_and_the_message_names_it_not_a_lock():
    st = DamonStatus(True, True, None, ("vaddr", "fvaddr", "paddr"), "avail_operations", (),
                     unlisted=(STAT,))
    for ops in ("vaddr", "paddr"):
        with pytest.raises(EnvironmentProblem) as e:
            plan_start(st, ops)
        text = str(e.value)
        assert "DAMON_STAT" in text and "exclusive" in text and "pid 55" in text
        assert "not a lock" in text
        assert "/sys/module/damon_stat/parameters/enabled" in text
    with pytest.raises(EnvironmentProblem):
        plan_placement(st)


def test_an_unknown_unlisted_kdamond_does_not_block_a_start():
    # It may be a sysfs kdamond that started between the sysfs and the /proc reads.
    unknown = ModuleKdamond("", 71, None, None, False)
    st = DamonStatus(True, True, None, ("vaddr", "paddr"), "avail_operations", (),
                     unlisted=(unknown,))
    assert plan_start(st, "vaddr").index == 0


def test_status_round_trips_its_unlisted_kdamonds():
    st = DamonStatus(True, True, None, ("paddr",), "avail_operations", (), unlisted=(STAT,))
    back = DamonStatus.from_dict(st.to_dict())
    assert back.unlisted == (STAT,) and back.exclusive == (STAT,)


def test_passive_picks_the_module_or_the_module_asked_for_by_pid():
    st = DamonStatus(True, True, None, ("paddr",), "avail_operations", (), unlisted=(STAT,))
    assert _pick_module(st, None) == STAT
    assert _pick_module(st, 55) == STAT
    assert _pick_module(st, 99) is None  # not a module's: sysfs is searched (and says so)
    unknown = ModuleKdamond("", 71, None, None, False)
    st2 = DamonStatus(True, True, None, ("paddr",), "avail_operations", (), unlisted=(unknown,))
    with pytest.raises(EnvironmentProblem, match="intervals cannot be read"):
        _pick_module(st2, 71)


def test_tune_line_gives_the_new_sampling_interval():
    line = ("       kdamond.0-55      [001] .....   412.118000: damon_monitor_intervals_tune: "
            "sample_us=12500")
    assert parse_tune_line(line) == 12_500
    assert parse_tune_line(line.replace("12500", "0")) is None
    assert parse_tune_line("kdamond.0-55 [001] 1.0: damon_aggregated: target_id=0") is None


def test_retune_keeps_the_samples_per_aggregation_and_moves_both_intervals():
    a = SnapshotAssembler(sample_us=20_000, aggr_us=400_000, clock=None)
    a.retune(12_500)
    assert (a.sample_us, a.aggr_us, a.retunes) == (12_500, 250_000, 1)


# --------------------------------------------------------------------------------------------
# module_pause: --pause-damon-stat's record and its restoration (fake /sys/module tree)


def _stat_tree(tmp_path: Path) -> tuple[Path, Path]:
    sysmod = tmp_path / "module"
    (sysmod / "damon_stat" / "parameters").mkdir(parents=True)
    (sysmod / "damon_stat" / "parameters" / "enabled").write_text("Y\n")
    run = tmp_path / "run"
    return sysmod, run


def test_pause_records_first_then_turns_off_and_restore_puts_back_what_was_there(tmp_path):
    from damon_hp.damon import module_pause

    sysmod, run = _stat_tree(tmp_path)
    rec = module_pause.pause("damon_stat", run, sysmod)
    assert rec is not None and rec.previous == "Y" and rec.agent_alive()
    assert (sysmod / "damon_stat/parameters/enabled").read_text() == "N"
    assert module_pause.read_records(run) == [rec]
    assert module_pause.restore_stale(run, sysmod) == []  # its agent (this process) lives
    module_pause.restore(rec, run, sysmod)
    assert (sysmod / "damon_stat/parameters/enabled").read_text() == "Y"
    assert module_pause.read_records(run) == []


def test_a_module_that_is_off_is_not_paused(tmp_path):
    from damon_hp.damon import module_pause

    sysmod, run = _stat_tree(tmp_path)
    (sysmod / "damon_stat/parameters/enabled").write_text("N\n")
    assert module_pause.pause("damon_stat", run, sysmod) is None
    assert module_pause.read_records(run) == []


def test_the_pause_of_a_dead_agent_is_undone_by_the_next_start(tmp_path):
    import dataclasses
    import json
    import subprocess

    from damon_hp.damon import module_pause

    sysmod, run = _stat_tree(tmp_path)
    rec = module_pause.pause("damon_stat", run, sysmod)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = dataclasses.replace(rec, agent_pid=dead.pid)
    (run / "paused-damon_stat.json").write_text(json.dumps(dataclasses.asdict(stale)))
    assert "gone" in module_pause.read_records(run)[0].describe()
    done = module_pause.restore_stale(run, sysmod)
    assert len(done) == 1 and "DAMON_STAT turned back on" in done[0]
    assert (sysmod / "damon_stat/parameters/enabled").read_text() == "Y"
    assert module_pause.read_records(run) == []
