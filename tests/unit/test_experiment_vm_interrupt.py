"""An experiment run in the test VM that is stopped by SIGTERM or Ctrl-C ends as interrupted,
with what finished copied back, instead of an error about the interruption."""

from __future__ import annotations

from pathlib import Path

import pytest
from damon_hp import testvm
from damon_hp.experiment import pipeline, spec


def experiment() -> spec.Experiment:
    return spec.parse({
        "experiment": {"name": "t", "repetitions": 1, "arms": ["thp-never"],
                       "memory": ["sufficient"]},
        "workloads": [{"program": "hotcold", "args": []}],
    })


@pytest.mark.parametrize("stop", [testvm.VmTerminated(15), KeyboardInterrupt()])
def test_a_vm_run_stopped_by_a_signal_is_an_interrupted_outcome(
        stop: BaseException, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run_in_vm(*_args: object, **_kw: object) -> None:
        raise stop

    monkeypatch.setattr(pipeline, "prepare_inputs", lambda exp: None)
    monkeypatch.setattr(testvm, "new_run_dir", lambda: tmp_path / "vm")
    monkeypatch.setattr(testvm, "run_in_vm", run_in_vm)
    out = tmp_path / "out"
    out.mkdir()
    outcome = pipeline.run_in_vm(experiment(), out, "2G")
    assert outcome.interrupted
    assert (outcome.planned, outcome.ran, outcome.errors) == (1, 0, [])
