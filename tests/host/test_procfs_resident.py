"""Resident pages per 2 MiB range (the residency guard's input) against a real process here.

workloads/bin/sparse writes every page of its hot region and one page per --stride of its
sparse region; the counts must say exactly that, by PAGEMAP_SCAN and by the pagemap read that
stands in for it before 6.7. And the guard's premise, seen for real: MADV_COLLAPSE of a range a
quarter resident makes all of it resident. Only the child's memory changes; nothing global.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from collapse_errors import until_settled
from damon_hp import actuate, procfs
from damon_hp.ranges import HUGE_PAGE_BYTES as H

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
SPARSE = WORKLOADS / "bin" / "sparse"
PAGES = H // 4096


@pytest.fixture(scope="module")
def sparse() -> Iterator[dict]:
    r = subprocess.run(["make", "-s", "-C", str(WORKLOADS)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    proc = subprocess.Popen([str(SPARSE), "--hot", "4M", "--cold", "2M", "--sparse", "8M",
                             "--stride", "16K", "--seconds", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.communicate()[1]
        yield json.loads(line)
    finally:
        proc.kill()
        proc.communicate()


def starts(r: dict) -> list[int]:
    return list(range(r["start"], r["end"], H))


def test_counts_are_the_touched_pages_of_each_range(sparse: dict) -> None:
    hot, sp = starts(sparse["hot"]), starts(sparse["sparse"])
    counts = procfs.resident_pages_in(sparse["pid"], hot + sp)
    assert [counts[s] for s in hot] == [PAGES] * len(hot)
    assert [counts[s] for s in sp] == [H // (16 << 10)] * len(sp)  # one page per 16 KiB


def test_the_pagemap_read_without_pagemap_scan_counts_the_same(sparse: dict, monkeypatch) -> None:
    ranges = starts(sparse["hot"]) + starts(sparse["sparse"]) + starts(sparse["cold"])
    with procfs.ProcessFiles(sparse["pid"]) as files:
        scanned = files.resident_pages(ranges)

        def unsupported(*args, **kwargs):
            raise procfs.PagemapScanUnsupported("pretend: before 6.7")
            yield  # a generator, as the real one

        monkeypatch.setattr(procfs, "pagemap_scan", unsupported)
        read = files.resident_pages(ranges)
    assert read == scanned


def test_a_range_outside_every_mapping_has_no_resident_pages(sparse: dict) -> None:
    low = H  # [2 MiB, 4 MiB): below where x86-64 Linux places programs and mmaps
    maps = procfs.read_maps(sparse["pid"])
    assert not any(m.start < low + H and low < m.end for m in maps)
    assert procfs.resident_pages_in(sparse["pid"], [low]) == {low: 0}


def test_collapsing_a_quarter_resident_range_makes_all_of_it_resident(sparse: dict) -> None:
    """Why the guard exists: MADV_COLLAPSE ignores max_ptes_none."""
    target_range = starts(sparse["sparse"])[-1]
    before = procfs.read_status(sparse["pid"]).vm_rss
    with actuate.Target.open(sparse["pid"]) as target:
        (result,) = until_settled(lambda s: actuate.collapse(target, s), [target_range])
    assert result.error is None, result
    assert procfs.resident_pages_in(sparse["pid"], [target_range]) == {target_range: PAGES}
    grown = procfs.read_status(sparse["pid"]).vm_rss - before
    assert grown >= (PAGES - H // (16 << 10)) * 4096
