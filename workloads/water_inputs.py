#!/usr/bin/env python3
"""Input files for water_nsquared: the PARSEC input sets and a free replacement for random.in.

    python3 workloads/water_inputs.py SET THREADS OUTDIR [--seed N]

writes OUTDIR/input_<THREADS> (the 10-field parameter file PARSEC's run.sh makes from
input.template, with the thread count as the 9th field) and OUTDIR/random.in, then prints one JSON
line naming both and the command to run. Run the program from OUTDIR:

    cd OUTDIR && water_nsquared < input_<THREADS>

random.in: SPLASH-2's file may not be redistributed, so (workloads-spec.md B.5) we write
1 + 9*NMOL numbers uniform in [-4, 4] from Python's random.Random(seed) (Mersenne Twister, seed 1
unless --seed; uniform(-4, 4) per number), one number on the first line and three per line after
it, each in %.18e form; workloads/inputsets.py writes the same numbers. The stream does not
depend on NMOL, so the file for a larger set begins with the file for a smaller one. Anyone
holding PARSEC's own random.in can put it in OUTDIR instead to compare with PARSEC's numbers.

Standard library only, so the agent-side tooling can call it without numpy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SEED = 1
RANDOM_LOW, RANDOM_HIGH = -4.0, 4.0
MAX_THREADS = 1024


@dataclass(frozen=True)
class WaterParams:
    """The 10 fields of a water_nsquared input file, in file order."""

    nmol: int
    nstep: int
    threads: int = 1
    tstep_s: float = 1.5e-16
    norder: int = 6
    nsave: int = -1
    nrst: int = 3000
    nprint: int = 3
    nfmc: int = 0
    cutoff_a: float = 6.212752


# PARSEC 3.0 input sets (workloads-spec.md B.3); every other field is the same in all of them.
INPUT_SETS: dict[str, tuple[int, int]] = {
    "test": (512, 3),
    "simdev": (512, 3),
    "simsmall": (512, 3),
    "simmedium": (3375, 3),
    "simlarge": (8000, 3),
    "native": (32768, 7),
}


def set_params(set_name: str, threads: int) -> WaterParams:
    if set_name not in INPUT_SETS:
        raise ValueError(f"unknown input set {set_name!r}; choose one of {', '.join(INPUT_SETS)}")
    nmol, nstep = INPUT_SETS[set_name]
    if not 1 <= threads <= min(nmol, MAX_THREADS):
        raise ValueError(
            f"threads = {threads} is out of range for {set_name}: "
            f"water_nsquared needs 1 <= threads <= min(NMOL = {nmol}, {MAX_THREADS})"
        )
    return WaterParams(nmol=nmol, nstep=nstep, threads=threads)


def input_text(p: WaterParams) -> str:
    """The parameter file in PARSEC's layout: fields 1-4, 5-8 and 9-10 on three lines."""
    return (
        f"  {p.tstep_s:g}   {p.nmol}  {p.nstep}   {p.norder}\n"
        f" {p.nsave}      {p.nrst}     {p.nprint}  {p.nfmc}\n"
        f"{p.threads} {p.cutoff_a:.6f}\n"
    )


def random_numbers(count: int, seed: int = DEFAULT_SEED) -> list[float]:
    """count numbers uniform in [-4, 4]: Python's random.Random(seed) (MT19937, whose output for
    an int seed is stable across Python versions), uniform(-4, 4) = -4 + 8 * random()."""
    rng = random.Random(seed)
    return [rng.uniform(RANDOM_LOW, RANDOM_HIGH) for _ in range(count)]


def random_in_text(nmol: int, seed: int = DEFAULT_SEED) -> str:
    """1 + 9*nmol numbers: a discarded first one, then (H1, O, H2) x (x, y, z) per molecule."""
    nums = random_numbers(1 + 9 * nmol, seed)
    lines = [f"{nums[0]:.18e}"]
    for i in range(1, len(nums), 3):
        lines.append(" ".join(f"{v:.18e}" for v in nums[i : i + 3]))
    return "\n".join(lines) + "\n"


def _write_atomically(path: Path, text: str) -> None:
    # Several runs may prepare the same directory at once; a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_run_dir(p: WaterParams, outdir: Path, seed: int = DEFAULT_SEED) -> tuple[Path, Path]:
    """Write input_<threads> and random.in into outdir; returns both paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    input_path = outdir / f"input_{p.threads}"
    random_path = outdir / "random.in"
    _write_atomically(input_path, input_text(p))
    _write_atomically(random_path, random_in_text(p.nmol, seed))
    return input_path, random_path


def generate(set_name: str, threads: int, outdir: Path | str, seed: int = DEFAULT_SEED) -> dict:
    """Prepare a run directory for (set, threads); returns what the CLI prints as JSON."""
    p = set_params(set_name, threads)
    input_path, random_path = write_run_dir(p, Path(outdir), seed)
    return {
        "program": "water_nsquared",
        "set": set_name,
        "threads": threads,
        "nmol": p.nmol,
        "nstep": p.nstep,
        "seed": seed,
        "cwd": str(Path(outdir).resolve()),
        "stdin": str(input_path.resolve()),
        "random_in": str(random_path.resolve()),
        "argv": ["water_nsquared"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Write water_nsquared's input file and a random.in for one PARSEC input set. "
        "Run the program in OUTDIR with the input file on stdin.",
        epilog="example: python3 workloads/water_inputs.py simlarge 2 /tmp/w && "
        "cd /tmp/w && water_nsquared < input_2",
    )
    ap.add_argument("set", metavar="SET", help=f"input set: {', '.join(INPUT_SETS)}")
    ap.add_argument("threads", metavar="THREADS", type=int, help="thread count (9th field)")
    ap.add_argument("outdir", metavar="OUTDIR", type=Path, help="run directory to write into")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED,
                    help=f"random.Random seed for random.in (default {DEFAULT_SEED})")
    args = ap.parse_args(argv)
    try:
        info = generate(args.set, args.threads, args.outdir, args.seed)
    except ValueError as e:
        print(f"water_inputs: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"water_inputs: cannot write into {args.outdir}: {e.strerror}", file=sys.stderr)
        return 1
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
