"""Start CMD and back its hot memory with huge pages until it exits.

The command is forked and held before exec while damon-hp pins it with a pidfd and starts its
own kdamond on it, then released: DAMON watches the process from its exec on. Its regions
follow the program's own mappings from DAMON's first update of them (--update-us, 1 s by
default; until then they are the held fork's), so what the program maps at start is watched
from then on. damon-hp exits with the command's exit code (128+N if signal N killed it), or 1
if the command exited 0 but a --json/--record file could not be written; Ctrl-C, SIGTERM or
SIGHUP stop the agent and the command, and leave no kdamond behind. If monitoring is lost
mid-run (someone stops our kdamond or changes our tracefs instance) the command runs on
unmanaged; so it does, after one message saying why and what to do, when the command turns THP
off for itself (prctl PR_SET_THP_DISABLE, as MariaDB does at start-up; looked at before every
snapshot): the kernel would refuse every collapse. A process another live agent manages is
refused. The summary goes to stderr (stdout is the command's); --json FILE writes it with a
timeline.

examples:
  damon-hp run -- workloads/bin/hotcold --hot 256M --cold 1G --seconds 60
  damon-hp run --json out.json --max-huge 25% -- ./solver input.dat
  damon-hp run --hot-pct 10 --demote-after 10 -q -- ./server
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import sys
import time

from damon_hp import actuate, lifecycle, options, report
from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.options import AgentOptions
from damon_hp.signals import STOP_SIGNALS, StopSignals

PR_SET_PDEATHSIG = 1
EXEC_FAILED = 127


def set_argparser(parser: argparse.ArgumentParser) -> None:
    options.add_options(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]",
                        help="the command to run (after --)")


class HeldChild:
    """A forked child stopped before exec until `release()`; killed on `abort()`."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        parent = os.getpid()
        go_r, self._go_w = os.pipe()
        self._err_r, err_w = os.pipe2(os.O_CLOEXEC)  # closed by a successful exec
        self.pid = os.fork()
        if self.pid == 0:  # child: only async-signal-safe-ish work until exec
            code = EXEC_FAILED
            try:
                os.close(self._go_w)
                os.close(self._err_r)
                # Python ignores SIGPIPE/SIGXFSZ and has handlers for the stop signals; the
                # command must start with the defaults, as from a shell.
                for sig in (signal.SIGPIPE, signal.SIGXFSZ, *STOP_SIGNALS):
                    signal.signal(sig, signal.SIG_DFL)
                # If the agent dies (even SIGKILL) the command does not outlive it unmanaged.
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
                if os.getppid() != parent or os.read(go_r, 1) != b"g":
                    os._exit(code)
                os.close(go_r)
                os.execvp(argv[0], argv)
            except OSError as e:
                try:
                    os.write(err_w, str(e.errno or 0).encode())
                except OSError:
                    pass
            finally:
                os._exit(code)
        os.close(go_r)
        os.close(err_w)
        self.status: int | None = None
        self.rusage: object | None = None

    def release(self) -> None:
        """Let the child exec; raise DamonHpError if exec failed."""
        os.write(self._go_w, b"g")
        os.close(self._go_w)
        self._go_w = -1
        data = b""
        while chunk := os.read(self._err_r, 64):
            data += chunk
        os.close(self._err_r)
        self._err_r = -1
        if data:
            self.wait()
            err = int(data or 0)
            raise EnvironmentProblem(
                f"damon-hp run: cannot execute {self.argv[0]!r}: {os.strerror(err)}"
            )

    def _close_pipes(self) -> None:
        for fd in (self._go_w, self._err_r):
            if fd >= 0:
                os.close(fd)
        self._go_w = self._err_r = -1

    def poll(self) -> bool:
        """True once the child has been reaped."""
        if self.status is not None:
            return True
        try:
            pid, status, ru = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False
        self.status, self.rusage = status, ru
        return True

    def wait(self, timeout_s: float | None = None) -> bool:
        """Reap the child, waiting up to timeout_s (None: forever); True once reaped."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.poll():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def signal(self, sig: int) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def abort(self) -> None:
        """Kill a child that never exec'd (or must not outlive a failed agent)."""
        self._close_pipes()
        self.signal(signal.SIGKILL)
        self.wait()

    def terminate(self, first: int, grace_s: float = 5.0) -> None:
        """Stop a running child: `first` signal, then SIGTERM, then SIGKILL.

        A Ctrl-C reached the child from the terminal already: give it a moment to act on that
        one before sending another.
        """
        settle_s = 2.0 if first == signal.SIGINT else 0.0
        for sig in (first, signal.SIGTERM, signal.SIGKILL):
            if self.wait(settle_s if sig == first else grace_s):
                return
            self.signal(sig)
        self.wait()

    @property
    def exit_code(self) -> int:
        assert self.status is not None
        code = os.waitstatus_to_exitcode(self.status)
        return 128 - code if code < 0 else code


def main(args: argparse.Namespace) -> int:
    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("damon-hp run: no command given; usage: damon-hp run [OPTIONS] -- CMD [ARGS...]",
              file=sys.stderr)
        return 2
    try:
        opts = options.options_from_args(args)
        lifecycle.require_root("run")
        lifecycle.check_outputs("run", {"--json": opts.json_path, "--record": opts.record_path})
        if shutil.which(argv[0]) is None:
            raise EnvironmentProblem(
                f"damon-hp run: command not found or not executable: {argv[0]!r}"
            )
    except DamonHpError as e:
        print(e, file=sys.stderr)
        return e.exit_code
    return _run(argv, opts)


def _run(argv: list[str], opts: AgentOptions) -> int:
    stop = StopSignals().install()
    child = HeldChild(argv)
    rep = report.RunReport(
        mode="run", target_pid=child.pid, command=argv, kernel=os.uname().release,
        thp_mode="", options=opts.to_dict(),
    )
    released = False

    def release() -> None:
        nonlocal released
        child.release()
        released = True

    def wait_unmanaged(reason: str) -> str | None:
        if reason == lifecycle.THP_DISABLED:
            message = (lifecycle.thp_disabled_message("run", child.pid) + ". The command runs "
                       "on without huge-page management; what damon-hp opened is cleaned up.")
        else:
            message = lifecycle.lost_monitoring_message("run", reason, child.pid)
        print(message, file=sys.stderr, flush=True)
        while stop.signum is None and not child.poll():
            time.sleep(0.2)
        return stop.name if stop.signum is not None else None

    outcome = None
    failure: BaseException | None = None
    try:
        target = actuate.Target.open(child.pid)
        try:
            outcome = lifecycle.run_agent(target, opts, rep, stop, after_start=release,
                                          unmanaged=wait_unmanaged)
            failure = outcome.failure
        finally:
            target.close()
    except DamonHpError as e:
        failure = e
    finally:
        if not released:
            child.abort()
        elif failure is not None:
            child.terminate(signal.SIGTERM)
        elif stop.signum is not None:
            child.terminate(stop.signum)
        else:
            child.wait()
        stop.restore()
    if failure is not None and not released:
        print(lifecycle.failure_message("run", failure), file=sys.stderr)
        return getattr(failure, "exit_code", 1)
    rep.exit_code = child.exit_code
    ru = child.rusage
    if ru is not None:
        rep.target_cpu_s = ru.ru_utime + ru.ru_stime  # type: ignore[attr-defined]
        rep.minflt = ru.ru_minflt  # type: ignore[attr-defined]
        rep.majflt = ru.ru_majflt  # type: ignore[attr-defined]
    written = lifecycle.emit_report(outcome.agent, opts) if outcome is not None else True
    if failure is not None:
        print(lifecycle.failure_message("run", failure), file=sys.stderr)
        return 1
    if not written and rep.exit_code == 0:
        return 1
    return rep.exit_code
