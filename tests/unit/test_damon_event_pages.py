"""Decoding trace_pipe_raw pages into damon_aggregated events, and assembling them.

The fixture holds the same seconds of this host's foreign paddr kdamond read twice at once,
as trace_pipe text and as per-CPU trace_pipe_raw pages, with the layout files the decoder
reads (tests/fixtures/capture_damon_raw.py): the pages must say what the text says. The
record kinds the kdamond did not produce there (time stamps, discarded events, long records,
missed events) are built from the recorded layouts by a small encoder below, after
include/linux/ring_buffer.h.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
import struct
from pathlib import Path

import pytest
from damon_hp.damon.assembler import SnapshotAssembler
from damon_hp.damon.event_lines import parse_event_line
from damon_hp.damon.event_pages import (
    AGGREGATED_FIELDS,
    EVENT_DTYPE,
    TUNE_FIELDS,
    decode_pages,
    page_layout,
    parse_fields,
    record_layout,
)
from damon_hp.numpy_lean import np

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/damon-raw-paddr-host-6.18.json.gz"
SAMPLE_US, AGGR_US = 500_000, 5_000_000


@pytest.fixture(scope="module")
def rec() -> dict:
    with gzip.open(FIXTURE, "rt") as f:
        return json.load(f)


def layouts(rec: dict):
    return (page_layout(rec["header_page"]), record_layout(rec["format"], AGGREGATED_FIELDS),
            record_layout(rec["tune_format"], TUNE_FIELDS))


def pages_by_cpu(rec: dict) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for cpu, page in rec["pages"]:
        out.setdefault(cpu, []).append(base64.b64decode(page))
    return out


def decoded_rows(rec: dict) -> list[tuple]:
    page, agg, tune = layouts(rec)
    arrays = [decode_pages(p, page, agg, tune).events for p in pages_by_cpu(rec).values()]
    merged = np.concatenate(arrays)
    return merged[np.argsort(merged["timestamp_s"], kind="stable")].tolist()


def test_the_recorded_pages_hold_exactly_the_events_the_text_shows(rec):
    text = [parse_event_line(line) for line in rec["text"]]
    assert text and all(e is not None for e in text)
    rows = decoded_rows(rec)
    assert len(rows) == len(text) > 2000
    for row, ev in zip(rows, text, strict=True):
        assert row[0] == ev.pid and row[2:] == tuple(ev)[2:]
        # Each instance stamps the event when it writes it into its own buffer, one after the
        # other (up to 63 us apart in the recording); trace_pipe prints microseconds.
        assert abs(row[1] - ev.timestamp_s) < 1e-4
    assert [r[1] for r in rows] == sorted(r[1] for r in rows)


def test_the_recorded_pages_assemble_into_the_snapshots_the_text_does(rec):
    text = [parse_event_line(line) for line in rec["text"]]
    a, b = (SnapshotAssembler(sample_us=SAMPLE_US, aggr_us=AGGR_US, clock=None)
            for _ in range(2))
    from_text = a.feed_many(text)
    page, agg, tune = layouts(rec)
    events = np.concatenate([decode_pages(p, page, agg, tune).events
                             for p in pages_by_cpu(rec).values()])
    from_pages = b.feed_array(events[np.argsort(events["timestamp_s"], kind="stable")])
    assert len(from_text) >= 1
    assert [s.regions for s in from_pages] == [s.regions for s in from_text]
    assert a.dropped_groups == b.dropped_groups


def test_the_layouts_come_from_the_format_files(rec):
    page, agg, tune = layouts(rec)
    assert (page.timestamp.offset, page.commit.offset, page.data_offset) == (0, 8, 16)
    assert agg.size == 48 and agg.dtype_words.itemsize == 48
    fields = parse_fields(rec["format"])
    assert fields["start"].offset == 24 and fields["age"].size == 4
    assert tune is not None and tune.size == 16
    # a format without one of the wanted fields is refused (the reader then reads text)
    assert record_layout(rec["format"].replace("field:unsigned int age;", ""),
                         AGGREGATED_FIELDS) is None
    assert record_layout(rec["format"].replace("ID: ", "Id: "), AGGREGATED_FIELDS) is None
    assert page_layout("field: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;") is None


# -- an encoder of ring-buffer pages, for what the kdamond did not produce ----------------

PAGE = 4096


class Page:
    def __init__(self, ts_ns: int) -> None:
        self.ts = ts_ns
        self.body = b""

    def event(self, data: bytes, delta: int, long: bool = False) -> Page:
        data += b"\0" * (-len(data) % 4)
        if long:  # type_len 0: the length, counting itself, then the data
            self.body += struct.pack("<II", delta << 5, len(data) + 4) + data
        else:
            self.body += struct.pack("<I", (delta << 5) | len(data) // 4) + data
        return self

    def extend(self, delta: int) -> Page:
        self.body += struct.pack("<II", ((delta & ((1 << 27) - 1)) << 5) | 30, delta >> 27)
        return self

    def stamp(self, ns: int) -> Page:
        low = ns & ((1 << 59) - 1)
        self.body += struct.pack("<II", ((low & ((1 << 27) - 1)) << 5) | 31, low >> 27)
        return self

    def discarded(self, nbytes: int, delta: int) -> Page:
        self.body += struct.pack("<II", (delta << 5) | 29, nbytes) + b"\xee" * (nbytes - 4)
        return self

    def bytes(self, missed: int | None = None, flags: int = 0) -> bytes:
        commit = len(self.body) | flags
        tail = b""
        if missed is not None:
            commit |= (1 << 31) | (1 << 30)
            tail = struct.pack("<Q", missed)
        raw = struct.pack("<QQ", self.ts, commit) + self.body + tail
        return raw + b"\0" * (PAGE - len(raw))


def agg_data(agg, *, pid=77, target=0, nr=3, start=0, end=4096, acc=1, age=2) -> bytes:
    rec = np.zeros(1, agg.dtype_words)
    for name, value in zip(AGGREGATED_FIELDS,
                           (agg.event_id, pid, target, nr, start, end, acc, age), strict=True):
        rec[name] = value
    return rec.tobytes()


def tune_data(tune, sample_us: int) -> bytes:
    rec = np.zeros(1, tune.dtype_words)
    rec["common_type"], rec["common_pid"], rec["sample_us"] = tune.event_id, 77, sample_us
    return rec.tobytes()


def test_time_extends_stamps_and_discarded_events_set_the_clock_as_the_kernels_reader(rec):
    page, agg, tune = layouts(rec)
    p = (Page(1_000_000_000)
         .event(agg_data(agg, start=0, end=1), delta=5)
         .extend(3 << 27)                                # a pause longer than 27 bits of ns
         .event(agg_data(agg, start=1, end=2), delta=7)
         .discarded(52, delta=11)                        # a filtered-out event left in place
         .event(agg_data(agg, start=2, end=3), delta=13, long=True)
         .stamp(5_000_000_123)                           # an absolute time
         .event(agg_data(agg, start=3, end=4), delta=0)
         .event(tune_data(tune, 250_000), delta=2))
    got = decode_pages([p.bytes()], page, agg, tune)
    ns = [round(t * 1e9) for t in got.events["timestamp_s"].tolist()]
    t1 = 1_000_000_005
    t2 = t1 + (3 << 27) + 7
    # a discarded event's delta is not added: the kernel's own reader skips it too
    # (rb_update_read_stamp() returns early for padding), so trace_pipe shows the same times
    assert ns == [t1, t2, t2 + 13, 5_000_000_123]
    assert got.events["start"].tolist() == [0, 1, 2, 3]
    assert got.tunes == [(5_000_000_125 / 1e9, 250_000)]
    assert not got.missed


def test_a_page_after_lost_events_says_so_and_how_many(rec):
    page, agg, _ = layouts(rec)
    lossy = Page(10).event(agg_data(agg), delta=1).bytes(missed=1234)
    got = decode_pages([lossy, Page(20).event(agg_data(agg), delta=1).bytes()], page, agg)
    assert got.missed and got.missed_count == 1234 and len(got.events) == 2
    unsaid = Page(10).event(agg_data(agg), delta=1).bytes(flags=1 << 31)
    got = decode_pages([unsaid], page, agg)
    assert got.missed and got.missed_count == 0 and len(got.events) == 1


def test_other_events_padding_and_torn_records_are_skipped(rec):
    page, agg, _ = layouts(rec)
    other = struct.pack("<HBBi", agg.event_id + 1, 0, 0, 77) + b"\1" * 40
    p = Page(0).event(other, delta=1).event(agg_data(agg, start=9, end=10), delta=1)
    raw = bytearray(p.bytes())
    got = decode_pages([bytes(raw)], page, agg)
    assert got.events["start"].tolist() == [9]
    # a commit word that cuts the last record short: that record is not whole, so not read
    struct.pack_into("<Q", raw, 8, len(p.body) - 8)
    assert len(decode_pages([bytes(raw)], page, agg).events) == 0
    # an empty page (commit 0) and a page of nothing but end padding hold nothing
    assert len(decode_pages([Page(0).bytes()], page, agg).events) == 0
    pad = Page(0)
    pad.body = struct.pack("<I", 29) + b"\0" * 60
    assert len(decode_pages([pad.bytes()], page, agg).events) == 0


# -- the strided numpy read against the walk ---------------------------------------------

def same_decoded(a, b) -> bool:
    return (a.events.tobytes() == b.events.tobytes() and a.tunes == b.tunes
            and (a.missed, a.missed_count) == (b.missed, b.missed_count))


def test_the_recorded_pages_decode_the_same_with_numpy_as_by_the_walk(rec, monkeypatch):
    from damon_hp.damon import event_pages

    page, agg, tune = layouts(rec)
    by_cpu = pages_by_cpu(rec)
    walked = {cpu: decode_pages(pages, page, agg, tune, vectorized=False)
              for cpu, pages in by_cpu.items()}
    spans: list[int] = []  # words of each stretch the walk took while reading with numpy
    walk = event_pages._Walk.records
    monkeypatch.setattr(event_pages._Walk, "records", lambda self, i, stop, ts: (
        spans.append(stop - i), walk(self, i, stop, ts))[1])
    for cpu, pages in by_cpu.items():
        assert same_decoded(decode_pages(pages, page, agg, tune), walked[cpu])
    # Only pages where a burst starts (its time extend) were walked whole; the others were read
    # with numpy, their tails (less than one record of 13 words) walked.
    n_pages = sum(len(p) for p in by_cpu.values())
    whole = [w for w in spans if w >= 13]
    assert len(whole) < n_pages // 4, (len(whole), n_pages)


def random_page(rng: random.Random, agg, tune) -> Page:
    p = Page(rng.randrange(1 << 40))
    for _ in range(rng.randint(0, 90)):
        r = rng.random()
        if r < 0.9:
            p.event(agg_data(agg, start=rng.randrange(1 << 30), acc=rng.randint(0, 20)),
                    delta=rng.randrange(1 << 27), long=rng.random() < 0.01)
        elif r < 0.93:
            p.extend(rng.randrange(1 << 40))
        elif r < 0.95:
            p.stamp(rng.randrange(1 << 59))
        elif r < 0.97:
            p.discarded(rng.choice((8, 52, 100)), delta=rng.randrange(1 << 20))
        elif r < 0.99:
            p.event(tune_data(tune, rng.randint(1, 10**6)), delta=rng.randrange(1 << 10))
        else:
            p.event(struct.pack("<HBBi", agg.event_id + 1, 0, 0, 7) + b"\1" * 40, delta=3)
        if len(p.body) > PAGE - 16 - 80:
            break
    return p


def test_reads_too_short_to_hold_a_page_header_decode_to_nothing(rec):
    page, agg, tune = layouts(rec)
    for pages in ([b""], [b"abc"], [b"\0" * 12], [b"\0" * PAGE]):
        for vectorized in (True, False):
            got = decode_pages(pages, page, agg, tune, vectorized=vectorized)
            assert len(got.events) == 0 and not got.tunes and not got.missed


@pytest.mark.parametrize("seed", range(60))
def test_random_pages_decode_the_same_with_numpy_as_by_the_walk(rec, seed):
    """Pages of every record kind, some cut short by their commit word, some empty, some
    after lost events: the strided read must find exactly what the walk finds."""
    page, agg, tune = layouts(rec)
    rng = random.Random(seed)
    pages = []
    for _ in range(rng.randint(1, 12)):
        p = random_page(rng, agg, tune)
        raw = bytearray(p.bytes(missed=rng.randrange(99)) if rng.random() < 0.1 else p.bytes())
        if rng.random() < 0.2 and p.body:  # a commit word that cuts the data short
            struct.pack_into("<Q", raw, 8, rng.randrange(len(p.body)))
        pages.append(bytes(raw))
    assert same_decoded(decode_pages(pages, page, agg, tune),
                        decode_pages(pages, page, agg, tune, vectorized=False))


# -- feed_array against feed_many -------------------------------------------------------

def random_events(rng: random.Random, n_bursts: int) -> list[tuple]:
    """Bursts of a paddr kdamond with the faults the assembler must catch: a burst joined
    midway, one missing its tail, a region count that changes, a pause inside a burst."""
    rows, t = [], 100.0
    for _ in range(n_bursts):
        nr = rng.randint(1, 12)
        starts = sorted(rng.sample(range(0, 10_000), nr))
        burst = [(77, t + i * 1e-5, 0, nr, s * 4096, s * 4096 + 4096, rng.randint(0, 10),
                  rng.randint(0, 50)) for i, s in enumerate(starts)]
        fault = rng.random()
        if fault < 0.15:
            burst = burst[rng.randint(1, nr):]          # joined midway / lost its head
        elif fault < 0.3:
            burst = burst[:rng.randint(0, nr - 1)]      # lost its tail
        elif fault < 0.4 and nr > 2:
            k = rng.randint(1, nr - 1)                  # a region count that changes
            burst = burst[:k] + [r[:3] + (nr + 1,) + r[4:] for r in burst[k:]]
        elif fault < 0.5 and nr > 2:
            k = rng.randint(1, nr - 1)                  # a pause of more than half an aggr
            burst = burst[:k] + [r[:1] + (r[1] + 3.0,) + r[2:] for r in burst[k:]]
        rows += burst
        t += 5.0
    return rows


@pytest.mark.parametrize("seed", range(40))
def test_feed_array_makes_the_snapshots_and_drops_feed_many_makes(seed):
    rng = random.Random(seed)
    rows = random_events(rng, 30)
    a, b = (SnapshotAssembler(sample_us=SAMPLE_US, aggr_us=AGGR_US, clock=None)
            for _ in range(2))
    want = a.feed_many(rows)
    got, at = [], 0
    while at < len(rows):  # in reads of any size, as the pages come
        step = rng.randint(1, 25)
        got += b.feed_array(np.array(rows[at:at + step], dtype=EVENT_DTYPE))
        at += step
    assert [(s.taken_at_s, s.regions) for s in got] == [(s.taken_at_s, s.regions)
                                                        for s in want]
    assert b.dropped_groups == a.dropped_groups
    assert {k: v.regions for k, v in b._groups.items()} == \
        {k: v.regions for k, v in a._groups.items()}


def test_feed_array_of_several_targets_goes_row_by_row():
    rows = [(9, 1.0, 0, 2, 0, 4096, 1, 1), (9, 1.0, 1, 1, 0, 8192, 2, 2),
            (9, 1.0, 0, 2, 4096, 8192, 3, 3)]
    a = SnapshotAssembler(sample_us=SAMPLE_US, aggr_us=AGGR_US, clock=None,
                          target_pids={0: 100, 1: 101})
    snaps = a.feed_array(np.array(rows, dtype=EVENT_DTYPE))
    assert [(s.pid, len(s.regions)) for s in snaps] == [(101, 1), (100, 2)]
