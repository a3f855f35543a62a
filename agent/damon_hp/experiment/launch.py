"""The last steps before a workload's exec: standard library only, no damon_hp import.

Two ways in, one behaviour:
* as a script between an agent and the workload (`damon-hp run -- python -I -S launch.py ...`,
  or when the runner must hold the workload until a DAMON scheme is attached):

    launch.py --mark FILE [--cgroup DIR] [--hold FD] [--thp-disable] [--stdin FILE]
              [--cwd DIR] -- CMD ARGS...

* as `prepare(...)` in the runner's forked child (subprocess's preexec_fn), which saves one
  Python start-up per run (seconds under the VM's emulation) when nothing sits in between.

In order: join the run's cgroup (so the memory limit and the cgroup's counters cover the
workload and nothing else), optionally disable THP for this process (prctl, inherited across
exec: the host's per-process "never"), write our pid to FILE, optionally wait until the runner
writes a byte to the pipe FD (so a DAMON scheme can be attached before the workload's first
instruction; end of file instead means the runner is gone), then record the start time and our
own resource usage so far. The pid stays the same through exec, so whoever watches it (runner,
damo, damon-hp) watches the workload.
"""

import json
import os
import resource
import sys
import time

PR_SET_THP_DISABLE = 41


class LaunchError(Exception):
    pass


def _usage() -> dict:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"utime": ru.ru_utime, "stime": ru.ru_stime, "minflt": ru.ru_minflt,
            "majflt": ru.ru_majflt}


def _write_mark(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def prepare(mark: str, cgroup: str | None = None, hold_fd: int | None = None,
            thp_disable: bool = False) -> None:
    """Everything before exec; raises LaunchError with a message on failure."""
    pid = os.getpid()
    if cgroup:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    joined = _usage()
    if thp_disable:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
            raise LaunchError(f"prctl(PR_SET_THP_DISABLE) failed: "
                              f"{os.strerror(ctypes.get_errno())}")
    if hold_fd is not None:
        _write_mark(mark, {"pid": pid, "holding": True})
        got = os.read(hold_fd, 1)
        os.close(hold_fd)
        if not got:
            raise LaunchError("the runner closed the hold pipe without releasing the workload")
    data = {"pid": pid, "joined_cgroup": joined, "before_exec": _usage()}
    data["t0"] = time.monotonic()
    _write_mark(mark, data)


def _die(msg: str) -> None:
    sys.stderr.write(f"damon-hp experiment launcher: {msg}\n")
    sys.exit(127)


def main(argv: list) -> None:
    opts = {"--mark": None, "--cgroup": None, "--hold": None, "--stdin": None, "--cwd": None}
    thp_disable = False
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--thp-disable":
            thp_disable = True
            i += 1
        elif argv[i] in opts and i + 1 < len(argv):
            opts[argv[i]] = argv[i + 1]
            i += 2
        else:
            _die(f"bad argument {argv[i]!r}")
    cmd = argv[i + 1 :]
    if not cmd or not opts["--mark"]:
        _die("usage: launch.py --mark FILE [...] -- CMD ARGS...")
    if opts["--stdin"]:
        fd = os.open(opts["--stdin"], os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
    if opts["--cwd"]:
        os.chdir(opts["--cwd"])
    try:
        prepare(opts["--mark"], opts["--cgroup"],
                int(opts["--hold"]) if opts["--hold"] else None, thp_disable)
    except (LaunchError, OSError) as e:
        _die(str(e))
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        _die(f"cannot run {cmd[0]}: {e.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
