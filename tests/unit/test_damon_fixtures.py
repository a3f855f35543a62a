"""The recorded DAMON fixtures load, say where they came from, and hold real, sane data.

These are the snapshots other tests (policy) build on; if a recapture ever produced something
malformed or meaningless, it should fail here first.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from damon_hp.damon import AddrRange, Recording, Snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DAMON_FIXTURES = sorted(FIXTURES.glob("damon-*.json"))


def weighted_pct(s: Snapshot, rng: AddrRange) -> float:
    parts = [(r.range.overlap(rng), s.access_pct(r)) for r in s.regions_in(rng)]
    return sum(b * p for b, p in parts) / sum(b for b, _ in parts)


def test_there_are_damon_fixtures():
    names = {p.name for p in DAMON_FIXTURES}
    assert {"damon-hotcold-64m-256m.json", "damon-phases-4x64m.json"} <= names


@pytest.mark.parametrize("path", DAMON_FIXTURES, ids=lambda p: p.name)
def test_fixture_names_its_kernel_and_command(path):
    rec = Recording.load(path)
    assert rec.kernel and rec.kernel[0].isdigit()
    assert "capture_damon.py" in rec.command
    assert rec.ground_truth and rec.snapshots


@pytest.mark.parametrize("path", DAMON_FIXTURES, ids=lambda p: p.name)
def test_fixture_snapshots_are_sorted_disjoint_and_in_time_order(path):
    rec = Recording.load(path)
    times = [s.taken_at_s for s in rec.snapshots]
    assert times == sorted(times)
    for s in rec.snapshots:
        assert s.regions, "an empty snapshot was recorded"
        for a, b in zip(s.regions, s.regions[1:], strict=False):
            assert a.end <= b.start
        assert all(r.start < r.end and 0 <= r.nr_accesses <= s.max_nr_accesses
                   for r in s.regions)
        # DAMON's vaddr regions cover every ground-truth buffer completely.
        for rng in rec.ground_truth.values():
            assert sum(r.range.overlap(rng) for r in s.regions_in(rng)) == rng.size


@pytest.mark.parametrize("name", ["damon-hotcold-64m-256m.json", "damon-hotcold-256m-1g.json"])
def test_recorded_hot_buffer_is_seen_far_busier_than_cold(name):
    rec = Recording.load(FIXTURES / name)
    hot, cold = rec.ground_truth["hot"], rec.ground_truth["cold"]
    later = rec.snapshots[len(rec.snapshots) // 2:]
    assert statistics.median(weighted_pct(s, hot) for s in later) >= 25
    assert statistics.median(weighted_pct(s, cold) for s in later) <= 5


def test_phases_fixture_events_line_up_with_snapshot_clock():
    rec = Recording.load(FIXTURES / "damon-phases-4x64m.json")
    phases = [e for e in rec.events if "phase" in e and "t_mono" in e]
    assert [p["region"] for p in phases] == [0, 1, 2, 3]
    first, last = rec.snapshots[0].taken_at_s, rec.snapshots[-1].taken_at_s
    # Same CLOCK_MONOTONIC: the phase switches fall within (or just before) the recording.
    assert all(first - 10 <= p["t_mono"] <= last for p in phases)
    # In the phase with the most snapshots, its region is the busiest one most of the time.
    def active(t: float) -> int | None:
        started = [p for p in phases if p["t_mono"] <= t]
        return started[-1]["region"] if started else None

    hits = total = 0
    for s in rec.snapshots:
        region = active(s.taken_at_s)
        if region is None or s.taken_at_s > phases[-1]["t_mono"] + 4:
            continue
        pct = {k: weighted_pct(s, v) for k, v in rec.ground_truth.items()}
        if max(pct.values()) == 0:
            continue
        total += 1
        hits += max(pct, key=pct.get) == f"region{region}"
    assert total >= 4 and hits >= 0.75 * total
