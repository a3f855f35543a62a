"""When damon-hpd writes a managed process's status record again (status_refresh.due): on any
change but its figures at once, a figure when it leaves 0, other moves of the figures at most
every STATUS_FIGURES_EVERY_S, so 50 busy processes do not mean 50 files rewritten every
aggregation."""

from __future__ import annotations

from damon_hp.daemon.status_refresh import FIGURES, STATUS_FIGURES_EVERY_S
from damon_hp.daemon.status_refresh import due as status_due
from damon_hp.daemon.status_refresh import split as split_record

REC = {"target_pid": 7, "rule": "a", "skipped": None, "snapshots": 3, "hot_bytes": 4 << 20,
       "anon_huge_bytes": 0, "promotions": 0, "updated": 1.0}
T0 = 100.0


def written(rec: dict, at: float = T0) -> tuple[dict, dict, float]:
    return (*split_record(rec), at)


def test_split_keeps_every_field_but_the_time() -> None:
    stable, figures = split_record(REC)
    assert {**stable, **figures} == {k: v for k, v in REC.items() if k != "updated"}
    assert set(figures) <= set(FIGURES) and "target_pid" in stable


def test_a_record_never_written_is_due() -> None:
    assert status_due(None, REC, T0)


def test_a_change_of_what_is_not_a_figure_is_written_at_once() -> None:
    assert status_due(written(REC), {**REC, "skipped": "THP off"}, T0 + 0.1)
    assert status_due(written(REC), {**REC, "rule": "b"}, T0 + 0.1)
    assert not status_due(written(REC), {**REC, "updated": 9.0}, T0 + 0.1)


def test_a_figure_leaving_zero_is_written_at_once() -> None:
    assert status_due(written(REC), {**REC, "anon_huge_bytes": 2 << 20}, T0 + 0.1)
    assert status_due(written({**REC, "snapshots": 0}), REC, T0 + 0.1)


def test_other_moves_of_the_figures_wait_for_the_refresh() -> None:
    later = T0 + STATUS_FIGURES_EVERY_S
    busier = {**REC, "snapshots": 4, "hot_bytes": 6 << 20}
    assert not status_due(written(REC), busier, later - 0.1)
    assert status_due(written(REC), busier, later)
    assert not status_due(written(REC), {**REC, "updated": 5.0}, later + 1000)  # nothing new
