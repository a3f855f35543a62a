"""Result files: a directory written before the arms were named ("policy" in each run file)
still loads and resumes."""

from __future__ import annotations

import json

from damon_hp.experiment import spec
from damon_hp.experiment.context import Context, is_done
from damon_hp.experiment.results import RunResult, load_runs, run_path, save_run


def _experiment() -> spec.Experiment:
    return spec.parse({
        "experiment": {"name": "t", "repetitions": 1, "arms": ["thp-never", "thp-always"]},
        "workloads": [{"program": "hotcold", "args": []}],
    })


def test_a_run_file_that_says_policy_loads_with_its_arm(tmp_path):
    cell = spec.expand(_experiment())[0][0]
    new = RunResult(cell_id=cell.id, workload="hotcold", program="hotcold", input=None,
                    threads=1, arm=cell.arm, memory="sufficient", rep=0, wall_s=1.0)
    old = new.to_dict()
    old["policy"] = old.pop("arm")
    path = run_path(tmp_path, cell.id)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))
    assert load_runs(tmp_path) == [new]
    assert is_done(Context(_experiment(), tmp_path), cell)


def test_a_run_file_is_written_with_its_arm(tmp_path):
    r = RunResult(cell_id="c", workload="w", program="w", input=None, threads=1,
                  arm="oracle", memory="sufficient", rep=0)
    data = json.loads(save_run(tmp_path, r).read_text())
    assert data["arm"] == "oracle" and "policy" not in data
