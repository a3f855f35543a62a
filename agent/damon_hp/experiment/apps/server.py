"""One server process for an app run: a free port, its start as the runner's child in a session
of its own, its readiness, and its stop (SIGTERM, then SIGKILL of its session) registered in the
caller's clean-up stack before anything else can go wrong."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from damon_hp import procfs
from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.experiment.interrupts import deferred_interrupts

PR_SET_THP_DISABLE = 41
STOP_GRACE_S = 120.0  # a clean shutdown of a big InnoDB buffer pool takes a while


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_port_free(port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise EnvironmentProblem(
                    f"port {port} on 127.0.0.1 is in use by another program; the app's "
                    "server cannot listen there. Remove `port` from [workloads.params] to "
                    "let the runner pick a free one, or stop that program") from None
            raise


def _disable_thp() -> None:
    # In the forked child before exec: the flag is inherited by the server (host thp-never).
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE) failed")


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_s(self) -> float:
        """utime + stime of all the server's threads so far."""
        return procfs.read_stat(self.pid).cpu_s

    def alive(self) -> bool:
        return self.proc.poll() is None

    def died(self) -> DamonHpError:
        tail = ""
        with contextlib.suppress(OSError):
            tail = " / ".join(self.log.read_text(errors="replace").strip().splitlines()[-3:])
        return DamonHpError(f"{self.name} (pid {self.pid}) exited with {self.proc.returncode}; "
                            f"its log {self.log} ends: {tail or '(empty)'}")

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float) -> float:
        """Seconds until ready() was true; the server's death or the timeout is an error."""
        t0 = time.monotonic()
        while not ready():
            if not self.alive():
                raise self.died()
            if time.monotonic() - t0 > timeout_s:
                raise DamonHpError(f"{self.name} (pid {self.pid}) was not ready within "
                                   f"{timeout_s:.0f} s; see {self.log}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL of the server's whole session."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def start(name: str, argv: list[str], env: dict[str, str], log: Path, port: int,
          thp_disable: bool, stack: contextlib.ExitStack) -> Server:
    """Start the server as our child in a new session; its stop is registered in `stack`
    before a signal can get between the fork and the registration."""

    check_port_free(port)
    with deferred_interrupts(), open(log, "ab") as out:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env=env, start_new_session=True,
                                    preexec_fn=_disable_thp if thp_disable else None)
        except (OSError, subprocess.SubprocessError) as e:
            raise EnvironmentProblem(f"could not start {argv[0]}: {e}; is it installed "
                                     "(`make setup`)?") from None
        server = Server(name, proc, port, log)
        stack.callback(server.stop)
    return server


def spawn(argv: list[str], stdin: int | None, stdout: BinaryIO) -> subprocess.Popen[bytes]:
    """Start a client or loader as our child in a session of its own (stderr to `stdout`),
    a Ctrl-C held until Popen has returned its pid to the caller, who must stop it."""

    with deferred_interrupts():
        return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=subprocess.STDOUT,
                                start_new_session=True)


def run_client(argv: list[str], out: Path, timeout_s: float, what: str,
               stdin: int | None = None) -> str:
    """Run a client or loader to completion (in a session of its own, killed on timeout or
    Ctrl-C); its output, saved to `out`. A non-zero exit is an error naming `what`."""

    with open(out, "wb") as f:
        with deferred_interrupts():
            proc = subprocess.Popen(argv, stdin=stdin if stdin is not None
                                    else subprocess.DEVNULL, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = out.read_text(errors="replace")
    if code is None:
        raise DamonHpError(f"{what} did not finish within {timeout_s:.0f} s; its output: {out}")
    if code != 0:
        tail = " / ".join(text.strip().splitlines()[-3:])
        raise DamonHpError(f"{what} failed (exit {code}): {tail}")
    return text
