#!/usr/bin/env python3
"""PARSEC input sets of the bundled workloads, and the one place that turns
(program, set, threads) into a runnable command.

    workloads/run-args streamcluster simlarge 2        # prints a shell line
    workloads/run-args water_nsquared native 8 --json  # argv, cwd, stdin as JSON
    python3 workloads/inputsets.py random-in 512 1 -o random.in

streamcluster's sets are pure command lines (n > 0 means a synthetic stream, so there is no
input file; workloads-spec.md A.3). water_nsquared reads 10 fields from stdin (the 9th is the
thread count) and `random.in` from its working directory (B.2, B.3); both files are written into
a run directory under workloads/inputs/generated/ (git-ignored). The SPLASH `random.in` may not
be redistributed, so B.5's replacement is generated (by water_inputs.py's functions): 1 + 9*NMOL
numbers uniform in [-4, 4] from Python's `random.Random(seed)` (Mersenne Twister; `uniform(-4, 4)`
per number, seed 1 by default), one number on line 1, then three per line in `%.18e` form. One
file per (NMOL, seed) is shared by all run directories through a relative symlink.

Standard library only: the agent's experiments and tests import it as a module.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import water_inputs  # noqa: E402

WORKLOADS_DIR = Path(__file__).resolve().parent
BIN_DIR = WORKLOADS_DIR / "bin"
GENERATED_DIR = WORKLOADS_DIR / "inputs" / "generated"

SET_NAMES = ("test", "simdev", "simsmall", "simmedium", "simlarge", "native")
DEFAULT_RANDOM_SEED = 1


@dataclass(frozen=True)
class StreamclusterSet:
    """One row of workloads-spec.md A.3 (`streamcluster k1 k2 d n chunksize clustersize ...`)."""

    k1: int
    k2: int
    d: int
    n: int
    chunksize: int
    clustersize: int


@dataclass(frozen=True)
class WaterSet:
    """One row of workloads-spec.md B.3 (the fields that differ between sets)."""

    nmol: int
    nstep: int


STREAMCLUSTER_SETS: dict[str, StreamclusterSet] = {
    "test": StreamclusterSet(2, 5, 1, 10, 10, 5),
    "simdev": StreamclusterSet(3, 10, 3, 16, 16, 10),
    "simsmall": StreamclusterSet(10, 20, 32, 4096, 4096, 1000),
    "simmedium": StreamclusterSet(10, 20, 64, 8192, 8192, 1000),
    "simlarge": StreamclusterSet(10, 20, 128, 16384, 16384, 1000),
    "native": StreamclusterSet(10, 20, 128, 1_000_000, 200_000, 5000),
}

WATER_SETS: dict[str, WaterSet] = {
    "test": WaterSet(512, 3),
    "simdev": WaterSet(512, 3),
    "simsmall": WaterSet(512, 3),
    "simmedium": WaterSet(3375, 3),
    "simlarge": WaterSet(8000, 3),
    "native": WaterSet(32768, 7),
}

# Program name -> the family of input sets it takes. The compaction variant differs from
# streamcluster only in its allocation calls, so it takes the same command lines.
PROGRAMS = {
    "streamcluster": "streamcluster",
    "streamcluster-compact": "streamcluster",
    "water_nsquared": "water_nsquared",
}


class InputSetError(ValueError):
    """A program, set or thread count that has no command line."""


@dataclass(frozen=True)
class RunSpec:
    """How to start one run: exec `argv` in `cwd`, with stdin from `stdin` when it is set."""

    program: str
    set: str
    threads: int
    argv: list[str]
    cwd: str
    stdin: str | None

    def shell_line(self) -> str:
        line = f"cd {shlex.quote(self.cwd)} && {shlex.join(self.argv)}"
        if self.stdin:
            line += f" < {shlex.quote(self.stdin)}"
        return line


def water_input_text(set_name: str, threads: int) -> str:
    """The 10 stdin fields in PARSEC's three-line layout (B.2), thread count as field 9.
    water_inputs.py (the water_nsquared engineer's module) owns the text; this is the seam."""
    return water_inputs.input_text(water_inputs.set_params(set_name, threads))


def random_in_text(nmol: int, seed: int = DEFAULT_RANDOM_SEED) -> str:
    """B.5's replacement for SPLASH's random.in: 1 + 9*nmol numbers uniform in [-4, 4]."""
    if nmol < 1:
        raise InputSetError(f"random.in needs NMOL >= 1, got {nmol}")
    return water_inputs.random_in_text(nmol, seed)


def _write_if_changed(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def random_in_file(nmol: int, seed: int = DEFAULT_RANDOM_SEED) -> Path:
    """The shared random.in for `nmol` molecules and `seed`, generated once (native: ~7.6 MB)."""
    path = GENERATED_DIR / "water_nsquared" / f"random-{nmol}-seed{seed}.in"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_if_changed(path, random_in_text(nmol, seed))
    return path


def check_threads(program: str, set_name: str, threads: int) -> None:
    if threads < 1:
        raise InputSetError(f"threads must be >= 1, got {threads}")
    if PROGRAMS[program] == "water_nsquared":
        nmol = WATER_SETS[set_name].nmol
        if threads > min(nmol, 1024):
            raise InputSetError(
                f"water_nsquared {set_name} has {nmol} molecules: threads must be "
                f"1..{min(nmol, 1024)} (spec B.9), got {threads}"
            )


def command(
    program: str,
    set_name: str,
    threads: int = 1,
    rundir: Path | str | None = None,
    seed: int = DEFAULT_RANDOM_SEED,
) -> RunSpec:
    """The run of `program` on PARSEC input set `set_name` with `threads` threads.

    Files the run needs (water's input file and random.in) are written into `rundir`, by default
    workloads/inputs/generated/<program>/<set>-p<threads>/, which is also the working directory
    (streamcluster writes its output.txt there, as under parsecmgmt).
    """
    if program not in PROGRAMS:
        raise InputSetError(f"unknown program {program!r}; known: {', '.join(PROGRAMS)}")
    if set_name not in SET_NAMES:
        raise InputSetError(f"unknown input set {set_name!r}; known: {', '.join(SET_NAMES)}")
    check_threads(program, set_name, threads)
    run = Path(rundir) if rundir else GENERATED_DIR / program / f"{set_name}-p{threads}"
    run = run.resolve()
    run.mkdir(parents=True, exist_ok=True)
    binary = str(BIN_DIR / program)

    if PROGRAMS[program] == "streamcluster":
        s = STREAMCLUSTER_SETS[set_name]
        argv = [binary, *map(str, (s.k1, s.k2, s.d, s.n, s.chunksize, s.clustersize))]
        argv += ["none", "output.txt", str(threads)]
        return RunSpec(program, set_name, threads, argv, str(run), None)

    ws = WATER_SETS[set_name]
    input_path = run / f"input_{threads}"
    _write_if_changed(input_path, water_input_text(set_name, threads))
    link = run / "random.in"
    target = random_in_file(ws.nmol, seed)
    if not (link.is_symlink() and link.resolve() == target.resolve()):
        tmp = run / f"random.in.tmp{os.getpid()}"
        tmp.unlink(missing_ok=True)
        # Relative, so a run directory still works when the tree is seen at another path.
        tmp.symlink_to(os.path.relpath(target, run))
        tmp.replace(link)
    # PARSEC's run.sh passes the thread count as argv[1]; the program ignores it (B.2).
    return RunSpec(program, set_name, threads, [binary, str(threads)], str(run), str(input_path))


def _cmd_args(ns: argparse.Namespace) -> int:
    spec = command(ns.program, ns.set, ns.threads, ns.rundir, ns.seed)
    print(json.dumps(asdict(spec)) if ns.json else spec.shell_line())
    return 0


def _cmd_random_in(ns: argparse.Namespace) -> int:
    text = random_in_text(ns.nmol, ns.seed)
    if ns.output == "-":
        sys.stdout.write(text)
    else:
        Path(ns.output).write_text(text)
    return 0


def _cmd_list(ns: argparse.Namespace) -> int:
    for program in PROGRAMS:
        for set_name in SET_NAMES:
            if ns.commands:
                print(command(program, set_name, ns.threads).shell_line())
            else:
                print(f"{program} {set_name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="inputsets.py",
        description="PARSEC input sets of streamcluster and water_nsquared as runnable commands.",
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    a = sub.add_parser("args", help="print the command line of PROGRAM on SET with THREADS")
    a.add_argument("program", choices=list(PROGRAMS))
    a.add_argument("set", choices=SET_NAMES)
    a.add_argument("threads", nargs="?", type=int, default=1)
    a.add_argument("--rundir", help="working directory for the run (default: under "
                   "workloads/inputs/generated/)")
    a.add_argument("--seed", type=int, default=DEFAULT_RANDOM_SEED,
                   help="seed of the generated random.in (water_nsquared; default 1)")
    a.add_argument("--json", action="store_true",
                   help='print {"argv": [...], "cwd": ..., "stdin": ...} instead of a shell line')
    a.set_defaults(func=_cmd_args)

    r = sub.add_parser("random-in", help="write a random.in for NMOL molecules (spec B.5)")
    r.add_argument("nmol", type=int)
    r.add_argument("seed", nargs="?", type=int, default=DEFAULT_RANDOM_SEED)
    r.add_argument("-o", "--output", default="-", help="file to write (default: stdout)")
    r.set_defaults(func=_cmd_random_in)

    ls = sub.add_parser("list", help="list every (program, set)")
    ls.add_argument("--commands", action="store_true", help="print each command line too")
    ls.add_argument("--threads", type=int, default=1)
    ls.set_defaults(func=_cmd_list)

    ns = p.parse_args(argv)
    try:
        return ns.func(ns)
    except InputSetError as e:
        print(f"inputsets: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
