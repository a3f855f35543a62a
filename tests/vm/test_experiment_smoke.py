"""The smoke experiment, end to end inside the test VM: every arm runs, result files are
written, ratios are computed (or explicitly undefined), figures are readable PNGs, and nothing
is left behind (cgroups, kdamonds, swap, THP mode)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from damon_hp.experiment.measure import kdamond_pids

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "smoke.toml"
DAMON_HP = str(Path(sys.executable).parent / "damon-hp")
CGROUP_PARENT = Path("/sys/fs/cgroup/damon-hp-experiment")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# The runner's smoke runs on 6.12: in the first fresh-clone run of the full plan (2026-11-26)
# the 7.3 guest ended silently (no panic on the console, the test script's exit code never
# written) during the thp-always cell with insufficient memory (memory.max 20 MiB, zram swap),
# taking every later 7.3 test with it; it passed on 7.3 in a run by hand the same day, and
# quick.toml's same cells passed twice there. Not understood yet: 7.3's own arms (damos-collapse,
# DAMON_STAT) are covered by test_collapse_actuators.py, test_damon_stat.py and quick.toml.
pytestmark = pytest.mark.lts_only("7.3 guest ended during the insufficient-memory thp-always "
                                  "cell once; see above")


def _thp_mode() -> str:
    return next(w[1:-1] for w in THP.read_text().split() if w.startswith("["))


def _running_kdamonds() -> list[str]:
    # The pid file, not `state`: reading `state` fails with EBUSY while a kdamond starts.
    return sorted(kdamond_pids())


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict:
    # Under the VM's shared run directory when there is one: kept for reading on the host.
    shared = os.environ.get("DAMON_HP_VM_RUN_DIR")
    out = Path(shared) / "smoke-experiment" if shared else tmp_path_factory.mktemp("smoke")
    before = {"thp": _thp_mode(), "swaps": Path("/proc/swaps").read_text()}
    t = time.monotonic()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with open(out / "progress.log", "w") as progress:
        proc = subprocess.run([DAMON_HP, "experiment", "run", str(SMOKE), "--out", str(out),
                               "--json"], stdout=subprocess.PIPE, stderr=progress, text=True,
                              timeout=1200, check=False)
    proc.stderr = (out / "progress.log").read_text()
    elapsed = time.monotonic() - t
    # The duration is reported, not asserted (timings swing): it shows in the test output.
    print(f"smoke experiment took {elapsed:.0f} s inside the VM")
    return {"out": out, "proc": proc, "before": before, "elapsed": elapsed}


def test_smoke_runs_every_cell_without_runner_errors(smoke):
    proc = smoke["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["errors"] == []
    assert summary["ran_now"] == summary["planned"] == summary["runs"]
    rows = list(csv.DictReader(open(smoke["out"] / "results.csv")))
    assert len(rows) == summary["planned"]
    arms = {r["arm"] for r in rows}
    assert arms == {"thp-never", "thp-always", "thp-madvise", "damos-ethp", "damon-hp",
                        "oracle"}
    assert {r["memory"] for r in rows} == {"sufficient", "insufficient"}
    env = json.loads((smoke["out"] / "environment.json").read_text())
    assert env["where"] == "vm"


def test_smoke_measures_the_workloads(smoke):
    rows = list(csv.DictReader(open(smoke["out"] / "results.csv")))
    for r in rows:
        if r["status"] != "ok":
            continue
        assert float(r["wall_s"]) > 0
        assert int(r["peak_rss_bytes"]) > 0
        assert r["accounting"] == "cgroup"
        assert r["dtlb_load_misses"] == ""  # no PMU in the VM: empty, never 0
    hot = [r for r in rows if r["program"] == "hotcold" and r["status"] == "ok"]
    assert all(float(r["ns_per_op"]) > 0 for r in hot)
    # thp-always backs the hot range with huge pages; thp-never does not
    always = [r for r in hot if r["arm"] == "thp-always" and r["memory"] == "sufficient"]
    never = [r for r in hot if r["arm"] == "thp-never" and r["memory"] == "sufficient"]
    assert always and all(float(r["hot_huge_fraction_final"]) >= 0.9 for r in always)
    assert never and all(float(r["hot_huge_fraction_final"]) == 0 for r in never)
    limited = [r for r in rows if r["memory"] == "insufficient"]
    assert limited and all(int(r["memory_max_bytes"]) > 0 for r in limited)


def test_smoke_computes_every_ratio_or_says_why_not(smoke):
    analysis = json.loads((smoke["out"] / "analysis.json").read_text())
    groups = analysis["groups"]
    assert {(g["workload"], g["memory"]) for g in groups} == {
        ("hotcold", "sufficient"), ("hotcold", "insufficient"),
        ("streamcluster-test", "sufficient")}
    for g in groups:
        for p in g["arms"].values():
            for ratio in (p["speedup_preserved"], p["overhead_removed"],
                          p["vs_never"]["runtime_s"]):
                assert (ratio["value"] is None) != (ratio["undefined"] is None)
    hot = next(g for g in groups if g["workload"] == "hotcold" and g["memory"] == "sufficient")
    assert hot["arms"]["thp-never"]["vs_never"]["runtime_s"]["value"] == pytest.approx(1.0)


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG whose every chunk's CRC is right (a complete, readable file);
    checked with the standard library, as importing matplotlib again costs a minute here."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    pos, chunks, size = 8, [], (0, 0)
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path.name}: bad {kind!r} chunk"
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        chunks.append(kind)
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks
    return size


def test_smoke_report_and_figures_are_readable(smoke):
    report = (smoke["out"] / "report.md").read_text()
    assert "emulated CPU" in report
    assert "## Headline" in report
    pngs = sorted((smoke["out"] / "plots").glob("*.png"))
    assert len(pngs) >= 6
    for p in pngs:
        assert f"plots/{p.name}" in report
        width, height = _png_size(p)
        assert width > 300 and height > 200


def test_smoke_leaves_nothing_behind(smoke):
    assert not CGROUP_PARENT.exists()
    assert _running_kdamonds() == []
    assert _thp_mode() == smoke["before"]["thp"]
    assert Path("/proc/swaps").read_text() == smoke["before"]["swaps"]
    assert not [p for p in os.listdir("/proc") if p.isdigit()
                and "workloads/bin/" in _cmdline(p)]


def test_smoke_rerun_resumes_instead_of_running_again(smoke):
    proc = subprocess.run([DAMON_HP, "experiment", "run", str(SMOKE), "--out",
                           str(smoke["out"]), "--dry-run", "--json"],
                          capture_output=True, text=True, timeout=300, check=True)
    summary = json.loads(proc.stdout)
    assert summary["finished"] == summary["planned"]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
