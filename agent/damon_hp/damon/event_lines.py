"""One line of trace_pipe text -> one `damon:damon_aggregated` event, pure.

The lowest of the event stream's three layers (events.py holds the tracefs instance that
produces the lines, assembler.py groups the events into snapshots). Pure string work, so the
recorded fixtures in tests/fixtures replay through it unchanged.

Cost: `parse_event_line` ~1.7 us per line on a quiet development host (3.5 us beside a test
suite). `parse_event_block` takes a whole read of lines with one regular expression and
builds the events in one comprehension: 1.9 us per line where the line by line path took 3.5
(2026-11-27, the recorded fixture, same load), and it spares the reader's loop over lines;
`parse_event_rows`, the same as plain tuples for SnapshotAssembler.feed_many, took parsing and
assembling from 2.7 to 2.2 us per line. They answer only for blocks of nothing but plain event
lines; anything else (a LOST marker, a tune event, another layout) goes line by line.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class AggregatedEvent(NamedTuple):
    """One `damon:damon_aggregated` event: one region of one target at one aggregation.

    A NamedTuple, not a frozen dataclass: thousands are made per aggregation, and a frozen
    dataclass's constructor cost as much as parsing the line.

    For paddr kdamonds `start`/`end` are physical addresses (in DAMON's `addr_unit`, 1 unless
    set); for vaddr, virtual addresses of target `target_id` (its index in the context).
    """

    pid: int  # common_pid: the kdamond thread
    timestamp_s: float  # the instance's trace clock
    target_id: int
    nr_regions: int  # regions of this target in this aggregation
    start: int
    end: int
    nr_accesses: int
    age: int


# AggregatedEvent's fields as a plain tuple, in its order (parse_event_rows)
EventFields = tuple[int, float, int, int, int, int, int, int]

# The part after "damon_aggregated: " is the event's print fmt,
#   "target_id=%lu nr_regions=%u %lu-%lu: %u %u"  (target_id nr_regions start-end: nr_accesses age)
# The part before it follows trace_pipe's default layout,
#   "       kdamond.0-77      [001] .....   294.105550"
# but the "(tgid)" column of the record-tgid option and a missing irq-info flags column are
# accepted too. A comm may contain '-' and spaces: the pid is the last "-digits" before the CPU
# column. Splitting first and matching two anchored patterns costs half of one regex over the
# whole line (~1.7 us per line here).
_MARK = ": damon_aggregated: "
_HEAD = re.compile(r"-(\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[\d+\]\s+(?:\S+\s+)?(\d+(?:\.\d+)?)$")
_PAYLOAD = re.compile(r"target_id=(\d+) nr_regions=(\d+) (\d+)-(\d+): (\d+) (\d+)\s*$")
_LOST = re.compile(r"\[LOST (\d+) EVENTS\]")
# What str.splitlines splits at besides "\n": looking for each (a fast substring search) is
# cheaper than splitting the block.
_OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# One plain line: "comm-pid [cpu] flags seconds.micros: damon_aggregated: <payload>". Narrower
# than what parse_event_line takes (no tgid column, flags present, a fractional timestamp, the
# payload single-spaced to the line's end), never wider: a block it cannot read whole goes line
# by line.
_PLAIN_LINE = re.compile(r"^ *\S.*?-(\d+) +\[\d+\] \S+ +(\d+\.\d+): damon_aggregated: "
                         r"target_id=(\d+) nr_regions=(\d+) (\d+)-(\d+): (\d+) (\d+)$",
                         re.MULTILINE)


def parse_event_line(line: str) -> AggregatedEvent | None:
    """The event on one trace_pipe line, or None for any other line (other events, LOST)."""
    head, mark, payload = line.partition(_MARK)
    if not mark:
        return None
    return _parse_plain(head, payload) or _parse_any(head, payload)


def parse_event_block(text: str) -> list[AggregatedEvent] | None:
    """The events of `text`, whole lines each ending in a newline, if every line is a plain
    event line; else None (read it line by line: `parse_event_line` and the others)."""
    rows = parse_event_rows(text)
    return None if rows is None else list(map(AggregatedEvent._make, rows))


def parse_event_rows(text: str) -> list[EventFields] | None:
    """`parse_event_block` as plain tuples of AggregatedEvent's fields (its order), for
    SnapshotAssembler.feed_many: making the NamedTuple cost ~0.25 us of the ~2.7 per line."""
    found = _PLAIN_LINE.findall(text)
    # splitlines also splits at \r, \f and other separators that `.` crosses: a block holding
    # any is left to the line by line path, which sees the lines splitlines makes
    if (len(found) != text.count("\n") or not text.endswith("\n")
            or any(c in text for c in _OTHER_BREAKS)):
        return None
    return [(int(pid), float(ts), int(target), int(nr), int(start), int(end), int(acc),
             int(age))
            for pid, ts, target, nr, start, end, acc, age in found]


def _parse_plain(head: str, payload: str) -> AggregatedEvent | None:
    """The usual line (comm-pid, [cpu], flags, time; single-spaced payload) by splitting, at
    a third of the regular expressions' cost; None for anything else, which `_parse_any`
    then judges. Accepts only what `_parse_any` accepts, with the same fields: every token is
    checked as its pattern would (isdecimal is what \\d matches)."""
    tokens = head.split()
    fields = payload.rstrip().split(" ")
    if len(tokens) < 4 or len(fields) != 5 or head[-1:].isspace():
        return None
    _, dash, pid = tokens[-4].rpartition("-")
    cpu, stamp = tokens[-3], tokens[-1]
    whole, dot, frac = stamp.partition(".")
    target, nr, span, acc, age = fields
    start, minus, end = span[:-1].partition("-")
    if not (dash and pid.isdecimal() and cpu[:1] == "[" and cpu[-1:] == "]"
            and cpu[1:-1].isdecimal() and whole.isdecimal() and (not dot or frac.isdecimal())
            and target[:10] == "target_id=" and target[10:].isdecimal()
            and nr[:11] == "nr_regions=" and nr[11:].isdecimal() and span[-1:] == ":"
            and minus and start.isdecimal() and end.isdecimal() and acc.isdecimal()
            and age.isdecimal()):
        return None
    return AggregatedEvent(pid=int(pid), timestamp_s=float(stamp), target_id=int(target[10:]),
                           nr_regions=int(nr[11:]), start=int(start), end=int(end),
                           nr_accesses=int(acc), age=int(age))


def _parse_any(head: str, payload: str) -> AggregatedEvent | None:
    h = _HEAD.search(head)
    m = _PAYLOAD.match(payload)
    if h is None or m is None:
        return None
    return AggregatedEvent(
        pid=int(h[1]),
        timestamp_s=float(h[2]),
        target_id=int(m[1]),
        nr_regions=int(m[2]),
        start=int(m[3]),
        end=int(m[4]),
        nr_accesses=int(m[5]),
        age=int(m[6]),
    )


_TUNE_MARK = ": damon_monitor_intervals_tune: sample_us="


def parse_tune_line(line: str) -> int | None:
    """The new sampling interval (us) on a `damon_monitor_intervals_tune` line, else None."""
    _, mark, value = line.partition(_TUNE_MARK)
    value = value.strip()
    return int(value) if mark and value.isdecimal() and int(value) > 0 else None


def lost_events(line: str) -> int:
    """Events the kernel dropped, from a trace_pipe "CPU:N [LOST M EVENTS]" line (else 0)."""
    m = _LOST.search(line)
    return int(m[1]) if m else 0
