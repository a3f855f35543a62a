"""FrameReader's full read: are the entries it finds the ones it kept, however the runs are cut?

Pure: runs of made-up pagemap entries (FrameRun), cut as a patched range is (window-sized
pieces) and as a full read cuts it (one run per present stretch)."""

from __future__ import annotations

import random
from array import array
from itertools import pairwise

import pytest
from damon_hp.frames import FrameRun, same_entries

PAGE = 4096
WINDOW = 512  # pages


def run(start_page: int, entries: list[int]) -> FrameRun:
    return FrameRun(start_page * PAGE, array("Q", entries))


def cut(r: FrameRun, at_pages: list[int]) -> list[FrameRun]:
    """`r` cut at those page offsets."""
    bounds = [0, *at_pages, len(r.entries)]
    return [FrameRun(r.start + a * PAGE, r.entries[a:b]) for a, b in pairwise(bounds)]


def whole(rng: random.Random, n: int = 4 * WINDOW) -> FrameRun:
    return run(1000 * WINDOW, [rng.randrange(1, 1 << 40) | (1 << 63) for _ in range(n)])


@pytest.mark.parametrize("seed", range(20))
def test_the_same_entries_cut_at_windows_are_the_same(seed):
    rng = random.Random(seed)
    r = whole(rng)
    pieces = cut(r, [w * WINDOW for w in sorted(rng.sample(range(1, 4), rng.randint(1, 3)))])
    assert same_entries(pieces, [r]) and same_entries([r], [r])


def test_a_changed_entry_an_extra_page_or_a_lost_page_is_a_change():
    rng = random.Random(1)
    r = whole(rng)
    pieces = cut(r, [WINDOW, 2 * WINDOW])
    changed = FrameRun(r.start, array("Q", r.entries))
    changed.entries[700] ^= 1
    assert not same_entries(pieces, [changed])
    # a page present now in a hole the kept runs left out
    holed = [pieces[0], pieces[2]]
    assert not same_entries(holed, [r])
    # the hole reads as nothing in the new read too: the same
    blank = FrameRun(r.start, array("Q", r.entries))
    blank.entries[WINDOW:2 * WINDOW] = array("Q", [0]) * WINDOW
    assert same_entries(holed, [blank])
    # a kept page gone now (its entry reads 0)
    assert not same_entries(pieces, [blank])


def test_kept_runs_that_no_new_run_holds_whole_are_compared_page_by_page():
    rng = random.Random(2)
    r = whole(rng)
    a, b = cut(r, [WINDOW + 5])
    # the new read cut elsewhere: the old first run spans both new runs
    x, y = cut(r, [WINDOW])
    assert same_entries([a, b], [x, y])
    y2 = FrameRun(y.start, array("Q", y.entries))
    y2.entries[3] ^= 1 << 5
    assert not same_entries([a, b], [x, y2])
    # a kept run outside every new run, of pages that read as nothing: the same
    nothing = run(0, [0] * 8)
    assert same_entries([nothing, r], [r])
    assert not same_entries([run(0, [7] * 8), r], [r])
