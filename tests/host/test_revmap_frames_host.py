"""FrameReader: pagemap entries re-read only where frames may have moved, and never stale.

A quiet child (memchild.py: a populated buffer, then idle) is read snapshot after snapshot; each
FrameReader result must equal a fresh read_page_frames of the same moment, while the child's
memory stays put (then the reader skips even the page-table scan), after it collapses a 2 MiB
range (new frames, PMD-mapped) and after it drops pages (MADV_DONTNEED: fewer present, no
fault, no counter but the process's resident pages).

A lazy reader (a source that cannot demote) keeps windows whose frames may have moved: the
pipeline's observation reads such a window again whenever it reads hot, so its map equals one
made from a fresh read, while a window that reads idle may stay stale until the next full read.
A PMD-mapped window is never noted: nothing is done with a huge range by such a source.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from damon_hp.damon.model import PHYSICAL, Region, Snapshot
from damon_hp.damon.revmap import reverse_map
from damon_hp.frame_reader import FrameReader
from damon_hp.frames import PM_PFN_MASK, PM_PRESENT, read_page_frames
from damon_hp.pipeline import Observer
from damon_hp.procfs import ProcessFiles
from damon_hp.ranges import AddrRange, merge_adjacent

HERE = Path(__file__).resolve().parent
HUGE = 2 << 20
MADV_DONTNEED = 4
MADV_NOHUGEPAGE = 15
MADV_COLLAPSE = 25


def start_child(*args: str):
    proc = subprocess.Popen([sys.executable, str(HERE / "memchild.py"), "32", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        layout = json.loads(proc.stdout.readline())
        blocked(proc.pid)
        yield proc, layout
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.fixture
def child():
    yield from start_child()


@pytest.fixture
def spare_child():
    yield from start_child("spare")


def blocked(pid: int) -> None:
    """Wait until the child sleeps (in its read of stdin): after printing an answer it still
    runs its loop back to that read, and the first time it faults in heap pages for its stdin
    buffer. A read of all its ranges racing that saw one page more or less (1 failure in 15)."""
    for _ in range(5000):
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"S":
                return
        time.sleep(0.001)
    raise AssertionError(f"the child {pid} never went back to waiting for a command")


def command(proc, line: str) -> str:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    answer = proc.stdout.readline().strip()
    blocked(proc.pid)
    return answer


def madvise(proc, start: int, length: int, advice: int) -> str:
    return command(proc, f"madvise {start} {length} {advice}")


def pfns(frames) -> dict[int, int]:
    return {run.start + i * 4096: e & PM_PFN_MASK for run in frames.runs
            for i, e in enumerate(run.entries) if e & PM_PRESENT}


def ranges_of(pid: int) -> list[tuple[int, int]]:
    from damon_hp.procfs import read_maps

    return [(m.start, m.end) for m in read_maps(pid) if m.anonymous_private]


def physical(*frames, base_accesses: int = 0, scale: int = 1) -> Snapshot:
    """Made-up physical regions over the frames seen, 64 KiB each, of varied access counts
    (base_accesses + 0..6, times `scale`)."""
    top = max(max(pfns(f).values()) for f in frames) + 1
    step = max(16, top // 20_000)
    return Snapshot(taken_at_s=0.0, pid=0, sample_us=5_000, aggr_us=100_000, regions=tuple(
        Region(p * 4096, min(p + step, top) * 4096, scale * (base_accesses + (p // step) % 7),
               (p // step) % 5)
        for p in range(0, top, step)), space=PHYSICAL)


def check_read(reader: FrameReader, pid: int):
    ranges = ranges_of(pid)
    got = reader.read(ranges)
    fresh = read_page_frames(pid, ranges)
    assert pfns(got) == pfns(fresh)
    assert got.resident_pages == fresh.resident_pages
    phys = physical(fresh)
    assert reverse_map(phys, got) == reverse_map(phys, fresh)
    # What it says is PMD-mapped is what a PAGEMAP_SCAN for PAGE_IS_HUGE finds now; it
    # answers only for the ranges it read.
    wanted = [AddrRange(lo, hi) for lo, hi in ranges]
    files = ProcessFiles(pid)
    try:
        assert reader.huge_parts(wanted) == merge_adjacent(files.huge_regions_in(wanted))
    finally:
        files.close()
    assert reader.huge_parts(wanted[1:]) is None
    return got


def test_frame_reader_reuses_only_unchanged_ranges_and_is_never_stale(child):
    proc, layout = child
    pid, start = layout["pid"], layout["start"]
    reader = FrameReader(pid)
    check_read(reader, pid)
    # Idle child: the next reads reuse every range without walking its page tables (a page
    # migration, THP split or collapse elsewhere on the machine forces a scan or a full read
    # now and then: several tries).
    for _ in range(10):
        before, skipped = reader.ranges_read, reader.scans_skipped
        check_read(reader, pid)
        if reader.ranges_read == before and reader.scans_skipped == skipped + 1:
            break
    else:
        pytest.fail(f"10 reads of an idle process all scanned or re-read a range "
                    f"({reader.ranges_read} read, {reader.scans_skipped} scans skipped)")

    # Collapse one 2 MiB range (MADV_COLLAPSE from the child itself): its pages get new
    # frames, which the next read must show.
    old = pfns(read_page_frames(pid, ranges_of(pid)))[start]
    assert madvise(proc, start, HUGE, MADV_COLLAPSE) == "ok"
    read_before = reader.ranges_read + reader.windows_read
    got = check_read(reader, pid)
    assert pfns(got)[start] != old and reader.ranges_read + reader.windows_read > read_before
    assert any(r.start <= start and start + HUGE <= r.end
               for r in reader.huge_parts(AddrRange(lo, hi) for lo, hi in ranges_of(pid)))

    # Drop half a range's pages: no fault, fewer present pages.
    madvise(proc, start + HUGE, HUGE // 2, MADV_DONTNEED)
    got = check_read(reader, pid)
    assert start + HUGE not in pfns(got)


def test_a_lazy_observer_reads_a_moved_window_again_once_it_reads_hot(spare_child):
    proc, layout = spare_child
    pid, start = layout["pid"], layout["start"]
    window = start + 2 * HUGE
    # A window made huge before the first look: PMD-mapped, so never noted unverified (a
    # source that cannot demote has nothing to do with a huge range).
    assert madvise(proc, start, HUGE, MADV_COLLAPSE) == "ok"
    files = ProcessFiles(pid)
    try:
        obs = Observer(files, physical=True, can_demote=False)
        first = read_page_frames(pid, ranges_of(pid))
        obs.observe(physical(first))
        assert obs.frames is not None and not obs.frames.eager
        before = pfns(first)
        assert refault(proc, window, HUGE) == "ok"
        fresh = read_page_frames(pid, ranges_of(pid))
        moved = [a for a in range(window, window + HUGE, 4096) if pfns(fresh)[a] != before[a]]
        assert moved, "the refault gave the window its old frames back"

        # Nothing accessed: the moved window is kept as it was read, and noted unverified.
        obs.observe(physical(first, fresh, scale=0))
        assert window in obs.frames.unverified
        assert start not in obs.frames.unverified, "a PMD-mapped window noted unverified"
        assert start + HUGE in obs.frames.unverified  # a 4 KiB neighbour still is
        assert obs.frames.windows_verified == 0

        # Every frame accessed (old and new ones): the window reads hot, so it is read again
        # before its reading is used, and the map equals one made from a fresh read.
        phys = physical(first, fresh, base_accesses=1)
        obs.observe(phys)
        assert window not in obs.frames.unverified
        assert obs.frames.windows_verified >= 1
        now = read_page_frames(pid, ranges_of(pid))
        assert obs.last_mapped == reverse_map(phys, now)
    finally:
        files.close()


def holding(pid: int, addr: int) -> tuple[int, int]:
    """The range (mapping) of ranges_of(pid) that holds `addr`."""
    return next((lo, hi) for lo, hi in ranges_of(pid) if lo <= addr < hi)


def refault(proc, start: int, length: int) -> str:
    return command(proc, f"refault {start} {length}")


def test_the_full_read_period_doubles_while_full_reads_find_the_kept_frames(child):
    """The bound on unsignalled moves: every full read that finds a range's kept frames doubles
    its period up to FULL_READ_MAX_S, one that finds a frame moved without any counter showing
    it sets it back (a move of that kind is emulated by altering a kept entry)."""
    from damon_hp.frame_reader import FULL_READ_EVERY_S, FULL_READ_MAX_S

    _, layout = child
    pid = layout["pid"]
    buffer = holding(pid, layout["start"])
    now = [0.0]
    reader = FrameReader(pid, clock=lambda: now[0])
    reader.read(ranges_of(pid))
    assert reader.full_read_periods[buffer] == FULL_READ_EVERY_S
    seen = []
    for _ in range(12):  # a collapse or migration elsewhere on the machine sets it back: retry
        now[0] += max(reader.full_read_periods.values())
        before = reader.ranges_read
        reader.read(ranges_of(pid))
        assert reader.ranges_read > before, "a due full read was skipped"
        seen.append(reader.full_read_periods[buffer])
        if seen[-1] == FULL_READ_MAX_S:
            break
    else:
        pytest.fail(f"the period never reached {FULL_READ_MAX_S} s: {seen}")
    assert set(seen) <= {FULL_READ_EVERY_S, 2 * FULL_READ_EVERY_S, FULL_READ_MAX_S}
    # Not due: the buffer is not read whole (other ranges may be, at their own periods).
    now[0] += FULL_READ_MAX_S / 2
    reader.read(ranges_of(pid))
    assert reader.full_read_periods[buffer] in (FULL_READ_MAX_S, FULL_READ_EVERY_S)
    # A kept entry that no longer says where the page is: found at the buffer's next full read,
    # which sets its period back unless a counter had moved meanwhile (then the change may be
    # the one it announced, and the period stays): retry.
    periods = []
    for _ in range(6):
        run = reader._ranges[buffer][1][0]
        run.entries[0] ^= 1
        period = reader.full_read_periods[buffer]
        now[0] += period
        got = reader.read(ranges_of(pid))
        assert pfns(got) == pfns(read_page_frames(pid, ranges_of(pid)))
        assert reader.full_read_periods[buffer] in (FULL_READ_EVERY_S, period)
        periods.append(reader.full_read_periods[buffer])
        if periods[-1] == FULL_READ_EVERY_S:
            break
    else:
        pytest.fail(f"an unannounced change never set the period back: {periods}")


def test_a_range_that_changes_between_full_reads_holds_only_its_own_period(spare_child):
    """Each range has its own full-read period: one whose frames the target moves between full
    reads (a fault announces it, so its period stays) no longer holds the others at 30 s. One
    period for all kept a 4 GiB run's full reads at every 30 s while its heap grew."""
    from damon_hp.frame_reader import FULL_READ_EVERY_S

    proc, layout = spare_child
    pid = layout["pid"]
    mid = (layout["start"] + layout["end"]) // 2
    # MADV_NOHUGEPAGE on the upper half splits the buffer into two ranges (two VMAs).
    assert madvise(proc, mid, layout["end"] - mid, MADV_NOHUGEPAGE) == "ok"
    lower, upper = holding(pid, layout["start"]), holding(pid, mid)
    now = [0.0]
    reader = FrameReader(pid, eager=False, clock=lambda: now[0])
    check_read(reader, pid)
    assert {lower, upper} <= reader.full_read_periods.keys()
    seen = []
    for k in range(6):  # the upper half's frames moving meanwhile (compaction): try again
        window = layout["start"] + k * 65536
        before = pfns(read_page_frames(pid, [lower]))
        assert refault(proc, window, 65536) == "ok"
        after = pfns(read_page_frames(pid, [lower]))
        now[0] += max(reader.full_read_periods.values())
        check_read(reader, pid)
        periods = reader.full_read_periods
        if all(after[a] == before[a] for a in range(window, window + 65536, 4096)):
            continue  # the refault got its old frames back: nothing moved in the lower half
        assert periods[lower] == FULL_READ_EVERY_S, "a range whose frames moved was trusted longer"
        seen.append(periods[upper])
        if periods[upper] > FULL_READ_EVERY_S:
            break
    else:
        pytest.fail(f"the unchanged range's period never grew beside a changing one: {seen}")


def test_a_read_when_only_one_range_is_due_walks_that_range_alone_and_is_never_stale(
        spare_child):
    """When nothing moved and only some ranges' full-read periods ran out, only those are
    scanned and read (a periodic read of a small heap arena scanned a whole 4 GiB target); the
    others keep their stretches and entries, and the result equals a fresh read."""
    from damon_hp.frame_reader import FULL_READ_EVERY_S

    proc, layout = spare_child
    pid = layout["pid"]
    mid = (layout["start"] + layout["end"]) // 2
    assert madvise(proc, mid, layout["end"] - mid, MADV_NOHUGEPAGE) == "ok"
    lower, upper = holding(pid, layout["start"]), holding(pid, mid)
    tries = []
    now = [0.0]
    for _ in range(6):  # a counter moving on the machine between the reads: try again
        now[0] = 0.0
        reader = FrameReader(pid, eager=False, clock=lambda: now[0])
        check_read(reader, pid)
        # A kept entry of the lower half altered: its full read finds a change and keeps its
        # period at 30 s, the upper half's doubles.
        reader._ranges[lower][1][0].entries[0] ^= 1
        now[0] += FULL_READ_EVERY_S
        check_read(reader, pid)
        assert reader.full_read_periods[lower] == FULL_READ_EVERY_S
        if reader.full_read_periods[upper] == FULL_READ_EVERY_S:
            tries.append("the upper half's period did not grow")
            continue
        now[0] += FULL_READ_EVERY_S
        due = {rng for rng, (at, every) in reader._full.items() if now[0] - at >= every}
        assert lower in due and upper not in due
        narrowed, read = reader.scans_narrowed, reader.ranges_read
        check_read(reader, pid)
        if reader.scans_narrowed == narrowed:
            tries.append("a counter moved")
            continue
        assert reader.ranges_read - read == len(due)
        assert reader._full[upper][0] == FULL_READ_EVERY_S, "the upper half was read whole"
        break
    else:
        pytest.fail(f"never a read with only some ranges due and nothing moved: {tries}")


def test_a_full_read_that_finds_the_kept_frames_doubles_the_period_though_counters_moved(
        child, spare_child):
    """A collapse in another process just before a due full read moves the machine's
    collapse count; the read finds this process's frames as kept, so the period doubles all
    the same (it used to go back to 30 s whenever a counter had moved, and so never grew
    while the agent collapsed)."""
    from damon_hp.frame_reader import FULL_READ_EVERY_S

    (_, layout), (spare, other) = child, spare_child
    pid = layout["pid"]
    buffer = holding(pid, layout["start"])
    windows = iter(range(other["start"], other["end"] - HUGE + 1, HUGE))
    seen = []
    now = [0.0]
    for _ in range(6):  # this process's own frames moving meanwhile makes a try inconclusive
        now[0] = 0.0
        reader = FrameReader(pid, clock=lambda: now[0])
        reader.read(ranges_of(pid))
        churn = reader._churn
        assert madvise(spare, next(windows), HUGE, MADV_COLLAPSE) == "ok"
        now[0] += FULL_READ_EVERY_S
        before = reader.ranges_read
        reader.read(ranges_of(pid))
        assert reader.ranges_read > before, "a due full read was skipped"
        assert reader._churn != churn, "the collapse elsewhere moved no counter"
        seen.append(reader.full_read_periods[buffer])
        if seen[-1] == 2 * FULL_READ_EVERY_S:
            break
    else:
        pytest.fail(f"the period never doubled: {seen}")


def test_a_full_read_after_patches_finds_the_patched_entries_as_kept(child):
    """A collapse makes the next read patch the windows it changed, which cuts the range's
    runs into pieces; the next full read makes one run per present stretch. It must still find
    the entries as kept (and keep extents equal to ones made anew), so the period doubles."""
    from damon_hp.frame_reader import FULL_READ_EVERY_S
    from damon_hp.frames import extents_of

    proc, layout = child
    pid = layout["pid"]
    buffer = holding(pid, layout["start"])
    windows = iter(range(layout["start"], layout["end"] - HUGE + 1, HUGE))
    seen = []
    now = [0.0]
    for _ in range(4):  # frames moving elsewhere in the child meanwhile: try again
        now[0] = 0.0
        reader = FrameReader(pid, eager=False, clock=lambda: now[0])
        check_read(reader, pid)
        assert madvise(proc, next(windows), HUGE, MADV_COLLAPSE) == "ok"
        patched = reader.windows_read
        check_read(reader, pid)
        assert reader.windows_read > patched, "the collapse was not patched in"
        assert len(reader._ranges[buffer][1]) > 1
        now[0] += FULL_READ_EVERY_S
        full = reader.ranges_read
        check_read(reader, pid)
        assert reader.ranges_read > full, "a due full read was skipped"
        for _, runs, ext in reader._ranges.values():
            again = extents_of(runs)
            assert ext is not None and all(
                (getattr(ext, f) == getattr(again, f)).all() for f in ("vpage", "pfn", "n"))
        seen.append(reader.full_read_periods[buffer])
        if seen[-1] == 2 * FULL_READ_EVERY_S:
            break
    else:
        pytest.fail(f"the full read never found the patched entries as kept: {seen}")


def test_a_round_reads_the_machine_counters_once():
    """damon-hpd's round observes every process before it acts on any: the machine's counters
    are read once for all of them, and again for every read outside a round."""
    from damon_hp.frame_moves import _machine_counters, shared_machine_counters

    with shared_machine_counters():
        first = _machine_counters()
        assert _machine_counters() is first
    assert _machine_counters() is not first
    assert _machine_counters() is not _machine_counters()


def test_a_collapse_counted_as_another_process_s_makes_no_walk_here(child, spare_child):
    """damon-hpd collapses one process inside `own_collapses(pid)`: the machine-wide collapse
    count rises, but only that process's frame reader walks its page tables again; one not
    counted so (khugepaged's, another tool's) makes every reader walk. A collapse or migration
    elsewhere on the machine meanwhile makes a try inconclusive: several tries."""
    from damon_hp.frame_moves import own_collapses

    (proc, layout), (_, other) = child, spare_child
    here, there = FrameReader(other["pid"], eager=False), FrameReader(layout["pid"], eager=False)
    for reader in (here, there):
        check_read(reader, reader.pid)

    def walked_after(collapse) -> tuple[bool, bool] | None:
        """(here walked, there walked) after `collapse`, or None if a read before it walked."""
        skipped = here.scans_skipped, there.scans_skipped
        check_read(here, here.pid), check_read(there, there.pid)
        if (here.scans_skipped, there.scans_skipped) != (skipped[0] + 1, skipped[1] + 1):
            return None  # something moved frames elsewhere just now
        collapse()
        skipped = here.scans_skipped, there.scans_skipped
        check_read(here, here.pid), check_read(there, there.pid)
        return here.scans_skipped == skipped[0], there.scans_skipped == skipped[1]

    windows = iter(range(layout["start"], layout["end"], HUGE))

    def collapse_next() -> None:
        assert madvise(proc, next(windows), HUGE, MADV_COLLAPSE) == "ok"

    def collapse_next_as_ours() -> None:
        with own_collapses(there.pid):
            collapse_next()

    seen = []
    for _ in range(6):
        seen.append(walked_after(collapse_next_as_ours))
        if seen[-1] == (False, True):
            break
    else:
        pytest.fail(f"(here walked, there walked) after collapses counted as there's: {seen}")
    for _ in range(6):
        seen.append(walked_after(collapse_next))
        if seen[-1] is not None:
            assert seen[-1] == (True, True), seen
            break
    else:
        pytest.fail(f"no conclusive try of a collapse not counted as ours: {seen}")


def test_a_read_after_only_our_own_collapses_spares_the_scan_and_is_never_stale(child):
    """Told of the windows our own collapses made huge (pipeline.act: `FrameReader.collapsed`),
    the next read writes them into the kept stretches and reads only their entries again,
    without PAGEMAP_SCAN, and must still equal a fresh read (check_read: the new huge folio's
    frames, PMD-mapped parts, the reverse map). A collapse, split or migration elsewhere on
    the machine makes a try inconclusive (this reader is eager: any move makes it read whole):
    several tries, each on a window of its own."""
    from damon_hp.frame_moves import own_collapses

    proc, layout = child
    pid = layout["pid"]
    reader = FrameReader(pid)
    windows = iter(range(layout["start"], layout["end"], HUGE))
    tries = []
    for _ in range(6):
        check_read(reader, pid)
        w = next(windows)
        old = pfns(read_page_frames(pid, ranges_of(pid)))[w]
        with own_collapses(pid):
            assert madvise(proc, w, HUGE, MADV_COLLAPSE) == "ok"
        reader.collapsed([w])
        spared, scans = reader.scans_spared, reader.windows_read
        got = check_read(reader, pid)
        assert pfns(got)[w] != old
        tries.append((reader.scans_spared - spared, reader.windows_read - scans))
        if tries[-1] == (1, 1):
            break
    else:
        pytest.fail(f"(reads spared, windows read) after each collapse: {tries}")


def test_a_collapse_beside_a_change_of_the_target_s_own_is_read_with_the_scan(child):
    """Our collapse and, in the same interval, pages the target dropped itself (MADV_DONTNEED:
    no fault, only its resident pages fall): the counters say more happened than our
    collapse, so the read walks the page tables and finds both. (A drop smaller than the
    per-CPU batches of the resident count does not show there, and waits for the full read
    whether or not we collapsed: frame_moves.page_counters.)"""
    from damon_hp.frame_moves import own_collapses

    proc, layout = child
    pid, start = layout["pid"], layout["start"]
    reader = FrameReader(pid)
    check_read(reader, pid)
    with own_collapses(pid):
        assert madvise(proc, start, HUGE, MADV_COLLAPSE) == "ok"
    reader.collapsed([start])
    assert madvise(proc, start + 4 * HUGE, HUGE, MADV_DONTNEED) == "ok"
    spared = reader.scans_spared
    got = check_read(reader, pid)
    assert reader.scans_spared == spared
    assert not any(start + 4 * HUGE <= a < start + 5 * HUGE for a in pfns(got))


def test_a_lazy_reader_reads_with_the_scan_when_the_target_faulted_more_than_our_collapse(
        spare_child):
    """A lazy reader lets the target fault once per window we collapsed (it touched the window
    while MADV_COLLAPSE held it unmapped), not more: pages given new frames by the target's
    own faults in the same interval (`refault`: dropped and written again, so the resident
    pages do not change) make the read walk the page tables. Being lazy, it notes the kept
    windows unverified after the faults, and reads the refaulted one's new frames as soon as
    it is verified (as it is when it reads hot)."""
    from damon_hp.frame_moves import own_collapses

    proc, layout = spare_child
    pid, start = layout["pid"], layout["start"]
    reader = FrameReader(pid, eager=False)
    check_read(reader, pid)
    with own_collapses(pid):
        assert madvise(proc, start, HUGE, MADV_COLLAPSE) == "ok"
    reader.collapsed([start])
    moved = start + 4 * HUGE

    def frame() -> int:
        return pfns(read_page_frames(pid, ranges_of(pid)))[moved]

    old = frame()
    assert refault(proc, moved, HUGE) == "ok"
    assert frame() != old
    spared = reader.scans_spared
    reader.read(ranges_of(pid))
    assert reader.scans_spared == spared
    assert moved in reader.unverified and start not in reader.unverified
    checked = reader.verify([moved])
    assert checked is not None and pfns(checked)[moved] == frame()


def test_the_huge_parts_after_our_collapses_are_what_a_walk_finds(child):
    """After collapses that all took (process_madvise, as the agent makes them), the agent
    measures what is huge from the frame read before them with their ranges added
    (pipeline.huge_after) instead of walking the page tables: it must be what a PAGEMAP_SCAN
    finds then. With a failed collapse among them it answers nothing (the walk is made)."""
    from damon_hp.actuate import Applied, Target, collapse
    from damon_hp.pipeline import huge_after

    _, layout = child
    pid, start = layout["pid"], layout["start"]
    mappings = [AddrRange(lo, hi) for lo, hi in ranges_of(pid)]
    reader = FrameReader(pid)
    reader.read(ranges_of(pid))
    target = Target.open(pid)
    files = ProcessFiles(pid)
    try:
        applied = Applied(collapses=collapse(target, [start + HUGE, start + 2 * HUGE,
                                                      start + 5 * HUGE]))
        assert [r.error for r in applied.collapses] == [None, None, None]
        got = huge_after(reader.huge_parts(mappings), applied, mappings)
        assert got is not None and got == merge_adjacent(files.huge_regions_in(mappings))
        assert {start + HUGE, start + 2 * HUGE, start + 5 * HUGE} <= {
            w for r in got for w in range(r.start, r.end, HUGE)}
        unmapped = max(m.end for m in mappings) + (1 << 30)
        failed = Applied(collapses=[*applied.collapses, *collapse(target, [unmapped])])
        assert failed.collapses[-1].error is not None
        assert huge_after(reader.huge_parts(mappings), failed, mappings) is None
    finally:
        files.close()
        target.close()
