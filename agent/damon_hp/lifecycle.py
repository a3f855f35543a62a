"""The one lifecycle of an agent, for `run`, `attach` (and the daemon): start, loop, close,
report. Whatever ends the loop (target exit, SIGINT/SIGTERM/SIGHUP, an error in the agent),
`close()` runs and the report is emitted; a refusal before the start is an exit-2 message.

Checked before anything is started (each an exit-2 refusal that changes nothing): root with
the capabilities the agent uses (`require_root`), output files that can be written
(`check_outputs`), and a target no live agent manages yet (`status_records.claim_target`).
Lost monitoring mid-run (our kdamond stopped, or our tracefs instance changed by someone else:
LOST_MONITORING) ends management, never the target; so does a target that turns THP off for
itself (THP_DISABLED), since the kernel then refuses every collapse of its memory.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from damon_hp import actuate, report, status_records
from damon_hp.agent import THP_DISABLED, Agent
from damon_hp.damon import io as damon_io
from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.options import AgentOptions
from damon_hp.signals import StopSignals

# Why an agent stopped when monitoring was lost while the target lived on.
KDAMOND_STOPPED = "kdamond stopped"
EVENT_STREAM_LOST = "event stream lost"
LOST_MONITORING = (KDAMOND_STOPPED, EVENT_STREAM_LOST)
# Why an agent stopped while its target lives on: lost monitoring, or nothing it can do.
UNMANAGED = (*LOST_MONITORING, THP_DISABLED)

# Effective capabilities the agent needs (linux/capability.h bit, what for). Without
# CAP_SYS_ADMIN /proc/PID/pagemap reads every frame number as 0, so a physical source would
# silently see nothing of the target.
AGENT_CAPS = {
    "CAP_SYS_ADMIN": (21, "DAMON sysfs, tracefs instances, frame numbers in /proc/PID/pagemap"),
    "CAP_SYS_NICE": (23, "process_madvise(MADV_COLLAPSE) on another process"),
}


def _cap_eff() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def require_root(command: str) -> None:
    """Root with the capabilities the agent uses, or an exit-2 refusal naming what lacks."""
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            f"damon-hp {command}: needs root: DAMON's sysfs interface, tracefs and "
            "process_madvise on another process need CAP_SYS_ADMIN. Run it with sudo."
        )
    eff = _cap_eff()
    lacking = [(name, why) for name, (bit, why) in AGENT_CAPS.items() if not eff >> bit & 1]
    if lacking:
        raise EnvironmentProblem(
            f"damon-hp {command}: runs as root but lacks "
            + "; ".join(f"{name} (for {why})" for name, why in lacking)
            + ". Run it as root with full capabilities (not under capsh --drop or a container "
            "that drops them)."
        )


def check_outputs(command: str, paths: dict[str, str | None]) -> None:
    """Refuse (exit 2) output files that cannot be written, before anything is started.

    paths: option name -> path or None. A file that did not exist is created and removed again.
    """
    for option, path in paths.items():
        if not path:
            continue
        existed = os.path.lexists(path)
        try:
            with open(path, "a"):
                pass
        except OSError as e:
            reason = os.strerror(e.errno) if e.errno else str(e)
            parent = os.path.dirname(os.path.abspath(path))
            if e.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.isdir(parent):
                reason = (f"{parent} is not a directory" if os.path.exists(parent) else
                          f"directory {parent} does not exist")
            elif e.errno == errno.EISDIR:
                reason = "it is a directory"
            raise EnvironmentProblem(
                f"damon-hp {command}: cannot write {option} {path}: {reason}; give a file "
                "path in a writable directory"
            ) from None
        if not existed:
            try:
                os.unlink(path)
            except OSError:
                pass


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
    unmanaged: called with the reason (one of UNMANAGED) when management ended while the
    target lives on, after the source is closed (run: wait for the command); returns what
    stopped the run then, or None to keep the reason.
    A target another live agent manages is refused (exit 2) before anything is opened.
    """
    ag = Agent(target, opts, rep, stop)
    busy_before = len(damon_io.busy_waits)  # the daemon runs many agents in one process
    failure: BaseException | None = None
    started = False
    try:
        status_records.claim_target(target.pid, rep.mode, rep.command)
        try:
            ag.start()
        except EnvironmentProblem as e:
            raise with_vm_hint(e, sys.argv[1:]) from None
        started = True
        if after_start is not None:
            after_start()
        rep.stopped_by = ag.loop()
        if rep.stopped_by in LOST_MONITORING:
            rep.notes.append(f"monitoring was lost before the target exited ({rep.stopped_by})")
        elif rep.stopped_by == THP_DISABLED:
            rep.notes.append("the target turned THP off for itself (THP_enabled: 0): no "
                             "collapse can succeed, management ended")
        if rep.stopped_by in UNMANAGED:
            if unmanaged is not None:
                ag.close()  # our kdamond and tracefs instance go now, not at the command's end
                rep.stopped_by = unmanaged(rep.stopped_by) or rep.stopped_by
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
        note = busy_note(damon_io.busy_waits[busy_before:])
        if note:
            rep.notes.append(note)
    return Outcome(ag, started, failure)


def busy_note(waits: list[float]) -> str | None:
    """Say that DAMON sysfs held the agent up (notable EBUSY waits that ended well), if it did."""
    if not waits:
        return None
    return (f"DAMON sysfs was busy (EBUSY): {len(waits)} operation(s) waited, the longest "
            f"{max(waits):.1f} s (damon-hp waits up to {damon_io.EBUSY_RETRY_S:g} s per "
            "operation)")


def failure_message(command: str, failure: BaseException) -> str:
    if isinstance(failure, DamonHpError):
        return str(failure)
    return f"damon-hp {command}: internal error: {failure}"


def lost_monitoring_message(command: str, reason: str, pid: int) -> str:
    what = ("the kdamond it read stopped" if reason == KDAMOND_STOPPED else
            "someone else changed damon-hp's tracefs instance, as said above")
    return (f"damon-hp {command}: monitoring was lost: {what}. Process {pid} runs on without "
            "huge-page management; what damon-hp opened (its tracefs instance, its kdamond if "
            f"it started one) is cleaned up. To manage it again: damon-hp attach {pid}")


def thp_disabled_message(command: str, pid: int) -> str:
    """What a user reads when the target has turned THP off for itself, and what to do."""
    return (
        f"damon-hp {command}: process {pid} has turned transparent huge pages off for itself "
        f"(prctl(PR_SET_THP_DISABLE); /proc/{pid}/status shows THP_enabled: 0), so the kernel "
        "refuses every collapse of its memory (EINVAL) and damon-hp can do nothing for it. The "
        "setting is the program's own (MariaDB sets it at start-up) or inherited: it passes "
        "through fork and exec, so a parent that set it (a launcher, a shell, a service "
        "manager) hands it on. To let damon-hp manage it: start it from a process that has not "
        "disabled THP and without the program's own opt-out if it has one, or have it use "
        "prctl(PR_SET_THP_DISABLE, 1, PR_THP_DISABLE_EXCEPT_ADVISED, 0, 0) instead (Linux "
        "6.18+: no THP at faults, collapses still allowed)")


def emit_report(agent: Agent, opts: AgentOptions) -> bool:
    """Summary table on stderr (stdout belongs to the target in `run`), JSON file if asked.

    False when an output file asked for could not be written (said on stderr; a partial
    recording is removed).
    """
    ok = True
    agent.finish_report()
    if opts.json_path:
        try:
            report.write_json(agent.report, opts.json_path)
        except OSError as e:
            ok = False
            print(f"damon-hp: cannot write the --json report {opts.json_path}: {e.strerror}; "
                  "the summary below is all there is", file=sys.stderr)
    try:
        agent.save_recording()
    except OSError as e:
        ok = False
        _remove_partial(opts.record_path)
        print(f"damon-hp: cannot write the --record file {opts.record_path}: {e.strerror}",
              file=sys.stderr)
    print(report.format_table(agent.report), file=sys.stderr, flush=True)
    return ok


def _remove_partial(path: str | None) -> None:
    """Remove a regular file left half-written (never a device such as /dev/full)."""
    if not path:
        return
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass
