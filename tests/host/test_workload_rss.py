"""Real peak RSS of streamcluster and water_nsquared against workloads-spec.md's footprint formulas.

The formulas (workloads/footprints.py, "touched") give the bytes a run makes resident above the
process baseline. The baseline (libc, stacks, malloc arenas) is measured, not assumed: it is the
peak RSS of the same program with the same thread count on the `test` set, so what is compared
is the growth from `test` to a larger set.

Tolerance: measured growth = formula growth +- (0.5 MiB + 10 %). 0.5 MiB covers page rounding of
a dozen allocations and the run-to-run noise seen here (the `test` set alone varies by about
0.3 MiB between runs; each figure is a median of 5); 10 % covers what the formula leaves out (the
centre rows, work arrays). A missing or doubled array of the largest kind (streamcluster's
coordinate block, water's VAR) is well outside it.

Peak RSS is GNU time's %M (the exec'd program's own high-water mark); wait4 from this Python
process would report Python's RSS from before the exec.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
sys.path.insert(0, str(WORKLOADS))

import footprints  # noqa: E402
import inputsets  # noqa: E402

KIB = 1024
MIB = 1 << 20
THREADS = 2
RUNS = 5
GNU_TIME = "/usr/bin/time"

CASES = [
    ("streamcluster", "simsmall"),
    ("streamcluster", "simmedium"),
    ("streamcluster-compact", "simsmall"),
    ("streamcluster-compact", "simmedium"),
    ("water_nsquared", "simsmall"),
    ("water_nsquared", "simmedium"),
]


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    r = subprocess.run(["make", "-s", "-C", str(WORKLOADS)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"make -C workloads failed:\n{r.stdout}{r.stderr}")
    if not Path(GNU_TIME).exists():
        pytest.fail(f"{GNU_TIME} (Debian package 'time') is not installed: it measures peak "
                    "RSS; run `make setup`")


def touched(program: str, set_name: str) -> int:
    if program.startswith("streamcluster"):
        return footprints.streamcluster(set_name).touched
    return footprints.water(set_name).touched(THREADS)


def peak_rss(program: str, set_name: str, rundir: Path) -> int:
    """Median over RUNS of the program's peak RSS in bytes on `set_name`."""
    spec = inputsets.command(program, set_name, THREADS, rundir=rundir / set_name)
    values = []
    for i in range(RUNS):
        out = rundir / f"{set_name}.{i}.time"
        stdin = open(spec.stdin, "rb") if spec.stdin else subprocess.DEVNULL
        try:
            r = subprocess.run([GNU_TIME, "-f", "%M", "-o", str(out), *spec.argv], cwd=spec.cwd,
                               stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               timeout=300)
        finally:
            if spec.stdin:
                stdin.close()
        assert r.returncode == 0, f"{spec.shell_line()} failed:\n{r.stderr.decode()[-2000:]}"
        values.append(int(out.read_text().split()[-1]) * KIB)
    return int(statistics.median(values))


@pytest.mark.parametrize("program,set_name", CASES)
def test_peak_rss_growth_from_test_set_matches_footprint_formula(tmp_path, program, set_name):
    if not (WORKLOADS / "bin" / program).exists():
        pytest.fail(f"workloads/bin/{program} is missing: run `make setup` (make -C workloads)")
    expected = touched(program, set_name) - touched(program, "test")
    measured = peak_rss(program, set_name, tmp_path) - peak_rss(program, "test", tmp_path)
    tolerance = MIB // 2 + expected // 10
    assert abs(measured - expected) <= tolerance, (
        f"{program} {set_name} -p {THREADS}: peak RSS grew by {measured / MIB:.2f} MiB over the "
        f"test set, the formula says {expected / MIB:.2f} MiB (+- {tolerance / MIB:.2f})")


def test_gnu_time_reports_a_known_allocation(tmp_path):
    # The instrument itself: a process that touches 64 MiB must show at least that much.
    out = tmp_path / "t"
    py = shutil.which("python3") or sys.executable
    subprocess.run([GNU_TIME, "-f", "%M", "-o", str(out), py, "-c",
                    "b = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1"],
                   check=True)
    assert int(out.read_text().split()[-1]) * KIB >= 64 * MIB
