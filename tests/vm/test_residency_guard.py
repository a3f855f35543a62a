"""The residency guard end to end on a real DAMON (inside the test VM, THP `never`).

workloads/bin/sparse with --stride 16K holds one resident page per 16 KiB of its sparse region
(a quarter of each 2 MiB range, below the default max_ptes_none's half), and --retouch-seconds
0.01 reads every one of those pages every 10 ms: DAMON calls the sparse region hot (a quarter of
its samples land on a page read since the last sample). Collapsed, each of its 2 MiB ranges
would become fully resident. The agent must collapse the dense hot region and leave the sparse
one on 4 KiB pages: read back from /proc/PID/smaps and smaps_rollup during the run, and the
agent's timeline must show that ranges were held by the guard (the hot and cold regions are
fully resident, so every held range is a sparse one: the guard, not DAMON, kept it small).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from damon_hp import procfs
from damon_hp.ranges import AddrRange
from leftovers import running_kdamonds

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = str(ROOT / ".venv/bin/damon-hp")
SPARSE = str(ROOT / "workloads/bin/sparse")
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
PAGE = 4096
HOT_SHARE = 0.90
# A collapse of one sparse range adds 2 MiB - 512 KiB of resident memory; the whole process
# may grow by less than one such collapse (stacks, the C library's buffers).
RSS_SLACK = 1 << 20


@pytest.fixture(autouse=True)
def thp_never() -> Iterator[None]:
    """THP `never` for the test, restored afterwards. Only ever inside the VM."""
    old = procfs.thp_mode()
    THP_ENABLED.write_text("never")
    yield
    THP_ENABLED.write_text(old)


def test_a_hot_but_sparse_region_stays_on_base_pages_and_rss_does_not_grow(tmp_path) -> None:
    assert running_kdamonds() == {}, "a kdamond was running before the test"
    out = tmp_path / "out.json"
    proc = subprocess.Popen(
        [DAMON_HP, "run", "-q", "--json", str(out), "--", SPARSE, "--hot", "64M", "--cold",
         "16M", "--sparse", "32M", "--stride", "16K", "--retouch-seconds", "0.01",
         "--seconds", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples = []
    try:
        first = json.loads(proc.stdout.readline())
        pid = first["pid"]
        hot = AddrRange(first["hot"]["start"], first["hot"]["end"])
        sparse = AddrRange(first["sparse"]["start"], first["sparse"]["end"])
        touched = first["sparse"]["touched_pages"] * PAGE
        base_rss = procfs.smaps_rollup(pid)["Rss"]
        while proc.poll() is None:
            try:
                maps = procfs.read_smaps(pid)
                rollup = procfs.smaps_rollup(pid)
            except procfs.ProcessGone:
                break
            if not any(m.start <= sparse.start < m.end for m in maps):
                break  # exiting: the regions are being unmapped
            s = procfs.smaps_in_ranges(maps, [sparse])
            h = procfs.smaps_in_ranges(maps, [hot])
            samples.append((s.rss_bytes, s.anon_huge_bytes, rollup["Rss"], h.anon_huge_bytes))
            time.sleep(1.0)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert len(samples) >= 10, f"too few samples while the workload ran: {samples}"
    table = "\n".join(f"{a >> 10} kB sparse rss, {b >> 10} kB sparse huge, {c >> 10} kB rss, "
                      f"{d >> 10} kB hot huge" for a, b, c, d in samples)
    assert all(huge == 0 for _, huge, _, _ in samples), f"sparse range collapsed:\n{table}"
    assert all(rss == touched for rss, _, _, _ in samples), f"sparse region grew:\n{table}"
    assert all(rss <= base_rss + RSS_SLACK for _, _, rss, _ in samples), (
        f"process RSS grew from {base_rss >> 10} kB:\n{table}")
    # The guard did not hold dense memory back: the hot region went huge during the run.
    assert max(h for *_, h in samples) >= HOT_SHARE * hot.size, table
    timeline = json.loads(out.read_text())["timeline"]
    held = [e["actions"]["held_by_residency"] for e in timeline]
    assert max(held) > 0, f"DAMON never made a sparse range ready, so nothing was tested:\n{err}"
    assert running_kdamonds() == {}, "the run left a kdamond running"
