"""Stop signals as a flag: SIGINT, SIGTERM and SIGHUP end the agent's loop, never its cleanup."""

from __future__ import annotations

import signal
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)



class StopSignals:
    """Turns SIGINT/SIGTERM/SIGHUP into a flag the loop checks, so cleanup always runs."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: object) -> None:
        self.signum = self.signum or signum

    def install(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._old[sig] = signal.signal(sig, self._handler)
        return self

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    @property
    def name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name


