"""Ring-buffer pages of `trace_pipe_raw` -> `damon_aggregated` event rows, pure.

The binary twin of event_lines.py: a read of `per_cpu/cpuN/trace_pipe_raw` returns one
sub-buffer ("page") of that CPU's ring buffer, copied out by ring_buffer_read_page(). Reading
the records it holds skips what trace_pipe costs: the kernel printing every event as text and
Python parsing it back (~2.2 us per event here, ~3,000 events per 5 s from the host's kdamond).

The layouts are read from tracefs, never assumed: `events/header_page` gives the page header
(a u64 timestamp, the `commit` word holding the data length, then the data), and an event's
`format` file gives its id and its fields' offsets and sizes. Each record starts with a
32-bit header (include/linux/ring_buffer.h, struct ring_buffer_event): `type_len` in its low 5
bits, `time_delta` (ns since the previous record) in the other 27, then
  - type_len 1..28: the event's data, type_len * 4 bytes;
  - type_len 0: a 32-bit length (itself included), then the data;
  - 29 padding: with time_delta 0 the rest of the page is empty; else a discarded event of
    array[0] bytes after its header, whose delta the kernel's reader does not add
    (rb_update_read_stamp());
  - 30 time extend: array[0] holds bits 27 and up of the delta;
  - 31 absolute time stamp: array[0] << 27 | time_delta, the low 59 bits of the time (the
    upper ones are the page's: rb_fix_abs_ts()).
The copied page's `commit` word carries RB_MISSED_EVENTS (bit 31) when the writer overwrote
events the reader had not read, and RB_MISSED_STORED (bit 30) when their count follows the
data as an unsigned long.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from damon_hp.numpy_lean import np

_MAX_DATA_TYPE_LEN, _TYPE_PADDING, _TYPE_TIME_EXTEND, _TYPE_TIME_STAMP = 28, 29, 30, 31
_MISSED_EVENTS, _MISSED_STORED = 1 << 31, 1 << 30
_ABS_TS_BITS = 59

# The fields a damon_aggregated record must have (the event's TP_STRUCT, 5.15 to 7.3).
AGGREGATED_FIELDS = ("common_type", "common_pid", "target_id", "nr_regions", "start", "end",
                     "nr_accesses", "age")
TUNE_FIELDS = ("common_type", "common_pid", "sample_us")

_FIELD = re.compile(r"field:(?P<decl>[^;]*?)\s*(?P<name>\w+)(?:\[\d*\])?;\s*offset:(?P<off>\d+);"
                    r"\s*size:(?P<size>\d+);(?:\s*signed:(?P<signed>\d+);)?")
_INTS = {(1, False): "<u1", (1, True): "<i1", (2, False): "<u2", (2, True): "<i2",
         (4, False): "<u4", (4, True): "<i4", (8, False): "<u8", (8, True): "<i8"}


@dataclass(frozen=True)
class Field:
    offset: int
    size: int
    signed: bool


def parse_fields(text: str) -> dict[str, Field]:
    """The fields of a tracefs `format` (or `header_page`) file, by name."""
    return {m["name"]: Field(int(m["off"]), int(m["size"]), m["signed"] == "1")
            for m in _FIELD.finditer(text)}


def event_id(format_text: str) -> int | None:
    m = re.search(r"^ID:\s*(\d+)\s*$", format_text, re.MULTILINE)
    return int(m[1]) if m else None


@dataclass(frozen=True)
class RecordLayout:
    """One event's data: its id, and the wanted fields as a numpy dtype at their offsets."""

    event_id: int
    size: int  # bytes of data up to the end of the last wanted field
    dtype_words: np.dtype  # the fields at their offsets, in whole 32-bit words


def record_layout(format_text: str, wanted: tuple[str, ...]) -> RecordLayout | None:
    """The layout of an event from its `format` file, or None if it lacks a wanted field or
    holds one that is not a plain integer (then the caller reads trace_pipe text)."""
    ident = event_id(format_text)
    fields = parse_fields(format_text)
    if ident is None or any(name not in fields for name in wanted):
        return None
    chosen = [fields[name] for name in wanted]
    if any((f.size, f.signed) not in _INTS for f in chosen):
        return None
    size = max(f.offset + f.size for f in chosen)
    dtype = np.dtype({"names": list(wanted),
                      "formats": [_INTS[(f.size, f.signed)] for f in chosen],
                      "offsets": [f.offset for f in chosen], "itemsize": -(-size // 4) * 4})
    return RecordLayout(ident, size, dtype)


@dataclass(frozen=True)
class PageLayout:
    """The page header, from `events/header_page`."""

    timestamp: Field
    commit: Field
    data_offset: int


def page_layout(header_page_text: str) -> PageLayout | None:
    fields = parse_fields(header_page_text)
    try:
        ts, commit, data = fields["timestamp"], fields["commit"], fields["data"]
    except KeyError:
        return None
    if ts.size != 8 or commit.size not in (4, 8):
        return None
    return PageLayout(ts, commit, data.offset)


# One decoded damon_aggregated event; `.tolist()` of an array of these gives EventFields rows.
EVENT_DTYPE = np.dtype([("pid", "<i8"), ("timestamp_s", "<f8"), ("target_id", "<u8"),
                        ("nr_regions", "<u8"), ("start", "<u8"), ("end", "<u8"),
                        ("nr_accesses", "<u8"), ("age", "<u8")])
# EVENT_DTYPE's columns but the time, and the format's field each one comes from
_COLUMNS = {"pid": "common_pid", "target_id": "target_id", "nr_regions": "nr_regions",
            "start": "start", "end": "end", "nr_accesses": "nr_accesses", "age": "age"}


@dataclass
class Decoded:
    """What a read of pages held: the aggregated events (EVENT_DTYPE, in page order,
    timestamps in seconds of the instance's trace clock), the tune events as (time,
    sample_us), and whether the kernel dropped events before any of the pages (`missed`;
    `missed_count` is what it said it dropped, when it said)."""

    events: np.ndarray
    tunes: list[tuple[float, int]]
    missed: bool
    missed_count: int


def decode_pages(pages: list[bytes], layout: PageLayout, aggregated: RecordLayout,
                 tune: RecordLayout | None = None, *, vectorized: bool = True) -> Decoded:
    """The records of `trace_pipe_raw` pages of one CPU, in order (see the module's
    docstring).

    A page holding nothing but `damon_aggregated` records of one size, back to back (all but
    the one or two pages where a burst starts after the kdamond's pause, with its time
    extend), is read with numpy for every such page of the read at once: its headers sit at
    one stride, which a few array operations check. Python walks the record headers of the
    other pages and of what follows the last whole record of a checked one (~0.45 us a
    record, ~1,300 records per 5 s from the host's kdamond, which may hold up to 8,192
    regions; on the recorded pages the decoding fell from 0.9-1.2 to 0.5-0.65 ms per
    aggregation, docs/cost.md).
    `vectorized=False` walks every page: the reference the checked pages must agree with."""
    blob = b"".join(page[:len(page) // 4 * 4] for page in pages)
    words = memoryview(blob).cast("I")
    walk = _Walk(words, aggregated, tune)
    heads: list[tuple[int, int, int]] = []  # per page: first data word, stop word, its time
    missed, missed_count, page_at = False, 0, 0
    for page in pages:
        page_words = len(page) // 4
        ts = int.from_bytes(page[layout.timestamp.offset:layout.timestamp.offset + 8], "little")
        c = layout.commit
        commit = int.from_bytes(page[c.offset:c.offset + c.size], "little")
        # The flags sit in bits 31 and 30 of the commit word, whatever its size (local_t).
        size = commit & (_MISSED_STORED - 1)
        stop = page_at + min(layout.data_offset + size, page_words * 4) // 4
        if commit & _MISSED_EVENTS:
            missed = True
            if commit & _MISSED_STORED and (stop - page_at) * 4 + 8 <= len(page):
                missed_count += int.from_bytes(blob[stop * 4:stop * 4 + 8], "little")
        heads.append((page_at + layout.data_offset // 4, stop, ts))
        page_at += page_words
    if vectorized and blob:
        at, ns = _decode_strided(blob, heads, aggregated, walk)
        # The walked records (other pages, tails) put back in the read's order: by where
        # their data starts.
        at = np.concatenate((at, np.asarray(walk.agg_at, dtype=np.int64)))
        ns = np.concatenate((ns, np.asarray(walk.agg_ns, dtype=np.int64)))
        order = np.argsort(at, kind="stable")
        at, ns = at[order], ns[order]
    else:
        for i, stop, ts in heads:
            walk.records(i, stop, ts)
        at, ns = walk.agg_at, walk.agg_ns
    events = _gather(blob, at, ns, aggregated)
    tunes: list[tuple[float, int]] = []
    if tune is not None and walk.tunes_at:
        values = _records(blob, walk.tunes_at, tune)["sample_us"]
        tunes = [(t / 1e9, int(v)) for t, v in zip(walk.tunes_ns, values.tolist(), strict=True)]
    return Decoded(events, tunes, missed, missed_count)


class _Walk:
    """The Python walk over record headers, gathering where aggregated and tune events' data
    start (word indexes into the read) and their times in ns."""

    def __init__(self, words: memoryview, aggregated: RecordLayout,
                 tune: RecordLayout | None) -> None:
        self.words = words
        self.agg_id, self.agg_size = aggregated.event_id, aggregated.size
        self.tune_id = tune.event_id if tune is not None else -1
        self.tune_size = tune.size if tune is not None else 0
        self.agg_at: list[int] = []
        self.agg_ns: list[int] = []
        self.tunes_at: list[int] = []
        self.tunes_ns: list[int] = []

    def records(self, i: int, stop: int, ts: int) -> None:
        """Walk the records from word `i` to `stop`, the clock at `ts` ns before the first."""
        words, agg_at, agg_ns = self.words, self.agg_at, self.agg_ns
        agg_id, agg_size, tune_id, tune_size = (self.agg_id, self.agg_size, self.tune_id,
                                                self.tune_size)
        while i < stop:
            header = words[i]
            type_len = header & 31
            if type_len <= _MAX_DATA_TYPE_LEN:
                if type_len:
                    data, nwords = i + 1, type_len
                elif i + 1 < stop:  # a length word (counting itself), then the data
                    data, nwords = i + 2, max(words[i + 1], 4) // 4 - 1
                else:
                    break
                if data + nwords > stop:
                    break  # a record the page's data does not hold whole
                ts += header >> 5
                # common_type: the first u16 of every event (struct trace_entry)
                kind = words[data] & 0xFFFF if nwords else -2
                if kind == agg_id and nwords * 4 >= agg_size:
                    agg_at.append(data)
                    agg_ns.append(ts)
                elif kind == tune_id and nwords * 4 >= tune_size:
                    self.tunes_at.append(data)
                    self.tunes_ns.append(ts)
                i = data + nwords
                continue
            if i + 1 >= stop:
                break
            array0 = words[i + 1]
            if type_len == _TYPE_PADDING:
                if header >> 5 == 0:
                    break  # the rest of the page is empty
                i += 1 + array0 // 4
            elif type_len == _TYPE_TIME_EXTEND:
                ts += (array0 << 27) | (header >> 5)
                i += 2
            else:  # _TYPE_TIME_STAMP
                ts = ((array0 << 27) | (header >> 5)) | (ts & ~((1 << _ABS_TS_BITS) - 1))
                i += 2


def _decode_strided(blob: bytes, heads: list[tuple[int, int, int]], aggregated: RecordLayout,
                    walk: _Walk) -> tuple[np.ndarray, np.ndarray]:
    """Read with numpy every page whose data starts with back-to-back aggregated records of
    one inline size (type_len 1..28), as many as fit, then walk the rest of such a page;
    walk the other pages whole. Returns where the records read with numpy start, and their
    times. The walk would find exactly these records: each header it reads is at the
    stride, of that type_len and that event, and the clock only adds their deltas."""
    words = np.frombuffer(blob, dtype="<u4")  # not empty: the caller walks an empty read
    first, stop, ts = (np.array(col, dtype=np.int64) for col in zip(*heads, strict=True))
    room = stop - first
    last_word = len(words) - 1
    type_len = words[np.minimum(first, last_word)].astype(np.int64) & 31
    kind = words[np.minimum(first + 1, last_word)] & 0xFFFF
    stride = type_len + 1
    ok = ((room >= 2) & (type_len >= 1) & (type_len <= _MAX_DATA_TYPE_LEN)
          & (type_len * 4 >= aggregated.size) & (kind == aggregated.event_id))
    n = np.where(ok, room // stride, 0)
    ok &= n > 0
    page_of = np.repeat(np.arange(len(heads)), n)
    starts = np.cumsum(n) - n
    pos = first[page_of] + (np.arange(len(page_of)) - starts[page_of]) * stride[page_of]
    hdr = words[pos].astype(np.int64)
    good = ((hdr & 31) == type_len[page_of]) & ((words[pos + 1] & 0xFFFF) == aggregated.event_id)
    ok[page_of[~good]] = False
    clock = np.concatenate(([0], np.cumsum(hdr >> 5)))  # deltas up to each record, from 0
    before = clock[starts]  # the deltas of earlier pages' records
    ns = clock[1:] - before[page_of] + ts[page_of]
    mine = ok[page_of]
    after = np.where(ok, ts + clock[starts + n] - before, ts)  # the time after a page's last
    for i, end, t in zip(np.where(ok, first + n * stride, first).tolist(), stop.tolist(),
                         after.tolist(), strict=True):
        if i < end:
            walk.records(i, end, t)
    return pos[mine] + 1, ns[mine]


def _records(blob: bytes, at: np.ndarray | list[int], layout: RecordLayout) -> np.ndarray:
    """The records whose data start at the word indexes `at`, as `layout.dtype_words`."""
    nwords = -(-layout.size // 4)
    words = np.frombuffer(blob, dtype="<u4")
    picked = words[np.asarray(at, dtype=np.int64)[:, None] + np.arange(nwords)]
    return picked.view(layout.dtype_words).reshape(-1)


def _gather(blob: bytes, at: np.ndarray | list[int], ns: np.ndarray | list[int],
            layout: RecordLayout) -> np.ndarray:
    if not len(at):
        return np.empty(0, EVENT_DTYPE)
    records = _records(blob, at, layout)
    out = np.empty(len(records), EVENT_DTYPE)
    out["timestamp_s"] = np.asarray(ns, dtype=np.int64) / 1e9
    for column, name in _COLUMNS.items():
        out[column] = records[name]
    return out
