"""The `trace_pipe` file of our tracefs instance: text lines in, snapshots out.

The stream's fallback reader (events.py chooses): used where the lines themselves are wanted
(`on_line`, to record fixtures) or where tracefs describes a page or event layout that
event_pages.py does not know. raw_reader.py is the usual one; both fill the assembler the
same way and answer `read` alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .assembler import SnapshotAssembler
from .event_lines import lost_events, parse_event_line, parse_event_rows, parse_tune_line
from .model import Snapshot

_READ_BYTES = 1 << 16


class TextPipe:
    """The open trace_pipe of one instance. `read(assembler)`: the snapshots that what the
    pipe holds now completes, and the events the kernel said it lost ("[LOST n EVENTS]"); None
    if the pipe held nothing. OSError passes up (the instance is gone)."""

    files = "trace_pipe"

    def __init__(self, instance_fd: int, *, follow_tuning: bool,
                 on_line: Callable[[str], None] | None = None) -> None:
        self.fds = [os.open("trace_pipe", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC,
                            dir_fd=instance_fd)]
        self.feed = TextFeed(follow_tuning=follow_tuning, on_line=on_line)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def read(self, assembler: SnapshotAssembler) -> tuple[list[Snapshot], int] | None:
        got, snaps, lost = False, [], 0
        while True:
            try:
                chunk = os.read(self.fds[0], _READ_BYTES)
            except BlockingIOError:
                break
            if not chunk:
                break
            got = True
            more, n = self.feed.feed_bytes(chunk, assembler)
            snaps += more
            lost += n
        return (snaps, lost) if got else None


class TextFeed:
    """trace_pipe's bytes, in reads of any size, into the assembler (pure)."""

    def __init__(self, *, follow_tuning: bool,
                 on_line: Callable[[str], None] | None = None) -> None:
        self._follow_tuning = follow_tuning
        self._on_line = on_line
        self._pending = b""

    def feed_bytes(self, chunk: bytes, assembler: SnapshotAssembler
                   ) -> tuple[list[Snapshot], int]:
        """Feed one read's bytes (lines may be cut anywhere: the tail waits for the next)."""
        data = self._pending + chunk
        cut = data.rfind(b"\n") + 1
        self._pending = data[cut:]
        text = data[:cut].decode(errors="replace")
        if self._on_line is None and (rows := parse_event_rows(text)) is not None:
            return assembler.feed_many(rows), 0
        snaps, lost = [], 0
        for line in text.splitlines():
            if self._on_line is not None:
                self._on_line(line)
            event = parse_event_line(line)
            if event is not None:
                snap = assembler.feed(event)
                if snap is not None:
                    snaps.append(snap)
            elif self._follow_tuning and (sample_us := parse_tune_line(line)) is not None:
                assembler.retune(sample_us)
            elif (n := lost_events(line)) > 0:
                lost += n
                assembler.reset()
        return snaps, lost
