"""Run a declarative experiment (arms x workloads x threads x memory x repetitions) and
write raw results, analysis, figures and report.md.

  damon-hp experiment run experiments/smoke.toml            the 5-minute pipeline check
  damon-hp experiment run experiments/quick.toml --out DIR  resumable: run again to continue
  damon-hp experiment run FILE --dry-run                    list the runs, start nothing
  damon-hp experiment report DIR                            redo tables, figures, report.md

By default an experiment runs inside the test VM (`where = "vm"` in the file): the THP
arms switch the global THP mode and the DAMON arms need a DAMON of their own, which
only the VM offers on machines like this one. VM timings are emulated (QEMU TCG, ~25x slower).
Results go to experiments/results/<name>/ unless --out says otherwise; a run whose result file
exists there is not run again. Ctrl-C stops cleanly: no cgroup, kdamond or child is left, and
finished runs are kept.

exit codes: 0 all runs finished (some may have failed: see report.md), 1 runtime failure,
2 bad experiment file or environment, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from damon_hp.errors import DamonHpError


def set_argparser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="experiment_command", metavar="ACTION")
    run = sub.add_parser(
        "run", help="run an experiment file, then write results, figures and report.md",
        description="Run every unfinished run of an experiment file, then analyse all of them.",
    )
    run.add_argument("file", type=Path, help="experiment file (TOML), e.g. experiments/smoke.toml")
    run.add_argument("--out", type=Path, metavar="DIR",
                     help="output directory (default experiments/results/<name>); reusing it "
                     "resumes the experiment")
    run.add_argument("--where", choices=("vm", "host"),
                     help="override the file's `where`: vm = inside the test VM (default), "
                     "host = here, with host arms only")
    run.add_argument("--json", action="store_true",
                     help="print a JSON summary (paths, run counts, headline ratios) on stdout")
    run.add_argument("--dry-run", action="store_true",
                     help="list the runs in order (and which are finished) without running")
    run.add_argument("--no-report", action="store_true",
                     help="only run; skip tables, figures and report.md")
    run.add_argument("--vm-mem", default="4G", metavar="SIZE",
                     help="memory of the test VM (default %(default)s)")
    run.add_argument("--previous", type=Path, action="append", default=[],
                     help=argparse.SUPPRESS)  # read-only earlier results (VM staging)
    rep = sub.add_parser(
        "report", help="rebuild tables, analysis, figures and report.md of an output directory",
        description="Rebuild results.csv/json, analysis.json, plots/ and report.md from the run "
        "files in DIR (no run is started).",
    )
    rep.add_argument("dir", type=Path, help="an experiment output directory")
    rep.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


def _headline(analysis) -> list[dict]:  # type: ignore[no-untyped-def]
    rows = []
    for g in analysis.groups:
        for p, s in g.arms.items():
            rows.append({
                "workload": g.workload, "threads": g.threads, "memory": g.memory, "arm": p,
                "runs_ok": s.n_ok,
                "runtime_vs_never": s.vs_never["runtime_s"].to_dict(),
                "speedup_preserved": s.speedup_preserved.to_dict() if s.speedup_preserved
                else None,
                "overhead_removed": s.overhead_removed.to_dict() if s.overhead_removed else None,
            })
    return rows


def _dry_run(args: argparse.Namespace) -> int:
    from damon_hp.experiment import spec
    from damon_hp.experiment.context import Context, is_done
    from damon_hp.experiment.pipeline import default_out

    exp = spec.load(args.file)
    out = args.out or default_out(exp)
    cells, skipped = spec.expand(exp)
    ctx = Context(exp, out, list(args.previous))
    done = 0
    for c in cells:
        finished = is_done(ctx, c)
        done += finished
        if not args.json:
            print(f"{'done ' if finished else 'todo '} {c.id}")
    for s in skipped:
        if not args.json:
            print(f"left out: {s.arm} on {s.workload}: {s.reason}")
    summary = {"experiment": exp.name, "out": str(out), "planned": len(cells), "finished": done,
               "expected_duration": exp.expected_duration}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{len(cells)} runs, {done} finished; expected duration: "
              f"{exp.expected_duration or 'not stated'}; output: {out}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from damon_hp.experiment import pipeline

    if args.dry_run:
        return _dry_run(args)
    command = "damon-hp " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["experiment"] \
        else f"damon-hp experiment run {shlex.quote(str(args.file))}"
    t = time.monotonic()
    exp, out, outcome = pipeline.run(args.file, args.out, args.where, command,
                                     list(args.previous), args.vm_mem)
    elapsed = time.monotonic() - t
    summary: dict = {"experiment": exp.name, "out": str(out), "planned": outcome.planned,
                     "ran_now": outcome.ran, "interrupted": outcome.interrupted,
                     "errors": outcome.errors, "elapsed_s": round(elapsed, 1)}
    if outcome.interrupted:
        print(f"damon-hp experiment: interrupted; finished runs are kept in {out}. Run the "
              "same command again to resume, or `damon-hp experiment report "
              f"{shlex.quote(str(out))}` for a report of what is finished.", file=sys.stderr)
    elif not args.no_report:
        fin = pipeline.finalize(out, elapsed_s=elapsed)
        summary.update(report=str(fin.report), runs=fin.runs, figures_error=fin.figures_error,
                       headline=_headline(fin.analysis))
        if not args.json:
            print(f"report: {fin.report}")
            if fin.figures_error:
                print(f"figures: {fin.figures_error}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary, indent=1))
    if outcome.interrupted:
        return 130
    return 1 if outcome.errors else 0


def _report(args: argparse.Namespace) -> int:
    from damon_hp.experiment import pipeline

    fin = pipeline.finalize(args.dir)
    if args.json:
        print(json.dumps({"report": str(fin.report), "runs": fin.runs,
                          "figures_error": fin.figures_error,
                          "headline": _headline(fin.analysis)}, indent=1))
    else:
        print(f"report: {fin.report} ({fin.runs} runs)")
    return 0


def main(args: argparse.Namespace) -> int:
    try:
        if args.experiment_command == "run":
            return _run(args)
        if args.experiment_command == "report":
            return _report(args)
    except DamonHpError as e:
        print(f"damon-hp experiment: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("damon-hp experiment: interrupted", file=sys.stderr)
        return 130
    print("damon-hp experiment: say `run FILE` or `report DIR` (see damon-hp experiment --help)",
          file=sys.stderr)
    return 2
