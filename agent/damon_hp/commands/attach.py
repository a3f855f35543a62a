"""Manage a running process's hot memory with huge pages until it exits or you stop damon-hp.

The process is pinned with a pidfd first, so a PID that exits and is reused while damon-hp runs
is never touched. Ctrl-C, SIGTERM or SIGHUP stop the agent (the process keeps running) and
leave no kdamond behind; the summary goes to stderr, --json FILE writes it with a timeline.
Target CPU time and faults in the summary count from attach on. Refused (exit 2): PID 1, a
kernel thread, a thread id that is not a process, an exited process, damon-hp itself, a process
another live agent manages, a process that has turned THP off for itself (prctl
PR_SET_THP_DISABLE, `THP_enabled: 0` in /proc/PID/status; the kernel refuses every collapse of
its memory: damon-hp says why and what to do instead of failing range after range). A process
that turns THP off while attached ends the attach the same way (exit 2; the huge pages it has
stay): damon-hp does not wait for it to turn THP on again, which only the process itself can
do. Exit 1 when monitoring is lost mid-run (someone stops our kdamond
or changes our tracefs instance; the process runs on unmanaged) or a --json/--record file
could not be written.

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

PF_KTHREAD = 0x00200000  # include/linux/sched.h


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


def _thread_group(pid: int) -> int | None:
    """The process (tgid) that thread `pid` belongs to, or None if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def open_target(pid: int, command: str = "attach", *,
                refuse_thp_disabled: bool = True) -> actuate.Target:
    """Pin `pid` after the checks every command on a running process makes (exit-2 refusals
    named for `command`); `advise` reads a process that turned THP off, `attach` refuses it."""
    if pid == os.getpid():
        raise EnvironmentProblem(f"damon-hp {command}: refusing to manage damon-hp itself")
    if pid == 1:
        raise EnvironmentProblem(
            f"damon-hp {command}: refusing PID 1 (init): the process every other one depends on "
            "is not a target; give the program whose memory you want on huge pages")
    tgid = _thread_group(pid)
    if tgid is not None and tgid != pid:
        raise EnvironmentProblem(
            f"damon-hp {command}: {pid} is a thread of process {tgid}, not a process; memory "
            f"belongs to the process: damon-hp {command} {tgid}")
    target = actuate.Target.open(pid)
    try:
        st = procfs.read_stat(pid)
        if st.flags & PF_KTHREAD:
            raise EnvironmentProblem(
                f"damon-hp {command}: {pid} ({st.comm}) is a kernel thread: it has no user memory "
                "to look at; give a user process")
        if not procfs.read_maps(pid):
            raise EnvironmentProblem(
                f"damon-hp {command}: process {pid} has no user memory (a kernel thread?); "
                "nothing to manage"
            )
        if refuse_thp_disabled and procfs.thp_disabled_by_process(procfs.read_status(pid)):
            raise EnvironmentProblem(lifecycle.thp_disabled_message("attach", pid)
                                     + ". Not attached.")
    except procfs.ProcessGone:
        target.close()
        raise EnvironmentProblem(f"damon-hp {command}: process {pid} has already exited") from None
    except PermissionError:
        target.close()
        raise EnvironmentProblem(
            f"damon-hp {command}: may not read /proc/{pid}/maps: damon-hp needs ptrace read access "
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
        lifecycle.check_outputs("attach", {"--json": opts.json_path,
                                           "--record": opts.record_path})
        target = open_target(args.pid)
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
    written = lifecycle.emit_report(outcome.agent, opts) if outcome.started else True
    if outcome.failure is not None:
        print(lifecycle.failure_message("attach", outcome.failure), file=sys.stderr)
        return getattr(outcome.failure, "exit_code", 1) if not outcome.started else 1
    if rep.stopped_by == lifecycle.THP_DISABLED:
        print(lifecycle.thp_disabled_message("attach", target.pid)
              + ". damon-hp has stopped managing it; the huge pages it holds stay.",
              file=sys.stderr)
        return 2
    if rep.stopped_by in lifecycle.LOST_MONITORING:
        print(lifecycle.lost_monitoring_message("attach", rep.stopped_by, target.pid),
              file=sys.stderr)
        return 1
    return 0 if written else 1
