"""workloads/inputsets.py: (program, set, threads) -> the PARSEC command (spec A.3, B.2-B.5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
sys.path.insert(0, str(WORKLOADS))

import inputsets  # noqa: E402
import water_inputs  # noqa: E402

# Spec A.3, the runconf argument lists (k1 k2 d n chunksize clustersize), as written there.
PARSEC_STREAMCLUSTER = {
    "test": "2 5 1 10 10 5",
    "simdev": "3 10 3 16 16 10",
    "simsmall": "10 20 32 4096 4096 1000",
    "simmedium": "10 20 64 8192 8192 1000",
    "simlarge": "10 20 128 16384 16384 1000",
    "native": "10 20 128 1000000 200000 5000",
}


@pytest.mark.parametrize("program", ["streamcluster", "streamcluster-compact"])
@pytest.mark.parametrize("set_name", list(PARSEC_STREAMCLUSTER))
def test_streamcluster_sets_are_the_parsec_command_lines(tmp_path, program, set_name):
    spec = inputsets.command(program, set_name, 3, rundir=tmp_path)
    assert spec.argv[0] == str(WORKLOADS / "bin" / program)
    assert " ".join(spec.argv[1:]) == f"{PARSEC_STREAMCLUSTER[set_name]} none output.txt 3"
    assert spec.cwd == str(tmp_path.resolve()) and spec.stdin is None


@pytest.mark.parametrize("set_name,nmol,nstep", [
    ("test", 512, 3), ("simsmall", 512, 3), ("simmedium", 3375, 3), ("simlarge", 8000, 3),
])
def test_water_run_dir_has_ten_fields_with_threads_ninth(tmp_path, set_name, nmol, nstep):
    spec = inputsets.command("water_nsquared", set_name, 4, rundir=tmp_path)
    fields = Path(spec.stdin).read_text().split()
    assert len(fields) == 10
    assert float(fields[0]) == 1.5e-16
    assert [int(x) for x in fields[1:9]] == [nmol, nstep, 6, -1, 3000, 3, 0, 4]
    assert float(fields[9]) == 6.212752
    assert Path(spec.cwd, "random.in").exists()


def test_water_random_in_has_one_plus_nine_per_molecule_numbers_in_range(tmp_path):
    spec = inputsets.command("water_nsquared", "test", 1, rundir=tmp_path)
    lines = Path(spec.cwd, "random.in").read_text().splitlines()
    assert len(lines[0].split()) == 1
    assert all(len(line.split()) == 3 for line in lines[1:])
    values = [float(v) for line in lines for v in line.split()]
    assert len(values) == 1 + 9 * 512
    assert all(-4.0 <= v <= 4.0 for v in values)
    assert len(set(values)) == len(values)


def test_random_in_depends_on_seed_and_is_reproducible():
    assert inputsets.random_in_text(8, 1) == inputsets.random_in_text(8, 1)
    assert inputsets.random_in_text(8, 1) != inputsets.random_in_text(8, 2)


def test_input_set_tables_agree_with_water_inputs():
    assert {k: (v.nmol, v.nstep) for k, v in inputsets.WATER_SETS.items()} == \
        water_inputs.INPUT_SETS


def test_more_water_threads_than_molecules_is_refused(tmp_path):
    with pytest.raises(inputsets.InputSetError, match="1..512"):
        inputsets.command("water_nsquared", "simsmall", 513, rundir=tmp_path)


def test_run_args_prints_json_and_refuses_unknown_set(tmp_path):
    ok = subprocess.run([str(WORKLOADS / "run-args"), "water_nsquared", "simdev", "2",
                         "--rundir", str(tmp_path), "--json"],
                        capture_output=True, text=True, check=True)
    spec = json.loads(ok.stdout)
    assert spec["argv"][1:] == ["2"] and spec["stdin"] == str(tmp_path.resolve() / "input_2")
    bad = subprocess.run([str(WORKLOADS / "run-args"), "streamcluster", "huge"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
