"""workloads/water_inputs.py: the water_nsquared input files (spec B.2, B.3, B.5)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("water_inputs", ROOT / "workloads/water_inputs.py")
water_inputs = importlib.util.module_from_spec(_spec)
sys.modules["water_inputs"] = water_inputs
_spec.loader.exec_module(water_inputs)

# Spec B.3: NMOL and NSTEP per set; every set has the same other eight fields.
SETS = {"test": (512, 3), "simdev": (512, 3), "simsmall": (512, 3), "simmedium": (3375, 3),
        "simlarge": (8000, 3), "native": (32768, 7)}


@pytest.mark.parametrize("set_name", list(SETS))
def test_input_file_has_the_ten_parsec_fields_with_threads_ninth(tmp_path, set_name):
    info = water_inputs.generate(set_name, 3, tmp_path)
    text = Path(info["stdin"]).read_text()
    fields = text.split()
    nmol, nstep = SETS[set_name]
    assert fields == ["1.5e-16", str(nmol), str(nstep), "6", "-1", "3000", "3", "0", "3",
                      "6.212752"]
    assert len(text.splitlines()) == 3  # PARSEC's layout: 4 + 4 + 2 fields


def test_random_in_has_one_plus_nine_per_molecule_numbers_in_range(tmp_path):
    info = water_inputs.generate("test", 1, tmp_path)
    lines = Path(info["random_in"]).read_text().splitlines()
    assert len(lines[0].split()) == 1
    assert all(len(ln.split()) == 3 for ln in lines[1:])
    values = [float(v) for ln in lines for v in ln.split()]
    assert len(values) == 1 + 9 * 512
    assert all(-4.0 <= v <= 4.0 for v in values)
    # Spread over the whole interval, as the SPLASH README asks of extra numbers.
    assert min(values) < -3.9 and max(values) > 3.9
    assert all("e" in tok and len(tok.split("e")[0].split(".")[1]) == 18
               for tok in lines[1].split())


def test_random_in_depends_only_on_seed_and_is_a_prefix_across_sets():
    small = water_inputs.random_in_text(512)
    large = water_inputs.random_in_text(3375)
    assert large.startswith(small)
    assert water_inputs.random_in_text(512, seed=2) != small
    assert water_inputs.random_in_text(512) == small


@pytest.mark.parametrize(("set_name", "threads"), [("test", 0), ("test", 513), ("native", 1025),
                                                   ("huge", 1)])
def test_impossible_set_or_thread_count_is_refused_with_exit_2(tmp_path, capsys, set_name,
                                                                threads):
    assert water_inputs.main([set_name, str(threads), str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("water_inputs: ")
    assert not any(tmp_path.iterdir())


def test_cli_prints_one_json_line_naming_the_files(tmp_path, capsys):
    assert water_inputs.main(["simdev", "2", str(tmp_path / "run")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["nmol"] == 512 and info["threads"] == 2
    assert Path(info["stdin"]) == (tmp_path / "run" / "input_2").resolve()
    assert Path(info["random_in"]).parent == Path(info["cwd"])
