"""`damon-hp advise`'s pure parts: the THP growth estimate from synthetic page maps, the access
summary (accessed share, skew), the policy run dry, the hazards and the verdict."""

from __future__ import annotations

import pytest
from damon_hp import procfs
from damon_hp.advise import access, choices, growth, hazards, verdict
from damon_hp.damon.model import Region, Snapshot
from damon_hp.ranges import HUGE_PAGE_BYTES as H
from damon_hp.ranges import AddrRange
from test_policy_physical import load

PAGE = 4096
BASE = 0x7F0000000000  # 2 MiB aligned
RULES = growth.KindRules(shmem=False, shmem_why="shmem_enabled never", file=False,
                         file_why="no CONFIG_READ_ONLY_THP_FOR_FS")


def mapping(start: int, size: int, *, perms: str = "rw-p", path: str = "", inode: int = 0,
            offset: int = 0, rss: int = 0, flags: tuple[str, ...] = ()) -> procfs.Vma:
    return procfs.Vma(start, start + size, perms, offset, inode, path, {"Rss": rss},
                          list(flags))


def page_map(start: int, present: list[int]) -> dict[int, int]:
    """A synthetic page table: per 2 MiB range from `start`, how many of its pages are present,
    counted from a list of present page offsets as pagemap's present bits would show them."""
    counts: dict[int, int] = {}
    for page in present:
        window = start + page * PAGE // H * H
        counts[window] = counts.get(window, 0) + 1
    return counts


def test_a_touched_range_grows_to_a_whole_huge_page_under_thp_always() -> None:
    # 4 ranges: full, 32 pages touched (one per 64 KiB), untouched, one page
    present = list(range(512)) + [512 + 16 * i for i in range(32)] + [3 * 512 + 7]
    res = page_map(BASE, present)
    m = mapping(BASE, 4 * H, rss=len(present) * PAGE)
    g = growth.estimate([m], res, rss_bytes=len(present) * PAGE, max_ptes_none=511, rules=RULES)
    anon = g.kinds[growth.ANON]
    assert anon.always_ranges == 3  # the untouched range stays empty
    assert anon.always_added_bytes == (480 + 511) * PAGE
    assert g.rss_always_bytes == 3 * H
    assert g.added_pct == pytest.approx(100 * (480 + 511) / len(present))


def test_khugepaged_collapses_only_ranges_with_at_most_max_ptes_none_absent() -> None:
    res = {BASE: 512, BASE + H: 300, BASE + 2 * H: 255, BASE + 3 * H: 1}
    m = mapping(BASE, 4 * H)
    strict = growth.estimate([m], res, 0, max_ptes_none=256, rules=RULES).kinds[growth.ANON]
    assert strict.khugepaged_ranges == 2  # 512 and 300 resident; 255 and 1 are too sparse
    assert strict.khugepaged_added_bytes == 212 * PAGE
    loose = growth.estimate([m], res, 0, max_ptes_none=511, rules=RULES).kinds[growth.ANON]
    assert loose.khugepaged_added_bytes == (212 + 257 + 511) * PAGE


def test_only_whole_aligned_ranges_inside_a_mapping_count() -> None:
    # a mapping from 1 MiB into a range to 1 MiB into the fourth: two whole ranges inside
    m = mapping(BASE + H // 2, 3 * H)
    assert growth.huge_slots(m, growth.ANON) == [BASE + H, BASE + 2 * H]
    res = {BASE: 100, BASE + H: 1, BASE + 2 * H: 1, BASE + 3 * H: 100}
    g = growth.estimate([m], res, 0, 511, RULES)
    assert g.kinds[growth.ANON].always_added_bytes == 2 * 511 * PAGE


def test_nohugepage_mappings_and_misaligned_files_get_no_huge_pages() -> None:
    nh = mapping(BASE, 2 * H, flags=("rd", "wr", "nh"))
    shm = mapping(BASE + 4 * H, 2 * H, perms="rw-s", path="/dev/shm/x", inode=9, offset=4096)
    assert growth.kind_of(shm) == growth.SHMEM
    assert growth.huge_slots(shm, growth.SHMEM) == []  # offset and address disagree mod 2 MiB
    g = growth.estimate([nh, shm], {BASE: 1, BASE + 4 * H: 1}, 0, 511, RULES)
    assert g.added_bytes == 0
    assert g.mappings[0].no_hugepage


def test_shared_memory_counts_toward_thp_always_only_where_shmem_enabled_allows() -> None:
    shm = mapping(BASE, 2 * H, perms="rw-s", path="/SYSV00000000 (deleted)", inode=5)
    res = {BASE: 10, BASE + H: 10}
    off = growth.estimate([shm], res, 20 * PAGE, 511, RULES)
    assert off.kinds[growth.SHMEM].always_added_bytes == 2 * 502 * PAGE  # estimated ...
    assert off.added_bytes == 0  # ... but not counted under shmem_enabled never
    on = growth.estimate([shm], res, 20 * PAGE,
                         511, growth.KindRules(True, "always", False, ""))
    assert on.added_bytes == 2 * 502 * PAGE


def test_kinds_of_mappings() -> None:
    assert growth.kind_of(mapping(BASE, H, path="[heap]")) == growth.ANON
    assert growth.kind_of(mapping(BASE, H, perms="rw-s", path="/dev/zero (deleted)",
                                  inode=3)) == growth.SHMEM
    assert growth.kind_of(mapping(BASE, H, perms="r-xp", path="/usr/bin/x",
                                  inode=3)) == growth.FILE
    assert growth.kind_of(mapping(BASE, H, perms="r-xp", path="[vdso]")) is None


def snap(t: float, regions: list[tuple[int, int, int]], aggr_us: int = 5_000_000) -> Snapshot:
    return Snapshot(t, 1, 500_000, aggr_us,
                    tuple(Region(a, b, n, 0) for a, b, n in regions))


def test_readings_split_regions_at_2mib_and_weigh_samples_by_pages() -> None:
    s = snap(0, [(BASE, BASE + 3 * H, 10), (BASE + 3 * H, BASE + 4 * H, 0)])
    rd = access.readings_from_snapshot(s)
    assert sorted(rd) == [BASE + i * H for i in range(4)]
    assert rd[BASE].accessed and rd[BASE].samples == pytest.approx(512)  # 10 of 10 samples
    assert not rd[BASE + 3 * H].accessed and rd[BASE + 3 * H].samples == 0


def test_readings_of_a_vaddr_snapshot_count_only_mapped_memory() -> None:
    # one region over two mappings and the gap between them
    s = snap(0, [(BASE, BASE + 8 * H, 10)])
    mapped = [AddrRange(BASE, BASE + H), AddrRange(BASE + 6 * H, BASE + 6 * H + H // 2)]
    rd = access.readings_from_snapshot(s, mapped)
    assert sorted(rd) == [BASE, BASE + 6 * H]
    assert rd[BASE + 6 * H].monitored_pages == 256


def test_a_range_counts_as_accessed_when_it_read_so_in_half_the_snapshots() -> None:
    tally = access.AccessTally()
    flicker = [BASE + H]
    for i in range(4):
        regions = [(BASE, BASE + H, 5)]
        if i == 0:  # the cold range beside busy frames, once
            regions.append((flicker[0], flicker[0] + H, 1))
        else:
            regions.append((flicker[0], flicker[0] + H, 0))
        tally.add(access.readings_from_snapshot(snap(i, regions)))
    s = access.summarize(tally)
    assert s.monitored_bytes == 2 * H and s.accessed_bytes == H
    assert s.accessed_any_bytes == 2 * H  # the flicker counts only as an upper bound
    assert s.accessed_share == pytest.approx(0.5)


def test_skew_is_the_share_of_samples_on_the_hottest_ranges() -> None:
    assert access.top_share([10, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0.1) == 1.0
    assert access.top_share([1.0] * 10, 0.1) == pytest.approx(0.1)
    assert access.top_share([1.0] * 10, 0.5) == pytest.approx(0.5)
    assert access.top_share([0.0, 0.0], 0.5) is None
    assert access.top_share([3, 1], 0.1) == pytest.approx(0.75)  # at least one range


def test_the_dry_run_makes_the_recorded_hot_buffer_huge_and_not_the_cold_one() -> None:
    # the recorded passive run of test_policy_physical: 1 GiB hot, 3 GiB cold
    snaps, hot, cold = load()
    resident = {s: 512 for r in (hot, cold) for s in range(r.start, r.end, H)}
    made = choices.dry_run_policy(snaps, [hot, cold], resident, "passive")
    hot_share = sum(hot.start <= s < hot.end for s in made) * H / hot.size
    cold_share = sum(cold.start <= s < cold.end for s in made) * H / cold.size
    assert hot_share >= 0.3
    assert cold_share <= hot_share / 4


def test_the_dry_run_holds_sparse_ranges_back() -> None:
    hot = AddrRange(BASE, BASE + 8 * H)
    snaps = [snap(5.0 * i, [(hot.start, hot.end, 10)]) for i in range(6)]
    dense = choices.dry_run_policy(snaps, [hot], dict.fromkeys(range(BASE, hot.end, H), 512),
                                   "passive")
    sparse = choices.dry_run_policy(snaps, [hot], dict.fromkeys(range(BASE, hot.end, H), 32),
                                    "passive")
    assert dense == set(range(BASE, hot.end, H))
    assert sparse == set()


def test_the_access_summary_tells_the_recorded_hot_buffer_from_the_cold_one() -> None:
    snaps, hot, cold = load()
    tally = access.AccessTally()
    for s in snaps[-6:]:
        tally.add(access.readings_from_snapshot(s))
    seen = tally.per_mapping([hot, cold])
    assert seen[hot.start].accessed_bytes > 0.5 * hot.size
    assert seen[cold.start].accessed_bytes < 0.1 * cold.size
    s = access.summarize(tally)
    assert s.top10_share is not None and s.top10_share > 0.2  # 1 GiB of 4 holds the accesses


BUDDY = """\
Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3
Node 0, zone    DMA32      1      2      4      2      5      4      3      3      4      2    752
Node 0, zone   Normal      2   8826   4045   2910   1008    390    177     85     40     30    125
"""


def test_free_2mib_blocks_from_buddyinfo() -> None:
    # order 9 (2 MiB) and order 10 (4 MiB) blocks of all zones
    expect = (1 + 2 + 30) * H + (3 + 752 + 125) * 2 * H
    assert hazards.parse_buddyinfo(BUDDY, order=9, page_bytes=4096) == expect


def facts(**kw: object) -> hazards.Facts:
    base = dict(thp_enabled="madvise", defrag="defer", shmem_enabled="never",
                thp_disabled_by_process=False, shmem_rss_bytes=0, free_huge_bytes=1 << 40,
                memcg=None, memcg_headroom_bytes=None)
    return hazards.Facts(**{**base, **kw})  # type: ignore[arg-type]


def test_each_hazard_applies_only_when_its_setting_does() -> None:
    assert hazards.judge(facts(), 1, 100 * H, 100 * H) == []
    names = {h.name for h in hazards.judge(
        facts(thp_disabled_by_process=True, shmem_rss_bytes=512 * H, defrag="always",
              free_huge_bytes=10 * H, memcg="/sys/fs/cgroup/x", memcg_headroom_bytes=50 * H),
        1, 100 * H, 100 * H)}
    assert names == {"thp-disabled", "shmem-never", "defrag-stalls", "little-free-2m",
                     "memcg-limit"}
    for h in hazards.judge(facts(defrag="always"), 1, 0, 0):
        assert h.fix


def advice(added: int, rss: int, always_share: float | None, damon_share: float | None,
           **kw: object) -> verdict.Advice:
    g = growth.Growth(rss, 511, {k: growth.KindGrowth(k) for k in growth.KINDS}, [])
    g.kinds[growth.ANON].always_added_bytes = added
    cs = [choices.Choice("THP-always", H, added, always_share),
          choices.Choice("everywhere-collapse", H, added, always_share),
          choices.Choice("damon-hp", 0, 0, damon_share)]
    s = access.summarize(access.AccessTally())
    return verdict.Advice(1, ["x"], 30, {"name": "passive"}, g, s, cs, facts(**kw), [])


def test_verdicts() -> None:
    gib = 1 << 30
    assert "cheap" in advice(gib // 100, gib, 0.9, 0.1).verdict
    assert "Do not turn THP always on" in advice(gib // 2, gib, 0.9, 0.85).verdict
    assert "Keep THP-always off" in advice(gib // 2, gib, 0.9, 0.1).verdict
    assert "THP is off for this process" in advice(gib // 2, gib, 0.9, 0.9,
                                                   thp_disabled_by_process=True).verdict
    assert "saw no access" in advice(gib // 2, gib, None, None).verdict
    assert "changes little" in advice(gib // 100, gib, 0.05, 0.0).verdict
    nothing = advice(0, gib, 0.0, 0.0)
    nothing.choices[0] = choices.Choice("THP-always", 0, 0, 0.0)
    assert "would change nothing" in nothing.verdict


def test_the_report_carries_every_number_in_json_and_a_verdict_in_text() -> None:
    a = advice(1 << 28, 1 << 30, 0.9, 0.1)
    d = a.to_dict()
    assert d["memory"]["added_bytes"] == 1 << 28
    assert d["verdict"] == a.verdict
    assert [c["name"] for c in d["choices"]] == ["THP-always", "everywhere-collapse",
                                                 "damon-hp"]
    assert "Verdict: " in verdict.format_text(a)
