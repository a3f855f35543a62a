"""workloads/README.md's footprint table against workloads-spec.md's formulas (A.16, B.18).

The reference numbers below are the spec's own published figures (its footprint tables), not
outputs of the code under test: the formulas must reproduce them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
sys.path.insert(0, str(WORKLOADS))

import footprints  # noqa: E402
import inputsets  # noqa: E402

MIB = 1 << 20


def test_readme_footprint_table_is_the_generated_one():
    section = footprints.readme_section((WORKLOADS / "README.md").read_text())
    assert section is not None, "README.md lost its footprints markers"
    assert section == footprints.render_tables(), (
        "workloads/README.md is stale: run python3 workloads/footprints.py --write")


# Spec A.16, streamcluster native: exact byte counts.
def test_streamcluster_native_arrays_match_spec_bytes():
    f = footprints.streamcluster("native")
    assert (f.block, f.points, f.center_block, f.center_ids) == (
        102_400_000, 6_400_000, 2_560_000, 5_120_000)
    assert f.chunk_arrays == 200_000 + 200_000 + 800_000


# Spec A.16 "sum of the long-lived arrays" column, as printed there.
@pytest.mark.parametrize("set_name,printed", [
    ("simsmall", "1.05"), ("simmedium", "3.06"), ("simlarge", "10.09"), ("native", "112.38"),
])
def test_streamcluster_long_lived_sum_matches_spec(set_name, printed):
    assert f"{footprints.streamcluster(set_name).long_lived / MIB:.2f}" == printed


def test_streamcluster_test_set_long_lived_is_640_bytes():
    assert footprints.streamcluster("test").long_lived == 640


# Spec B.18: VAR and PFORCES per thread in bytes, and "total touched" for P = 1, 2, 4, 8 in MiB.
@pytest.mark.parametrize("set_name,var,pforces,touched", [
    ("simsmall", 344_064, 69_632, ("0.41", "0.48", "0.61", "0.88")),
    ("simmedium", 2_268_000, 459_000, ("2.73", "3.17", "4.04", "5.79")),
    ("simlarge", 5_376_000, 1_088_000, ("6.47", "7.51", "9.58", "13.73")),
    ("native", 22_020_096, 4_456_448, ("26.50", "30.75", "39.25", "56.25")),
])
def test_water_footprint_matches_spec_table(set_name, var, pforces, touched):
    w = footprints.water(set_name)
    assert (w.var, w.pforces_per_thread) == (var, pforces)
    assert tuple(f"{w.touched(p) / MIB:.2f}" for p in (1, 2, 4, 8)) == touched


def _table_rows(header_start: str) -> dict[str, list[str]]:
    text = (WORKLOADS / "README.md").read_text()
    lines = text[text.index(header_start):].splitlines()
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def _bytes(cell: str) -> int:
    """'524 288 (512.0 KiB)' or '40 B' -> the exact byte count printed first."""
    return int(re.match(r"[\d ]+", cell).group(0).replace(" ", ""))


def test_readme_streamcluster_cells_follow_the_formulas():
    rows = _table_rows("| set | C × d, Z |")
    assert set(rows) == set(inputsets.SET_NAMES)
    for name, s in inputsets.STREAMCLUSTER_SETS.items():
        c, d, z = s.chunksize, s.d, s.clustersize
        cells = rows[name]
        assert [_bytes(x) for x in cells[2:9]] == [
            4 * c * d, 32 * c, 4 * z * d, 8 * z * d, 32 * z, 6 * c,
            4 * c * d + 32 * c + 4 * z * d + 8 * z * d + 32 * z + 6 * c,
        ], name


def test_readme_water_cells_follow_the_formulas():
    rows = _table_rows("| set | NMOL | VAR |")
    assert set(rows) == set(inputsets.SET_NAMES)
    for name, ws in inputsets.WATER_SETS.items():
        n = ws.nmol
        cells = rows[name]
        assert int(cells[1]) == n
        assert [_bytes(x) for x in cells[2:5]] == [672 * n, 40 * min(n, 65536) + 800, 136 * n]
        touched = [float(x) for x in cells[5:9]]
        expect = [(672 * n + 40 * min(n, 65536) + 800 + p * 136 * n) / MIB for p in (1, 2, 4, 8)]
        assert touched == pytest.approx(expect, abs=0.005), name
