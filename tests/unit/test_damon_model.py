"""Snapshot/Region arithmetic and the JSON round trip of the DAMON layer's dataclasses."""

from __future__ import annotations

import json

import pytest
from damon_hp.damon import (
    ULONG_MAX,
    AccessPattern,
    AddrRange,
    Intervals,
    Recording,
    Region,
    Scheme,
    SchemeStats,
    Snapshot,
)

MiB = 1 << 20


def snap(*regions: Region, sample_us: int = 5_000, aggr_us: int = 100_000) -> Snapshot:
    return Snapshot(12.5, 4242, sample_us, aggr_us, tuple(regions))


def test_max_nr_accesses_is_sampling_intervals_per_aggregation():
    assert snap().max_nr_accesses == 20
    assert snap(sample_us=5_000, aggr_us=2_000_000).max_nr_accesses == 400
    # An aggregation shorter than a sample still allows one access, never a division by 0.
    assert snap(sample_us=5_000, aggr_us=1_000).max_nr_accesses == 1


def test_access_pct_scales_to_max_and_clamps():
    s = snap()
    assert s.access_pct(Region(0, 4096, 0, 0)) == 0.0
    assert s.access_pct(Region(0, 4096, 5, 0)) == 25.0
    assert s.access_pct(Region(0, 4096, 20, 0)) == 100.0
    # DAMON can report a moving value above the per-aggregation maximum; never over 100%.
    assert s.access_pct(Region(0, 4096, 27, 0)) == 100.0


def test_age_s_is_age_in_aggregations_times_aggregation_interval():
    assert snap(aggr_us=100_000).age_s(Region(0, 4096, 0, 30)) == pytest.approx(3.0)
    assert snap(aggr_us=2_000_000).age_s(Region(0, 4096, 0, 7)) == pytest.approx(14.0)


def test_region_and_range_sizes_and_overlap():
    r = Region(2 * MiB, 6 * MiB, 3, 1)
    assert r.size == 4 * MiB
    assert r.range == AddrRange(2 * MiB, 6 * MiB)
    assert r.range.overlap(AddrRange(5 * MiB, 10 * MiB)) == MiB
    assert r.range.overlap(AddrRange(6 * MiB, 10 * MiB)) == 0  # end is exclusive


def test_regions_in_returns_whole_overlapping_regions():
    a, b, c = Region(0, 10, 0, 0), Region(10, 20, 1, 0), Region(20, 30, 2, 0)
    s = snap(a, b, c)
    assert s.regions_in(AddrRange(15, 21)) == (b, c)
    assert s.regions_in(AddrRange(10, 20)) == (b,)
    assert s.total_bytes == 30


def test_bad_ranges_and_intervals_are_refused():
    with pytest.raises(ValueError):
        AddrRange(10, 10)
    with pytest.raises(ValueError):
        AddrRange(-1, 10)
    with pytest.raises(ValueError):
        Intervals(sample_us=200_000, aggr_us=100_000)


def test_default_access_pattern_matches_everything():
    p = AccessPattern()
    assert (p.min_size_bytes, p.max_size_bytes) == (0, ULONG_MAX)
    assert p.min_nr_accesses == 0 and p.max_nr_accesses == 2**32 - 1
    assert p.min_age == 0 and p.max_age == 2**32 - 1


def test_scheme_stores_filters_as_a_tuple_so_it_stays_hashable():
    s = Scheme("hugepage", addr_filters=[AddrRange(0, 2 * MiB)])
    assert s.addr_filters == (AddrRange(0, 2 * MiB),)
    assert hash(s) == hash(Scheme("hugepage", addr_filters=(AddrRange(0, 2 * MiB),)))


@pytest.mark.parametrize("obj", [
    Region(1, 2, 3, 4),
    snap(Region(0, 4096, 1, 2), Region(4096, 8192, 0, 9)),
    Intervals(5_000, 100_000, 1_000_000),
    AccessPattern(min_size_bytes=2 * MiB, min_nr_accesses=3, max_age=10),
    Scheme("nohugepage", AccessPattern(min_age=70), (AddrRange(0, 4 * MiB),), quota_bytes=MiB,
           apply_interval_us=5_000),
    SchemeStats(1, 2, 3, 4, 5),
])
def test_to_dict_from_dict_round_trips_through_json(obj):
    again = type(obj).from_dict(json.loads(json.dumps(obj.to_dict())))
    assert again == obj


def test_recording_round_trips_with_ground_truth_and_events(tmp_path):
    rec = Recording(kernel="6.12.95+deb12-amd64", command="capture", note="n",
                    snapshots=(snap(Region(0, 4096, 1, 1)),),
                    ground_truth={"hot": AddrRange(0, 4096)},
                    events=({"phase": 0, "t_mono": 1.5},))
    path = tmp_path / "r.json"
    rec.save(path)
    assert Recording.load(path) == rec
