"""deferred_interrupts: a stop signal inside the block is held until the block ends."""

from __future__ import annotations

import os
import signal

import pytest
from damon_hp.experiment.interrupts import deferred_interrupts


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_inside_the_block_is_raised_after_it_and_handlers_come_back(sig) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    reached_end = False
    with pytest.raises(KeyboardInterrupt, match=f"signal {int(sig)}"):
        with deferred_interrupts():
            os.kill(os.getpid(), sig)
            reached_end = True  # the handler ran, and raised nothing here
    assert reached_end
    assert {s: signal.getsignal(s) for s in before} == before


def test_without_a_signal_the_block_raises_nothing() -> None:
    with deferred_interrupts():
        pass
