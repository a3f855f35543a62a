"""experiments/cost-phases.py on a recorded `damon-hp run --json` (its fixture's `note` says how
it was made): the three parts add up to the run's monitoring CPU, and bad input is refused."""

from __future__ import annotations

import copy
import importlib.util
import json
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/run-cost-hotcold-1g-3g-host-6.18.json"
_spec = importlib.util.spec_from_file_location("cost_phases", ROOT / "experiments/cost-phases.py")
assert _spec is not None and _spec.loader is not None
cost_phases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cost_phases)


@pytest.fixture(scope="module")
def run() -> dict:
    return json.loads(FIXTURE.read_text())


def test_start_up_until_steady_and_steady_add_up_to_the_monitoring_cpu(run: dict) -> None:
    p = cost_phases.phases(run, 60.0)
    st = p["steady"]
    total = p["start_up_and_rest_s"] + sum(p["until_steady"]["by_stage_s"].values()) + st["cpu_s"]
    assert total == pytest.approx(run["summary"]["monitoring_cpu_s"], abs=2e-3)
    assert p["until_steady"]["snapshots"] + st["snapshots"] == len(run["timeline"])
    assert all(e["t_s"] >= 60 for e in run["timeline"][-st["snapshots"]:])
    # Each stage's part before steady is its CPU at the last snapshot before 60 s.
    last_early = run["timeline"][p["until_steady"]["snapshots"] - 1]["stage_cpu_by_stage_s"]
    assert p["until_steady"]["by_stage_s"] == pytest.approx(last_early, abs=1e-3)
    # The steady share is its CPU over the stretch it covers, a 5-s aggregation each.
    span = run["timeline"][-1]["t_s"] - run["timeline"][-st["snapshots"] - 1]["t_s"]
    assert st["pct_of_core"] == pytest.approx(100 * st["cpu_s"] / span, abs=1e-3)
    dearest = st["dearest"]
    assert len(dearest) == cost_phases.DEAREST
    assert [d["ms"] for d in dearest] == sorted((d["ms"] for d in dearest), reverse=True)


def test_a_steady_start_past_the_run_leaves_every_snapshot_before_it(run: dict) -> None:
    p = cost_phases.phases(run, 1e6)
    assert p["steady"] is None
    assert p["until_steady"]["snapshots"] == len(run["timeline"])
    assert p["until_steady"]["by_stage_s"] == pytest.approx(
        run["summary"]["monitoring_cpu_by_stage"], abs=1e-3)


def test_a_run_made_before_the_timeline_had_stages_is_refused(run: dict, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture
                                                             ) -> None:
    old = copy.deepcopy(run)
    for e in old["timeline"]:
        del e["stage_cpu_by_stage_s"]
    with pytest.raises(cost_phases.NoStageTimeline):
        cost_phases.phases(old, 60.0)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert cost_phases.main([str(path)]) == 1
    assert "stage_cpu_by_stage_s" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    assert cost_phases.main([str(tmp_path / "bad.json")]) == 1
    assert cost_phases.main([str(tmp_path / "missing.json")]) == 1
    (tmp_path / "other.json").write_text(json.dumps({"runs": []}))
    assert cost_phases.main([str(tmp_path / "other.json")]) == 1
    assert "not the --json of `damon-hp run`" in capsys.readouterr().err


def test_the_text_and_json_outputs_name_every_stage(run: dict, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert cost_phases.main([str(path)]) == 0
    text = capsys.readouterr().out
    for stage in run["summary"]["monitoring_cpu_by_stage"]:
        assert stage in text
    assert "start-up and the rest" in text and "dearest" in text
    assert cost_phases.main([str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[str(path)] == cost_phases.phases(run, 60.0)


def test_the_steady_sizes_are_the_medians_of_the_steady_snapshots_and_absent_in_older_runs(
        run: dict) -> None:
    p = cost_phases.phases(run, 60.0)
    assert "source_regions" not in run["timeline"][0]  # recorded before the field existed
    assert p["steady"]["median_source_regions"] is None
    assert "regions from DAMON" not in cost_phases.describe("old", p)
    sized = copy.deepcopy(run)
    for k, e in enumerate(sized["timeline"]):
        e["source_regions"], e["frame_extents"] = 1000 + 10 * k, 30000 - k
    steady = [e for e in sized["timeline"] if e["t_s"] >= 60]
    p = cost_phases.phases(sized, 60.0)["steady"]
    assert p["median_source_regions"] == statistics.median(e["source_regions"] for e in steady)
    assert p["median_frame_extents"] == statistics.median(e["frame_extents"] for e in steady)
    text = cost_phases.describe("new", cost_phases.phases(sized, 60.0))
    assert f"regions from DAMON {p['median_source_regions']:.0f}" in text
