"""The whole job behind `damon-hp experiment run`: run the matrix here or inside the test VM,
then turn the result files into tables, analysis, figures and report.md.

In the VM the project tree is read-only, so a VM run writes into the VM's shared run directory
(treating the host's output directory as read-only previous results, for resumption) and the
host copies the new results back, also after Ctrl-C. Figures and the report are always drawn
where this command was started (on the host for VM runs: matplotlib under emulation is slow).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.experiment import environment, spec
from damon_hp.experiment.analysis import Analysis, analyse
from damon_hp.experiment.results import load_runs, write_json_atomic, write_tables
from damon_hp.experiment.runner import ERROR, Outcome, run_experiment
from damon_hp.experiment.writeup import ReportInput, render

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SPEC_COPY = "experiment.toml"


def default_out(exp: spec.Experiment) -> Path:
    if environment.in_vm():
        import os

        base = Path(os.environ.get("DAMON_HP_VM_RUN_DIR", "/tmp")) / "experiments"
        return base / exp.name
    return PROJECT_ROOT / "experiments" / "results" / exp.name


def prepare_out(exp_path: Path, out: Path, command: str) -> spec.Experiment:
    exp = spec.load(exp_path)
    out.mkdir(parents=True, exist_ok=True)
    copy = out / SPEC_COPY
    if copy.resolve() != exp_path.resolve():
        shutil.copyfile(exp_path, copy)
    (out / "command.txt").write_text(command + "\n")
    return exp


def run_here(exp: spec.Experiment, out: Path, previous: list[Path]) -> Outcome:
    if not (out / "environment.json").exists():
        write_json_atomic(out / "environment.json", environment.capture())
    return run_experiment(exp, out, previous)


def _copy_back(stage: Path, out: Path) -> int:
    """Copy a VM stage's results into `out`; returns the number of run records copied."""
    n = 0
    runs = stage / "runs"
    if runs.is_dir():
        (out / "runs").mkdir(parents=True, exist_ok=True)
        for p in runs.iterdir():
            if p.is_dir():
                shutil.copytree(p, out / "runs" / p.name, dirs_exist_ok=True, symlinks=True)
            elif p.suffix == ".json":
                shutil.copyfile(p, out / "runs" / p.name)
                n += 1
    limits: dict[str, Any] = {}
    for d in (out, stage):
        p = d / "limits.json"
        if p.exists():
            limits.update(json.loads(p.read_text()))
    if limits:
        write_json_atomic(out / "limits.json", limits)
    env = stage / "environment.json"
    if env.exists() and not (out / "environment.json").exists():
        shutil.copyfile(env, out / "environment.json")
    return n


def prepare_inputs(exp: spec.Experiment) -> None:
    """Generate the workloads' shared input files (water_nsquared's random.in) here, where the
    tree is writable: inside the VM workloads/inputs/generated/ is read-only."""
    import tempfile

    from damon_hp.experiment import workloads

    cells, _ = spec.expand(exp)
    seen = set()
    with tempfile.TemporaryDirectory(prefix="damon-hp-inputs-") as tmp:
        for c in cells:
            key = (workloads.program_for(c.workload, c.arm), c.workload.input, c.threads)
            if c.workload.input is None or key in seen:
                continue
            seen.add(key)
            workloads.resolve(c.workload, c.threads, c.arm, Path(tmp) / str(len(seen)))


def run_in_vm(exp: spec.Experiment, out: Path, vm_memory: str) -> Outcome:
    """Boot the test VM, run the experiment inside, copy the results back (also on Ctrl-C)."""
    from damon_hp import testvm

    prepare_inputs(exp)

    run_dir = testvm.new_run_dir()
    stage = run_dir / "experiment"
    cmd = [str(testvm.VENV_BIN / "damon-hp"), "experiment", "run", str(out / SPEC_COPY),
           "--out", str(stage), "--previous", str(out), "--no-report", "--where", "vm"]
    print(f"damon-hp experiment: running inside the test VM (QEMU TCG, ~25x slower than the "
          f"host); VM run directory {run_dir}", file=sys.stderr)
    interrupted = False
    try:
        result = testvm.run_in_vm(cmd, memory=vm_memory, timeout_s=None, stdout=sys.stderr,
                                  stderr=sys.stderr, run_dir=run_dir)
    except (KeyboardInterrupt, testvm.VmTerminated):  # Ctrl-C or SIGTERM: the VM is gone
        interrupted = True
        result = None
    finally:
        copied = _copy_back(stage, out)
    if result is not None and result.vm_failed:
        raise DamonHpError(f"damon-hp experiment: {result.failure_text()}\n"
                           f"({copied} finished runs were kept in {out})")
    # 0: done; 1: done, but some runs could not run (listed below); 130: interrupted.
    if result is not None and result.exit_code not in (0, 1, 130):
        raise DamonHpError(f"damon-hp experiment: the run inside the VM failed with exit code "
                           f"{result.exit_code} (its output is above; {copied} finished runs "
                           f"were kept in {out})")
    planned = len(spec.expand(exp)[0])
    errors = [f"{r.cell_id}: {'; '.join(r.notes)}" for r in load_runs(out) if r.status == ERROR]
    return Outcome(planned, copied, interrupted or (result is not None
                                                    and result.exit_code == 130), 0.0, errors)


def _check_programs(exp: spec.Experiment) -> None:
    from damon_hp.experiment import workloads

    cells, _ = spec.expand(exp)
    missing = workloads.check_built({workloads.program_for(c.workload, c.arm) for c in cells
                                     if not c.workload.app})
    if missing:
        known = sorted(p.name for p in workloads.BIN_DIR.iterdir()) \
            if workloads.BIN_DIR.is_dir() else []
        raise EnvironmentProblem(
            f"experiment file {exp.source}: no program {', '.join(missing)} in "
            f"{workloads.BIN_DIR} (built: {', '.join(known) or 'none'}); fix the name, or run "
            "`make workloads` if it is one of the project's workloads/src")


def run(exp_path: Path, out: Path | None, where: str | None, command: str,
        previous: list[Path], vm_memory: str) -> tuple[spec.Experiment, Path, Outcome]:
    exp = spec.load(exp_path)
    _check_programs(exp)  # before the output directory or a VM exists
    out = out or default_out(exp)
    exp = prepare_out(exp_path, out, command)
    where = where or exp.where
    if where == "vm" and not environment.in_vm():
        return exp, out, run_in_vm(exp, out, vm_memory)
    if where == "host" and environment.in_vm():
        raise EnvironmentProblem('where = "host" but this is the test VM; use --where vm')
    return exp, out, run_here(exp, out, previous)


@dataclass
class Finalized:
    analysis: Analysis
    report: Path
    figures_error: str | None
    runs: int


def finalize(out: Path, elapsed_s: float | None = None) -> Finalized:
    """Tables, analysis.json, figures and report.md from the result files in `out`."""
    copy = out / SPEC_COPY
    if not copy.exists():
        raise EnvironmentProblem(f"{out} is not an experiment directory ({SPEC_COPY} missing); "
                                 "give the --out directory of an experiment run")
    exp = spec.load(copy)
    cells, skipped = spec.expand(exp)
    runs = load_runs(out)
    env_path = out / "environment.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    write_tables(out, runs, env)
    analysis = analyse(runs, arm_order=list(exp.arms))
    write_json_atomic(out / "analysis.json", analysis.to_dict())
    figures: dict[str, list[tuple[str, str]]] = {}
    figures_error = None
    try:
        from damon_hp.experiment.plots import make_plots

        figures = make_plots(analysis, runs, out / "plots")
    except ImportError as e:
        figures_error = f"matplotlib is not available ({e}); install the dev extras (make setup)"
    if exp.workloads[0].app is not None:
        return _finalize_apps(out, exp, runs, env, analysis, len(cells), elapsed_s)
    limits_path = out / "limits.json"
    limits = json.loads(limits_path.read_text()) if limits_path.exists() else {}
    command_path = out / "command.txt"
    command = command_path.read_text().strip() if command_path.exists() else "?"
    text = render(ReportInput(
        experiment=exp, environment=env, analysis=analysis, runs=runs, planned=len(cells),
        command=command, skipped=skipped, figures=figures, figures_error=figures_error,
        limits=limits, elapsed_s=elapsed_s,
    ))
    report = out / "report.md"
    with contextlib.suppress(FileNotFoundError):
        report.unlink()
    report.write_text(text)
    return Finalized(analysis, report, figures_error, len(runs))


def _finalize_apps(out: Path, exp: spec.Experiment, runs: list, env: dict[str, Any],
                   analysis: Analysis, planned: int, elapsed_s: float | None) -> Finalized:
    """report.md (and a memory-over-time figure) of an app experiment (experiment/apps/)."""
    from damon_hp.experiment.apps import report as app_report
    from damon_hp.experiment.writeup import environment_lines

    command_path = out / "command.txt"
    command = command_path.read_text().strip() if command_path.exists() else "?"
    figures_error = None
    try:
        from damon_hp.experiment.apps.plots import memory_over_time

        memory_over_time(exp, runs, out / "plots")
    except ImportError as e:
        figures_error = f"matplotlib is not available ({e}); install the dev extras (make setup)"
    text = app_report.render(exp, runs, planned, command, environment_lines(env),
                             spec.format_duration(elapsed_s) if elapsed_s else None)
    report = out / "report.md"
    report.write_text(text)
    return Finalized(analysis, report, figures_error, len(runs))
