"""ranges.py's sweeps against their plain definitions: `intersect` (bisection over sorted,
disjoint limits), `starts_inside` (`inside_any` for many starts) and `merge_adjacent` (sorted by
a key, not the dataclass order), and the policy's `dominant_part` (a shortcut for a region inside
one mapping), on random ranges that touch, overlap, nest and share ends."""

from __future__ import annotations

import random

from damon_hp.ranges import (
    HUGE_PAGE_BYTES,
    AddrRange,
    inside_any,
    intersect,
    merge_adjacent,
    starts_inside,
)

H = HUGE_PAGE_BYTES
SEEDS = range(300)


def plain_intersect(ranges: list[AddrRange], limits: list[AddrRange]) -> list[AddrRange]:
    return [AddrRange(max(r.start, m.start), min(r.end, m.end))
            for r in ranges for m in limits if max(r.start, m.start) < min(r.end, m.end)]


def plain_merge(ranges: list[AddrRange]) -> list[AddrRange]:
    """Byte by byte (in 1 MiB units): the maximal runs covered, touching runs joined."""
    unit = 1 << 20
    covered = sorted({u for r in ranges for u in range(r.start // unit, r.end // unit)})
    out: list[AddrRange] = []
    for u in covered:
        if out and out[-1].end == u * unit:
            out[-1] = AddrRange(out[-1].start, (u + 1) * unit)
        else:
            out.append(AddrRange(u * unit, (u + 1) * unit))
    return out


def random_ranges(rng: random.Random, n: int, *, disjoint: bool) -> list[AddrRange]:
    """Ranges on a 1 MiB grid within 64 MiB (so ends meet often); disjoint ones sorted."""
    unit = 1 << 20
    if disjoint:
        cuts = sorted(rng.sample(range(65), 2 * n))
        return [AddrRange(a * unit, b * unit) for a, b in zip(cuts[::2], cuts[1::2], strict=True)
                if rng.random() < 0.8]
    out = []
    for _ in range(n):
        a = rng.randrange(64)
        out.append(AddrRange(a * unit, rng.randrange(a + 1, 65) * unit))
    return out


def test_intersect_equals_the_double_loop_for_any_limits() -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        ranges = random_ranges(rng, rng.randrange(1, 8), disjoint=False)
        for limits in (random_ranges(rng, rng.randrange(1, 12), disjoint=True),  # bisection
                       random_ranges(rng, rng.randrange(1, 12), disjoint=False)):  # the loop
            assert intersect(ranges, limits) == plain_intersect(ranges, limits), (seed, limits)


def test_intersect_keeps_touching_limits_apart_and_skips_those_only_touching() -> None:
    limits = [AddrRange(0, 2 * H), AddrRange(2 * H, 4 * H), AddrRange(6 * H, 8 * H)]
    assert intersect([AddrRange(H, 6 * H)], limits) == [AddrRange(H, 2 * H),
                                                       AddrRange(2 * H, 4 * H)]
    assert intersect([AddrRange(4 * H, 6 * H)], limits) == []


def test_starts_inside_equals_inside_any_per_start() -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        ranges = random_ranges(rng, rng.randrange(0, 10), disjoint=rng.random() < 0.5)
        starts = [rng.randrange(0, 34) * H for _ in range(rng.randrange(0, 40))]
        assert starts_inside(starts, ranges) == {s for s in starts if inside_any(s, ranges)}, \
            (seed, ranges, starts)


def test_starts_inside_needs_one_range_to_hold_the_whole_2_mib() -> None:
    # two touching halves do not hold it: a huge page cannot cross a mapping's boundary
    halves = [AddrRange(0, H // 2), AddrRange(H // 2, H)]
    assert starts_inside([0], halves) == set()
    # a long range behind a short one still holds it (the sweep keeps the furthest end)
    nested = [AddrRange(0, 8 * H), AddrRange(H, H + 4096)]
    assert starts_inside([2 * H, 8 * H], nested) == {2 * H}


def test_merge_adjacent_equals_the_covered_runs() -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        ranges = random_ranges(rng, rng.randrange(0, 10), disjoint=False)
        rng.shuffle(ranges)
        assert merge_adjacent(ranges) == plain_merge(ranges), (seed, ranges)


def test_dominant_part_is_its_definition() -> None:
    """policy.hotset.dominant_part (with its shortcut for a region inside one mapping) against
    the plain definition: the largest piece of the region inside one mapping, if it holds
    `share` % of the region and the rest cannot explain the reading."""
    from damon_hp.policy.hotset import REST_MARGIN, dominant_part

    def plain(region: AddrRange, maps: list[AddrRange], share: float, pct: float):
        best = None
        for m in maps:
            a, b = max(region.start, m.start), min(region.end, m.end)
            if b > a and (best is None or b - a > best.size):
                best = AddrRange(a, b)
        if best is None or 100 * best.size < share * region.size:
            return None
        rest = 100.0 * (region.size - best.size) / region.size
        return None if rest > 0 and pct <= REST_MARGIN * rest else best

    unit = 1 << 20
    for seed in SEEDS:
        rng = random.Random(seed)
        maps = random_ranges(rng, rng.randrange(1, 12), disjoint=True)
        for _ in range(20):
            lo = rng.randrange(0, 60) * unit
            region = AddrRange(lo, lo + rng.randrange(1, 12) * unit)
            share, pct = rng.choice((50.0, 90.0, 100.0, 101.0)), rng.uniform(0, 100)
            assert dominant_part(region, maps, share, pct) == plain(region, maps, share, pct)
