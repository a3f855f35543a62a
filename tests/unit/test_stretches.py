"""stretches.with_huge: PAGEMAP_SCAN's stretches of a range with windows collapsed written in,
as FrameReader keeps them after a read spared by our own collapses. They must be what a scan
would return then: the windows present and PMD-mapped, everything else as it was, neighbours of
equal categories joined (the kernel joins them: pagemap_scan_output, fs/proc/task_mmu.c)."""

from __future__ import annotations

import random

import pytest
from damon_hp.procfs import PAGE_IS_HUGE, PAGE_IS_PRESENT
from damon_hp.stretches import (
    changed_windows,
    huge_windows,
    present_windows,
    window_spans,
    with_huge,
)

H = 2 << 20
P, PH = PAGE_IS_PRESENT, PAGE_IS_PRESENT | PAGE_IS_HUGE
V = 0x7F00_0000_0000


def test_a_window_inside_a_base_stretch_splits_it_in_three():
    assert with_huge(((V, V + 4 * H, P),), [V + H]) == (
        (V, V + H, P), (V + H, V + 2 * H, PH), (V + 2 * H, V + 4 * H, P))


def test_a_window_beside_a_huge_stretch_joins_it():
    assert with_huge(((V, V + H, PH), (V + H, V + 4 * H, P)), [V + H]) == (
        (V, V + 2 * H, PH), (V + 2 * H, V + 4 * H, P))


def test_a_window_over_a_hole_fills_it():
    # a collapse within max_ptes_none fills the absent pages of its window
    assert with_huge(((V, V + H + 4096, P), (V + 3 * H, V + 4 * H, P)), [V + H, V + 2 * H]) == (
        (V, V + H, P), (V + H, V + 3 * H, PH), (V + 3 * H, V + 4 * H, P))


def test_nothing_collapsed_leaves_the_stretches_as_they_were():
    old = ((V, V + H, PH), (V + H, V + 3 * H, P))
    assert with_huge(old, []) == old
    assert with_huge(None, [V]) == ((V, V + H, PH),)


def random_stretches(rng: random.Random) -> tuple[tuple[int, int, int], ...]:
    """Stretches over 16 windows as a scan gives them: disjoint, sorted, equal neighbours
    joined, huge ones whole windows."""
    pages = H // 4096
    cats: list[int] = []
    for _ in range(16):
        kind = rng.random()
        if kind < 0.3:
            cats += [PH] * pages  # PMD-mapped
        elif kind < 0.6:
            cats += [P if rng.random() < 0.9 else 0 for _ in range(pages)]  # with holes
        elif kind < 0.9:
            cats += [P] * pages  # all present, base pages
        else:
            cats += [0] * pages  # nothing present
    out: list[tuple[int, int, int]] = []
    for i, c in enumerate(cats):
        lo = V + i * 4096
        if not c:
            continue
        if out and out[-1][1] == lo and out[-1][2] == c:
            out[-1] = (out[-1][0], lo + 4096, c)
        else:
            out.append((lo, lo + 4096, c))
    return tuple(out)


@pytest.mark.parametrize("seed", range(30))
def test_with_huge_is_what_a_scan_would_say(seed):
    rng = random.Random(seed)
    old = random_stretches(rng)
    windows = rng.sample(range(V, V + 16 * H, H), rng.randint(1, 6))
    new = with_huge(old, windows)
    assert all(a[1] <= b[0] for a, b in zip(new, new[1:], strict=False))  # sorted, disjoint
    assert not any(a[1] == b[0] and a[2] == b[2] for a, b in zip(new, new[1:], strict=False))
    assert huge_windows([new]) == huge_windows([old]) | set(windows)
    assert present_windows([new]) == present_windows([old]) | set(windows)
    # outside the collapsed windows nothing changed
    assert set(changed_windows(old, new)) <= set(windows)


def test_window_spans_clip_to_the_range_and_join_neighbours():
    lo, hi = H + 4096, 5 * H - 8192
    assert window_spans((lo, hi), [0, H, 2 * H, 4 * H, 6 * H]) == [(lo, 3 * H), (4 * H, hi)]
    assert window_spans((lo, hi), []) == []
    assert window_spans((lo, hi), [6 * H]) == []
