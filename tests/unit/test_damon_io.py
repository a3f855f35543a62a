"""damon/io.py's EBUSY back-off: transient busy spells are waited out, long ones end in a
DamonBusy that says why, and any other error is raised at once. The real kernel lock is
exercised in tests/vm/test_faults.py; here only the timing rule, on a shrunk bound."""

from __future__ import annotations

import errno
import time

import pytest
from damon_hp.damon import io
from damon_hp.lifecycle import busy_note


def busy_for(seconds: float):
    """An operation that answers EBUSY until `seconds` have passed, then "ok"."""
    until = time.monotonic() + seconds
    calls = []

    def op() -> str:
        calls.append(time.monotonic())
        if time.monotonic() < until:
            raise OSError(errno.EBUSY, "Device or resource busy")
        return "ok"

    return op, calls


@pytest.fixture(autouse=True)
def short_bound(monkeypatch) -> None:
    monkeypatch.setattr(io, "EBUSY_RETRY_S", 0.5)
    monkeypatch.setattr(io, "busy_waits", [])
    monkeypatch.setattr(io, "BUSY_NOTABLE_S", 0.1)


def test_a_busy_spell_shorter_than_the_bound_is_waited_out_and_recorded() -> None:
    op, calls = busy_for(0.2)
    assert io.retry_ebusy(op, "reading x") == "ok"
    assert len(io.busy_waits) == 1 and io.busy_waits[0] >= 0.2
    # Exponential back-off: far fewer tries than a 5 ms poll would make.
    assert len(calls) < 0.2 / io.EBUSY_FIRST_DELAY_S


def test_a_busy_spell_past_the_bound_raises_damon_busy_naming_the_cause() -> None:
    op, _ = busy_for(60)
    t0 = time.monotonic()
    with pytest.raises(io.DamonBusy) as e:
        io.retry_ebusy(op, "writing '1' to nr_contexts")
    took = time.monotonic() - t0
    assert 0.5 <= took < 0.5 + 2 * io.EBUSY_MAX_DELAY_S + 1.0  # the bound, not forever
    assert "stayed busy (EBUSY) for 0.5 s writing '1' to nr_contexts" in str(e.value)
    assert "another program holds DAMON's sysfs lock" in str(e.value)
    assert io.busy_waits == []


def test_other_errors_are_raised_at_once() -> None:
    def op() -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    t0 = time.monotonic()
    with pytest.raises(OSError) as e:
        io.retry_ebusy(op, "writing x")
    assert e.value.errno == errno.EINVAL and time.monotonic() - t0 < 0.1


def test_write_past_the_bound_is_damon_busy_not_an_os_error(tmp_path, monkeypatch) -> None:
    def always_busy(*_a, **_k):
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(io, "open", always_busy, raising=False)  # shadows the builtin in io
    with pytest.raises(io.DamonBusy):
        io.write(tmp_path / "state", "on")


def test_routine_waits_are_not_kept_and_notable_ones_make_a_note() -> None:
    op, _ = busy_for(0.01)
    io.retry_ebusy(op, "reading x")
    assert io.busy_waits == []
    assert busy_note(io.busy_waits) is None
    note = busy_note([3.6, 1.2])
    assert note is not None and "2 operation(s) waited, the longest 3.6 s" in note


def test_doctor_names_a_busy_damon_instead_of_a_traceback(monkeypatch) -> None:
    from damon_hp import damon, doctor

    def busy_probe(*_a, **_k):
        raise io.DamonBusy("damon-hp: DAMON sysfs stayed busy (EBUSY) for 10 s reading x/state")

    monkeypatch.setattr(damon, "probe", busy_probe)
    facts = doctor.gather([])
    damon_check = next(c for c in doctor.evaluate(facts, []) if c.name == "damon sysfs")
    assert "stayed busy (EBUSY)" in damon_check.detail
    assert "other DAMON user is done" in damon_check.fix
