"""Settings of the process and the machine that spoil huge pages, each with its fix.

`read_facts(pid)` reads them (read-only: /proc, THP sysfs, cgroup files); `judge(facts, ...)`
is pure and returns the hazards that apply.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from damon_hp import procfs
from damon_hp.advise.growth import read_bracketed
from damon_hp.ranges import HUGE_PAGE_BYTES

THP = "/sys/kernel/mm/transparent_hugepage"
MIB = 1 << 20
# buddyinfo counts free blocks per order; a 2 MiB huge page is an order-9 block of 4 KiB pages
HUGE_ORDER = (HUGE_PAGE_BYTES // os.sysconf("SC_PAGE_SIZE")).bit_length() - 1


@dataclass(frozen=True)
class Facts:
    thp_enabled: str
    defrag: str
    shmem_enabled: str
    thp_disabled_by_process: bool
    shmem_rss_bytes: int
    free_huge_bytes: int | None
    """free memory in blocks of 2 MiB or more (/proc/buddyinfo), None if unreadable"""
    memcg: str | None
    memcg_headroom_bytes: int | None
    """the smallest limit - usage over the process's memory cgroup and its ancestors"""

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Hazard:
    name: str
    what: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


def parse_buddyinfo(text: str, order: int = HUGE_ORDER,
                    page_bytes: int = 4096) -> int:
    """Free bytes in blocks of `order` or more, over all zones."""
    total = 0
    for line in text.splitlines():
        fields = line.split()
        if "zone" not in fields:
            continue
        counts = [int(x) for x in fields[fields.index("zone") + 2:]]
        total += sum(n * (page_bytes << o) for o, n in enumerate(counts) if o >= order)
    return total


def _memcg_paths(pid: int) -> list[tuple[str, str, str]]:
    """(cgroup dir, limit file, usage file) for the process's memory cgroup and ancestors,
    cgroup v2 first, then v1's memory controller."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    mounts = _cgroup_mounts()
    out: list[tuple[str, str, str]] = []
    for line in lines:
        hid, ctrls, path = line.split(":", 2)
        if hid == "0" and ctrls == "" and "cgroup2" in mounts:
            root, limit, usage = mounts["cgroup2"], "memory.max", "memory.current"
        elif "memory" in ctrls.split(",") and "memory" in mounts:
            root, limit, usage = mounts["memory"], "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for n in range(len(parts), -1, -1):
            d = os.path.join(root, *parts[:n])
            if os.path.exists(os.path.join(d, limit)):
                out.append((d, limit, usage))
    return out


def _cgroup_mounts() -> dict[str, str]:
    found: dict[str, str] = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fstype, _, opts = (right.split() + ["", "", ""])[:3]
                mountpoint = left.split()[4]
                if fstype == "cgroup2":
                    found.setdefault("cgroup2", mountpoint)
                elif fstype == "cgroup" and "memory" in opts.split(","):
                    found.setdefault("memory", mountpoint)
    except OSError:
        pass
    return found


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def memcg_headroom(pid: int) -> tuple[str | None, int | None]:
    """The tightest (cgroup dir, limit - usage) over the process's memory cgroups; limits at
    or above physical memory count as none."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    best: tuple[str | None, int | None] = (None, None)
    for d, limit_file, usage_file in _memcg_paths(pid):
        limit = _read_int(os.path.join(d, limit_file))
        usage = _read_int(os.path.join(d, usage_file))
        if limit is None or usage is None or limit >= ram:
            continue
        room = max(0, limit - usage)
        if best[1] is None or room < best[1]:
            best = (d, room)
    return best


def read_facts(pid: int, status: procfs.Status, shmem_rss_bytes: int) -> Facts:
    try:
        with open("/proc/buddyinfo") as f:
            free = parse_buddyinfo(f.read())
    except OSError:
        free = None
    memcg, room = memcg_headroom(pid)
    return Facts(
        thp_enabled=read_bracketed(f"{THP}/enabled"),
        defrag=read_bracketed(f"{THP}/defrag"),
        shmem_enabled=read_bracketed(f"{THP}/shmem_enabled"),
        thp_disabled_by_process=procfs.thp_disabled_by_process(status),
        shmem_rss_bytes=shmem_rss_bytes,
        free_huge_bytes=free,
        memcg=memcg,
        memcg_headroom_bytes=room,
    )


def _mib(n: int) -> str:
    return f"{n / MIB:,.0f} MiB"


def judge(f: Facts, pid: int, always_added_bytes: int, always_new_huge_bytes: int
          ) -> list[Hazard]:
    """The hazards that apply. always_new_huge_bytes: huge pages THP `always` would need that
    the process does not hold yet (what the free 2 MiB blocks must supply)."""
    out: list[Hazard] = []
    if f.thp_disabled_by_process:
        out.append(Hazard(
            "thp-disabled",
            f"process {pid} turned THP off for itself (prctl(PR_SET_THP_DISABLE), "
            "THP_enabled: 0 in its status; MariaDB does this): no setting gives it huge pages "
            "and the kernel refuses MADV_COLLAPSE on it",
            "start it without the opt-out (for mariadbd: LD_PRELOAD=workloads/bin/"
            "libthp-allow.so), or have it call prctl(PR_SET_THP_DISABLE, 1, "
            "PR_THP_DISABLE_EXCEPT_ADVISED, 0, 0) (Linux 6.18+: collapses still allowed)"))
    if f.shmem_rss_bytes >= HUGE_PAGE_BYTES and f.shmem_enabled in ("never", "deny"):
        out.append(Hazard(
            "shmem-never",
            f"{_mib(f.shmem_rss_bytes)} of its memory is shared memory and shmem_enabled is "
            f"{f.shmem_enabled}: no one can back it with huge pages (MADV_COLLAPSE is refused "
            "too; PostgreSQL's shared_buffers are such memory)",
            f"echo advise > {THP}/shmem_enabled (huge pages where the program asks) or "
            "within_size; or give the program hugetlb pages (PostgreSQL: huge_pages = on)"))
    if f.defrag in ("always", "madvise"):
        who = ("every THP fault" if f.defrag == "always" else
               "faults in MADV_HUGEPAGE memory (and under enabled=always, those of madvised "
               "ranges)")
        out.append(Hazard(
            "defrag-stalls",
            f"defrag is {f.defrag}: {who} may stall in direct compaction and reclaim when no "
            "free 2 MiB block is at hand (latency spikes of milliseconds)",
            f"echo defer+madvise > {THP}/defrag (kcompactd compacts in the background; "
            "only MADV_HUGEPAGE memory waits) or defer (nobody waits)"))
    if f.free_huge_bytes is not None and always_new_huge_bytes > 0 \
            and f.free_huge_bytes < always_new_huge_bytes:
        out.append(Hazard(
            "little-free-2m",
            f"only {_mib(f.free_huge_bytes)} of free memory lie in blocks of 2 MiB or more "
            f"(/proc/buddyinfo), THP-always would need {_mib(always_new_huge_bytes)} of new "
            "huge pages: faults fall back to 4 KiB pages or compact first",
            "echo 1 > /proc/sys/vm/compact_memory (one-off), or raise "
            "/proc/sys/vm/compaction_proactiveness; damon-hp's rule needs far fewer"))
    if f.memcg_headroom_bytes is not None and always_added_bytes > f.memcg_headroom_bytes:
        out.append(Hazard(
            "memcg-limit",
            f"its memory cgroup {f.memcg} has {_mib(f.memcg_headroom_bytes)} left below its "
            f"limit, THP-always would add {_mib(always_added_bytes)}: it would reclaim or be "
            "OOM-killed",
            "raise the cgroup's limit (memory.max; v1: memory.limit_in_bytes) by the growth, "
            "or use damon-hp's rule, which adds at most 1 MiB per 2 MiB made huge"))
    return out
