"""Manage a running process's hot memory with huge pages until it exits or you stop damon-hp.

The process is pinned with a pidfd first, so a PID that exits and is reused while damon-hp runs
is never touched. Ctrl-C, SIGTERM or SIGHUP stop the agent (the process keeps running) and
leave no kdamond behind; the summary goes to stderr, --json FILE writes it with a timeline.
Target CPU time and faults in the summary count from attach on.

examples:
  damon-hp attach 1234
  damon-hp attach --json out.json --max-huge 1G $(pidof redis-server)
"""

from __future__ import annotations

import argparse
import os
import sys

from damon_hp import actuate, lifecycle, options, procfs, report
from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.options import AgentOptions
from damon_hp.signals import StopSignals


def _pid(text: str) -> int:
    try:
        pid = int(text)
    except ValueError:
        pid = 0
    if pid <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id (a positive integer)")
    return pid


def set_argparser(parser: argparse.ArgumentParser) -> None:
    options.add_options(parser)
    parser.add_argument("pid", type=_pid, metavar="PID", help="the process to manage")


def _open_target(pid: int) -> actuate.Target:
    if pid == os.getpid():
        raise EnvironmentProblem("damon-hp attach: refusing to manage damon-hp itself")
    target = actuate.Target.open(pid)
    try:
        if not procfs.read_maps(pid):
            raise EnvironmentProblem(
                f"damon-hp attach: process {pid} has no user memory (a kernel thread?); "
                "nothing to manage"
            )
    except procfs.ProcessGone:
        target.close()
        raise EnvironmentProblem(f"damon-hp attach: process {pid} has already exited") from None
    except PermissionError:
        target.close()
        raise EnvironmentProblem(
            f"damon-hp attach: may not read /proc/{pid}/maps: damon-hp needs ptrace read access "
            "to the process (root in the process's user namespace)"
        ) from None
    except BaseException:
        target.close()
        raise
    return target


def main(args: argparse.Namespace) -> int:
    try:
        opts = options.options_from_args(args)
        lifecycle.require_root("attach")
        target = _open_target(args.pid)
    except DamonHpError as e:
        print(e, file=sys.stderr)
        return e.exit_code
    return _attach(target, opts)


def _attach(target: actuate.Target, opts: AgentOptions) -> int:
    try:
        command = procfs.read_cmdline(target.pid)
    except procfs.ProcessGone:
        command = []
    rep = report.RunReport(
        mode="attach", target_pid=target.pid, command=command, kernel=os.uname().release,
        thp_mode="", options=opts.to_dict(),
    )
    stop = StopSignals().install()
    try:
        outcome = lifecycle.run_agent(target, opts, rep, stop)
    finally:
        target.close()
        stop.restore()
    if outcome.started:
        lifecycle.emit_report(outcome.agent, opts)
    if outcome.failure is not None:
        print(lifecycle.failure_message("attach", outcome.failure), file=sys.stderr)
        return getattr(outcome.failure, "exit_code", 1) if not outcome.started else 1
    return 0
