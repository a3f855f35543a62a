"""When damon-hpd writes a managed process's status record again (service.status_due): on any
change but the snapshot count at once, the count alone when it leaves 0 and then at most every
STATUS_COUNT_EVERY_S, so 50 steady processes do not mean 50 files rewritten every aggregation."""

from __future__ import annotations

from damon_hp.daemon.service import STATUS_COUNT_EVERY_S, status_due

REC = {"target_pid": 7, "hot_bytes": 4 << 20, "anon_huge_bytes": 0}
T0 = 100.0


def test_a_record_never_written_is_due() -> None:
    assert status_due(None, REC, 0, T0)


def test_any_change_but_the_count_is_written_at_once() -> None:
    written = (REC, 3, T0)
    assert status_due(written, {**REC, "anon_huge_bytes": 2 << 20}, 3, T0 + 0.1)
    assert not status_due(written, dict(REC), 3, T0 + 0.1)


def test_the_count_is_written_when_it_leaves_zero_then_at_most_every_refresh() -> None:
    assert not status_due((REC, 0, T0), REC, 0, T0 + 1000)
    assert status_due((REC, 0, T0), REC, 1, T0 + 0.1)  # the first snapshot shows at once
    later = T0 + STATUS_COUNT_EVERY_S
    assert not status_due((REC, 1, T0), REC, 4, later - 0.1)
    assert status_due((REC, 1, T0), REC, 4, later)
    assert not status_due((REC, 4, T0), REC, 4, later + 1000)  # nothing new: never rewritten
