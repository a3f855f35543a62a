#!/usr/bin/env python3
"""Where a `damon-hp run` or `attach` spends its CPU outside the pipeline's stages (issue 26).
Not a test.

`experiments/cost-phases.py` gives a run's "start-up and the rest": its monitoring CPU less
the stages' CPU. This runs the damon-hp command line in this process and takes the process CPU
at the points between, so that figure splits into the interpreter, the imports (and within
them what `dataclasses` spent making our dataclasses' methods), opening the source, the loop
outside its snapshots' steps, and the exit (the report). The stages' CPU is the run's own
(`--json`): compare it with cost-phases.py's figure for the same file.

  .venv/bin/python experiments/startup-split.py -- run --quiet --json /tmp/run.json -- \\
      workloads/bin/hotcold --hot 1G --cold 3G --seconds 120
"""

from __future__ import annotations

import time

_AT_START = time.process_time()

import dataclasses  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "agent"))  # after PYTHONPATH: another commit's agent comes first


def main(argv: list[str]) -> int:
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command or command[0] not in ("run", "attach") or "-h" in argv or "--help" in argv:
        print(__doc__, file=sys.stderr)
        return 2
    in_dataclasses = [0.0]
    process_class = dataclasses._process_class  # type: ignore[attr-defined]

    def timed(*args: object, **kwargs: object) -> object:
        t = time.process_time()
        try:
            return process_class(*args, **kwargs)
        finally:
            in_dataclasses[0] += time.process_time() - t

    dataclasses._process_class = timed  # type: ignore[attr-defined]
    marks = [("interpreter", _AT_START)]
    import damon_hp.commands.run  # noqa: F401  (what `run` imports, before it is timed)
    from damon_hp import agent
    from damon_hp.cli import main as damon_hp_main

    marks.append(("imports", time.process_time()))
    dataclasses._process_class = process_class  # type: ignore[attr-defined]
    imports_dataclasses = in_dataclasses[0]

    cls = agent.Agent
    start, loop, step = cls.start, cls.loop, cls.step
    in_steps = [0.0]
    stages: dict[str, float] = {}

    def start_timed(self: agent.Agent) -> None:
        marks.append(("until the start", time.process_time()))
        start(self)
        marks.append(("opening the source", time.process_time()))

    def loop_timed(self: agent.Agent, *args: object, **kwargs: object) -> str:
        why = loop(self, *args, **kwargs)
        marks.append(("the loop", time.process_time()))
        if self.pipeline is not None:
            stages.update(self.pipeline.cpu.to_dict())
        return why

    def step_timed(self: agent.Agent, snap: object) -> None:
        t = time.process_time()
        try:
            step(self, snap)  # type: ignore[arg-type]
        finally:
            in_steps[0] += time.process_time() - t

    cls.start, cls.loop, cls.step = start_timed, loop_timed, step_timed  # type: ignore[method-assign]
    rc = damon_hp_main(command)
    marks.append(("the exit", time.process_time()))
    print("startup-split: process CPU, s (and what each stretch took)", file=sys.stderr)
    prev = 0.0
    for name, at in marks:
        print(f"  {name:20s} {at:7.3f}  (+{at - prev:.3f})", file=sys.stderr)
        prev = at
    print(f"  dataclasses' methods made during the imports: {imports_dataclasses:.3f} s",
          file=sys.stderr)
    if stages:
        print(f"  the loop: snapshots' steps {in_steps[0]:.3f} s (MADV_COLLAPSE's copies "
              f"included); stages {sum(stages.values()):.3f} s, of them events (outside the "
              f"steps) {stages.get('events', 0.0):.3f} s", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
