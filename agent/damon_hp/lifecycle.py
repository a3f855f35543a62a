"""The one lifecycle of an agent, for `run`, `attach` (and the daemon): start, loop, close,
report. Whatever ends the loop (target exit, SIGINT/SIGTERM/SIGHUP, an error in the agent),
`close()` runs and the report is emitted; a refusal before the start is an exit-2 message.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from damon_hp import actuate, report
from damon_hp.agent import Agent
from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.options import AgentOptions
from damon_hp.signals import StopSignals


def require_root(command: str) -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            f"damon-hp {command}: needs root: DAMON's sysfs interface, tracefs and "
            "process_madvise on another process need CAP_SYS_ADMIN. Run it with sudo."
        )


def vm_hint(argv: list[str]) -> str:
    inner = " ".join(["damon-hp", *argv]).replace("'", "")
    return f"To use a real DAMON, run it in the test VM: make vm-run CMD='.venv/bin/{inner}'"


def with_vm_hint(e: EnvironmentProblem, argv: list[str]) -> EnvironmentProblem:
    """Add where a usable DAMON is to a refusal that is about this system's DAMON."""
    text = str(e)
    if "DAMON" in text or "kdamond" in text:
        return EnvironmentProblem(f"{text}\n{vm_hint(argv)}")
    return e


@dataclass
class Outcome:
    agent: Agent
    started: bool
    failure: BaseException | None


def run_agent(target: actuate.Target, opts: AgentOptions, rep: report.RunReport,
              stop: StopSignals, *, after_start: Callable[[], None] | None = None,
              unmanaged: Callable[[], str | None] | None = None) -> Outcome:
    """Start an agent on `target`, loop until it ends, close it; never raises.

    after_start: called once monitoring runs (run: let the held child exec).
    unmanaged: called when the kdamond stopped while the target lives on (run: wait for the
    command); returns what stopped the run then, or None to keep "kdamond stopped".
    """
    ag = Agent(target, opts, rep, stop)
    failure: BaseException | None = None
    started = False
    try:
        try:
            ag.start()
        except EnvironmentProblem as e:
            raise with_vm_hint(e, sys.argv[1:]) from None
        started = True
        if after_start is not None:
            after_start()
        rep.stopped_by = ag.loop()
        if rep.stopped_by == "kdamond stopped" and unmanaged is not None:
            rep.notes.append("the kdamond stopped before the target exited")
            rep.stopped_by = unmanaged() or rep.stopped_by
    except DamonHpError as e:
        failure = e
    except Exception as e:  # the agent's own bug: clean up, then say so
        failure = e
        traceback.print_exc()
    finally:
        try:
            ag.close()
        except DamonHpError as e:
            print(e, file=sys.stderr)
    return Outcome(ag, started, failure)


def failure_message(command: str, failure: BaseException) -> str:
    if isinstance(failure, DamonHpError):
        return str(failure)
    return f"damon-hp {command}: internal error: {failure}"


def emit_report(agent: Agent, opts: AgentOptions) -> None:
    """Summary table on stderr (stdout belongs to the target in `run`), JSON file if asked."""
    agent.finish_report()
    if opts.json_path:
        try:
            report.write_json(agent.report, opts.json_path)
        except OSError as e:
            print(f"damon-hp: cannot write {opts.json_path}: {e.strerror}", file=sys.stderr)
    try:
        agent.save_recording()
    except OSError as e:
        print(f"damon-hp: cannot write {opts.record_path}: {e.strerror}", file=sys.stderr)
    print(report.format_table(agent.report), file=sys.stderr, flush=True)
