"""Which processes the rules select: /proc read once per scan, matched against the rules.

`scan()` reads what a rule can match on for every process (exe, comm, command line, cgroup v2
path, real uid); `Scanner` does the same and, for a process it has seen, reads only its stat
until the rest is REFRESH_S old; `select(procs, config)` is pure. Kernel threads, PID 1 and
the daemon itself are never selected; a process matching any exclude rule never is either.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from damon_hp.daemon.config import DaemonConfig, Rule


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    exe: str  # readlink /proc/PID/exe, " (deleted)" removed; "" when unreadable
    comm: str
    cmdline: tuple[str, ...]
    cgroup: str  # the cgroup v2 path ("0::" line); "" when none
    uid: int
    start_ticks: int

    @property
    def command(self) -> str:
        return " ".join(self.cmdline)


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def read_process(pid: int, stat: str | None = None) -> ProcessInfo | None:
    """What the rules match on, or None for a kernel thread, a zombie, a process gone meanwhile
    or one whose command line reads empty (inside execve or exiting: Scanner.scan); `stat`:
    its /proc/PID/stat if just read.

    The stat is read first and its comm kept, not /proc/PID/comm read after the rest: an exec
    after the stat read changes the comm (begin_new_exec's __set_task_comm), so a Scanner that
    kept a record mixing the old program's files with the new one's reads it again at its next
    scan."""
    base = f"/proc/{pid}"
    try:
        head = _stat_head(stat if stat is not None else _read(f"{base}/stat"))
        if head is None:
            return None
        cmdline = _read(f"{base}/cmdline")
        if not cmdline:
            return None
        uid = 0
        for line in _read(f"{base}/status").splitlines():
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
                break
        cgroup = ""
        for line in _read(f"{base}/cgroup").splitlines():
            if line.startswith("0::"):
                cgroup = line[3:]
        try:
            exe = os.readlink(f"{base}/exe").removesuffix(" (deleted)")
        except OSError:
            exe = ""
    except (OSError, ValueError, IndexError):
        return None
    return ProcessInfo(pid, exe, head[0], tuple(cmdline.rstrip("\0").split("\0")), cgroup, uid,
                       head[1])


def _stat_head(stat: str) -> tuple[str, int] | None:
    """(comm, start time in clock ticks) from /proc/PID/stat; None for a kernel thread or a
    zombie (no memory to manage)."""
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z" or int(fields[6]) & 0x00200000:  # PF_KTHREAD
        return None
    return stat[stat.index("(") + 1:stat.rindex(")")], int(fields[19])


def _pids(skip: Iterable[int]) -> list[int]:
    skipped = {1, *skip}
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) not in skipped]


def scan(skip: Iterable[int] = ()) -> list[ProcessInfo]:
    """Every user process now, less `skip` (the daemon) and PID 1."""
    return [info for pid in _pids(skip) if (info := read_process(pid)) is not None]


# How old what a Scanner read of a process, beyond its stat, may grow: an exec that keeps the
# comm, a move to another cgroup or a change of real uid shows within it.
REFRESH_S = 30.0


class Scanner:
    """`scan` for a daemon that scans every few seconds: a process seen at an earlier scan, with
    the same start time and comm in its stat (an exec sets the comm to the new program's
    name: __set_task_comm in begin_new_exec), keeps what was read of it until that is
    REFRESH_S old. Reading six files of every process on the machine at every scan was
    0.15 % of a core at 50 managed processes (docs/cost.md); one stat each is a sixth."""

    def __init__(self, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s = refresh_s
        self._clock = clock
        self._known: dict[int, tuple[ProcessInfo, float]] = {}

    def scan(self, skip: Iterable[int] = ()) -> list[ProcessInfo]:
        now, out, known = self._clock(), [], {}
        for pid in _pids(skip):
            try:
                stat = _read(f"/proc/{pid}/stat")
                head = _stat_head(stat)
            except (OSError, ValueError, IndexError):
                continue
            if head is None:
                continue
            seen = self._known.get(pid)
            if (seen is not None and (seen[0].comm, seen[0].start_ticks) == head
                    and now - seen[1] < self.refresh_s):
                info, at = seen
            else:
                info, at = read_process(pid, stat), now
                if info is None:
                    if seen is None or seen[0].start_ticks != head[1]:
                        continue
                    # Alive and no zombie, yet its command line reads empty: inside execve,
                    # where begin_new_exec has switched it to the new mm and set the new comm,
                    # and load_elf_binary has not yet given that mm its arguments (until then
                    # get_mm_cmdline reads nothing), or exiting (exit_mm before exit_notify).
                    # Dropped, damon-hpd's rescan would release a live process as exited; ~3 %
                    # of the scans of a process exec'ing in a loop read it so (2026-12-02).
                    # Keep what was read, as old as it was, so the next scan reads it again;
                    # an exit shows there, or at once through the daemon's pidfd.
                    info, at = seen
            known[pid] = (info, at)
            out.append(info)
        self._known = known
        return out


def matches(rule: Rule, p: ProcessInfo) -> bool:
    """Every criterion the rule gives holds for the process."""
    if rule.exe is not None:
        if rule.exe.startswith("/"):
            if p.exe != rule.exe:
                return False
        elif os.path.basename(p.exe) != rule.exe and p.comm != rule.exe[:15]:
            return False
    if rule.cmdline is not None and rule.cmdline.search(p.command) is None:
        return False
    if rule.cgroup is not None and not (
            rule.cgroup == "/" or p.cgroup == rule.cgroup
            or p.cgroup.startswith(rule.cgroup + "/")):
        return False
    if rule.unit is not None and rule.unit not in p.cgroup.split("/"):
        return False
    return rule.uid is None or p.uid == rule.uid


def rule_for(p: ProcessInfo, config: DaemonConfig) -> Rule | None:
    """The include rule that governs `p`, or None (no rule, or an exclude rule matches)."""
    if any(matches(r, p) for r in config.exclude):
        return None
    return next((r for r in config.include if matches(r, p)), None)


def select(procs: Iterable[ProcessInfo], config: DaemonConfig) -> dict[int, Rule]:
    """pid -> its governing rule, for every process the config selects."""
    out = {}
    for p in procs:
        rule = rule_for(p, config)
        if rule is not None:
            out[p.pid] = rule
    return out
