"""Which processes the rules select: /proc read once per scan, matched against the rules.

`scan()` reads what a rule can match on for every process (exe, comm, command line, cgroup v2
path, real uid); `select(procs, config)` is pure. Kernel threads, PID 1 and the daemon itself
are never selected; a process matching any exclude rule never is either.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
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


def read_process(pid: int) -> ProcessInfo | None:
    """What the rules match on, or None for a kernel thread or a process gone meanwhile."""
    base = f"/proc/{pid}"
    try:
        cmdline = _read(f"{base}/cmdline")
        if not cmdline:
            return None  # kernel thread (or a zombie): no memory to manage
        stat = _read(f"{base}/stat")
        fields = stat[stat.rindex(")") + 2:].split()
        flags, start = int(fields[6]), int(fields[19])
        if flags & 0x00200000:  # PF_KTHREAD
            return None
        comm = _read(f"{base}/comm").strip()
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
    return ProcessInfo(pid, exe, comm, tuple(cmdline.rstrip("\0").split("\0")), cgroup, uid,
                       start)


def scan(skip: Iterable[int] = ()) -> list[ProcessInfo]:
    """Every user process now, less `skip` (the daemon) and PID 1."""
    skipped = {1, *skip}
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skipped:
            continue
        info = read_process(int(name))
        if info is not None:
            out.append(info)
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
