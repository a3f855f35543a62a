"""Readers of /proc (and the THP mode in sysfs): what a process maps, holds and costs.

Read-only. Each reader raises `ProcessGone` when the process has exited, so the agent can tell a
finished target from a broken reader.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.ranges import (
    HUGE_PAGE_BYTES,
    PAGE_BYTES,
    AddrRange,
    huge_starts,
    intersect,
    merge_adjacent,
)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


class ProcessGone(DamonHpError):
    """The process exited (or was reaped) while we read its /proc files."""


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError) as e:
        raise ProcessGone(f"{path}: the process has exited") from e
    except OSError as e:
        # /proc/PID/* of a zombie or a vanishing task can fail with ESRCH.
        if e.errno == errno.ESRCH:
            raise ProcessGone(f"{path}: the process has exited") from e
        raise


@dataclass(frozen=True)
class Vma:
    """One line of /proc/PID/maps (a VMA) plus, when read from smaps, its counters in bytes."""

    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str
    counters: dict[str, int] = field(default_factory=dict, compare=False)
    vm_flags: list[str] = field(default_factory=list, compare=False)
    """smaps VmFlags (hg = MADV_HUGEPAGE, nh = MADV_NOHUGEPAGE); empty from read_maps"""

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def range(self) -> AddrRange:
        return AddrRange(self.start, self.end)

    @property
    def anonymous_private(self) -> bool:
        """Private memory not backed by a file: where MADV_COLLAPSE can build anon huge pages.

        Not a PROT_NONE mapping: no page of it can be touched, so none is ever resident, and
        servers reserve vast ones (MariaDB 10.11: an 8 TiB `---p` reservation beside its buffer
        pool, whose 4 M windows cost the agent 8 s of CPU to count at attach). When the owner
        mprotects a part of it usable, that part becomes a VMA of its own and is watched."""
        return (
            self.perms[3:4] == "p"
            and self.perms[:3] != "---"
            and self.inode == 0
            and self.path not in ("[vdso]", "[vvar]", "[vsyscall]", "[vvar_vclock]")
        )

    def counter(self, name: str) -> int:
        return self.counters.get(name, 0)


def _parse_map_line(line: str) -> Vma:
    parts = line.split(None, 5)
    lo, hi = parts[0].split("-")
    return Vma(
        start=int(lo, 16),
        end=int(hi, 16),
        perms=parts[1],
        offset=int(parts[2], 16),
        inode=int(parts[4]),
        path=parts[5].strip() if len(parts) > 5 else "",
    )


def parse_maps(text: str) -> list[Vma]:
    return [_parse_map_line(line) for line in text.splitlines() if line]


def read_maps(pid: int) -> list[Vma]:
    """The VMAs of `pid`, without counters (cheap: no page-table walk)."""
    return parse_maps(_read(f"/proc/{pid}/maps"))


def _parse_counter(line: str) -> tuple[str, int] | None:
    key, _, rest = line.partition(":")
    fields = rest.split()
    if not fields:
        return None
    try:
        value = int(fields[0])
    except ValueError:
        return None  # VmFlags and similar
    unit = fields[1] if len(fields) > 1 else ""
    return key, value * 1024 if unit == "kB" else value


def read_smaps(pid: int) -> list[Vma]:
    """The VMAs of `pid` with their smaps counters (Rss, AnonHugePages, ...) in bytes."""
    return parse_smaps(_read(f"/proc/{pid}/smaps"))


def parse_smaps(text: str) -> list[Vma]:
    maps: list[Vma] = []
    for line in text.splitlines():
        head = line.split(None, 1)[0] if line else ""
        if "-" in head and ":" not in head:
            maps.append(_parse_map_line(line))
        elif maps and line.startswith("VmFlags:"):
            maps[-1].vm_flags.extend(line.split()[1:])
        elif maps:
            parsed = _parse_counter(line)
            if parsed:
                maps[-1].counters[parsed[0]] = parsed[1]
    return maps


def smaps_rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup counters in bytes (Rss, AnonHugePages, ...)."""
    return parse_rollup(_read(f"/proc/{pid}/smaps_rollup"))


def parse_rollup(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        parsed = _parse_counter(line)
        if parsed:
            out[parsed[0]] = parsed[1]
    return out


@dataclass(frozen=True)
class RangeMemory:
    """Resident and huge-page bytes of the part of a process's memory inside some ranges."""

    rss_bytes: int
    anon_huge_bytes: int


def smaps_in_ranges(maps: Sequence[Vma], ranges: Iterable[AddrRange]) -> RangeMemory:
    """Rss and AnonHugePages of the VMAs inside `ranges` (from `read_smaps`).

    smaps counts per VMA, so for a VMA only partly inside a range this is an upper bound: the
    VMA's counter, capped at the overlap. Exact when the ranges are whole VMAs; `huge_bytes_in`
    is exact for any range.
    """
    rss = huge = 0
    for r in ranges:
        for m in maps:
            overlap = r.overlap(m.range)
            if overlap > 0:
                rss += min(m.counter("Rss"), overlap)
                huge += min(m.counter("AnonHugePages"), overlap)
    return RangeMemory(rss, huge)


@dataclass(frozen=True)
class Status:
    """Memory counters of /proc/PID/status, in bytes."""

    vm_rss: int
    vm_hwm: int
    vm_pte: int
    threads: int
    thp_disabled: bool = False
    """`THP_enabled: 0`: the process turned THP off for itself with prctl(PR_SET_THP_DISABLE)
    (inherited across fork, kept across exec), and the kernel refuses MADV_COLLAPSE on all its
    memory (EINVAL). With the flag PR_THP_DISABLE_EXCEPT_ADVISED (Linux 6.18+) the line stays 1
    and MADV_COLLAPSE is honoured (both seen on this host's 6.18). A kernel without THP shows
    0 for every process: see `thp_disabled_by_process`."""


def read_status(pid: int) -> Status:
    return parse_status(_read(f"/proc/{pid}/status"))


# The lines of /proc/PID/status that Status keeps: only those are parsed (of ~60; damon-hpd
# reads every managed process's status every round).
_STATUS_KEYS = frozenset(("VmRSS", "VmHWM", "VmPTE", "Threads", "THP_enabled"))


def parse_status(text: str) -> Status:
    values: dict[str, int] = {}
    for line in text.splitlines():
        if line.partition(":")[0] in _STATUS_KEYS and (parsed := _parse_counter(line)):
            values[parsed[0]] = parsed[1]
    return Status(
        vm_rss=values.get("VmRSS", 0),
        vm_hwm=values.get("VmHWM", 0),
        vm_pte=values.get("VmPTE", 0),
        threads=values.get("Threads", 0),
        thp_disabled=values.get("THP_enabled", 1) == 0,
    )


def thp_disabled_by_process(status: Status, thp_enabled_path: str = THP_ENABLED) -> bool:
    """The process disabled THP for itself (not: the kernel has no THP at all)."""
    return status.thp_disabled and os.path.exists(thp_enabled_path)


@dataclass(frozen=True)
class Stat:
    """Faults and CPU time from /proc/PID/stat (the process and its reaped children)."""

    comm: str
    state: str
    minflt: int
    majflt: int
    utime_s: float
    stime_s: float
    children_utime_s: float
    children_stime_s: float
    start_ticks: int
    flags: int = 0  # the kernel's task flags (PF_*)
    rss_pages: int = 0  # resident pages (get_mm_rss: per-CPU counters, read without summing)

    @property
    def cpu_s(self) -> float:
        return self.utime_s + self.stime_s

    @property
    def exiting(self) -> bool:
        """The task is in do_exit: its memory may already be half torn down (PF_EXITING)."""
        return bool(self.flags & PF_EXITING)


PF_EXITING = 0x4


def read_stat(pid: int | str) -> Stat:
    """Parse /proc/PID/stat (pid may be "self" or "PID/task/TID")."""
    return parse_stat(_read(f"/proc/{pid}/stat"))


def parse_stat(text: str) -> Stat:
    # comm may contain spaces and parentheses: it ends at the last ')'.
    lparen, rparen = text.index("("), text.rindex(")")
    comm = text[lparen + 1 : rparen]
    f = text[rparen + 2 :].split()
    # f[0] is field 3 (state); field N is f[N - 3].
    return Stat(
        comm=comm,
        state=f[0],
        minflt=int(f[7]),
        majflt=int(f[9]),
        utime_s=int(f[11]) / CLOCK_TICKS,
        stime_s=int(f[12]) / CLOCK_TICKS,
        children_utime_s=int(f[13]) / CLOCK_TICKS,
        children_stime_s=int(f[14]) / CLOCK_TICKS,
        start_ticks=int(f[19]),
        flags=int(f[6]),
        rss_pages=int(f[21]),
    )


def thp_mode(path: str = THP_ENABLED) -> str:
    """The system THP `enabled` mode: always, madvise or never ("unsupported" without THP)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return "unsupported"
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return "unknown"


# PAGEMAP_SCAN (Linux 6.7+): the kernel reports which pages of a range are in a category (present,
# PMD-mapped THP, ...), exactly and in one call per batch, instead of per-VMA totals.
class _PageRegion(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("start", "end", "categories")]


class _PmScanArg(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "size", "flags", "start", "end", "walk_end", "vec", "vec_len", "max_pages",
            "category_inverted", "category_mask", "category_anyof_mask", "return_mask",
        )
    ]


PAGE_IS_PRESENT = 1 << 3
PAGE_IS_HUGE = 1 << 6
_IOC_READ_WRITE = 3
PAGEMAP_SCAN = (
    (_IOC_READ_WRITE << 30) | (ctypes.sizeof(_PmScanArg) << 16) | (ord("f") << 8) | 16
)
_SCAN_BATCH = 256


class PagemapScanUnsupported(DamonHpError):
    """The kernel has no PAGEMAP_SCAN ioctl (before 6.7)."""


def open_pagemap(pid: int) -> tuple[int, str]:
    """/proc/PID/pagemap opened for reading, and its path: the one place it is opened.

    Present bits and PAGEMAP_SCAN need no privilege; frame numbers read as 0 without
    CAP_SYS_ADMIN (the reverse map checks that on what it reads)."""
    path = f"/proc/{pid}/pagemap"
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC), path
    except (FileNotFoundError, ProcessLookupError) as e:
        raise ProcessGone(f"{path}: the process has exited") from e
    except PermissionError as e:
        raise EnvironmentProblem(f"cannot read {path}: reading page frames needs root") from e


def huge_bytes_in(pid: int, ranges: Iterable[AddrRange]) -> int:
    """Bytes of `ranges` of `pid` mapped by PMD huge pages (THP or hugetlb), from PAGEMAP_SCAN."""
    fd, path = open_pagemap(pid)
    try:
        return _scan_huge(fd, path, ranges)
    finally:
        os.close(fd)


def pagemap_scan(fd: int, path: str, lo: int, hi: int, category: int) -> Iterator[AddrRange]:
    """The stretches of [lo, hi) whose pages are in `category` (PAGE_IS_HUGE, PAGE_IS_PRESENT),
    from PAGEMAP_SCAN on the open /proc/PID/pagemap `fd`, in address order.

    Raises PagemapScanUnsupported before yielding anything on kernels without the ioctl.
    """
    for start, end, _ in pagemap_scan_categories(fd, path, lo, hi, category, category):
        yield AddrRange(start, end)


def pagemap_scan_categories(fd: int, path: str, lo: int, hi: int, category: int,
                            report: int) -> Iterator[tuple[int, int, int]]:
    """(start, end, categories) of the stretches of [lo, hi) whose pages are in `category`,
    split where the `report` categories (a superset of `category`) change; see pagemap_scan.
    """
    vec = (_PageRegion * _SCAN_BATCH)()
    start = lo
    first = True
    while start < hi:
        arg = _PmScanArg(
            size=ctypes.sizeof(_PmScanArg),
            start=start,
            end=hi,
            vec=ctypes.addressof(vec),
            vec_len=_SCAN_BATCH,
            category_mask=category,
            return_mask=report,
        )
        try:
            n = fcntl.ioctl(fd, PAGEMAP_SCAN, arg, True)
        except OSError as e:
            if e.errno in (errno.ENOTTY, errno.EINVAL) and first:
                raise PagemapScanUnsupported(
                    f"PAGEMAP_SCAN on {path} failed ({errno.errorcode[e.errno]}): "
                    "this kernel has no page-table scan (needs Linux 6.7+)"
                ) from e
            if e.errno == errno.ESRCH:
                raise ProcessGone(f"{path}: the process has exited") from e
            raise
        first = False
        for i in range(n):
            yield vec[i].start, vec[i].end, vec[i].categories
        if arg.walk_end <= start:
            break
        start = arg.walk_end


def _scan_huge(fd: int, path: str, ranges: Iterable[AddrRange]) -> int:
    return sum(r.size for r in _scan_huge_regions(fd, path, ranges))


def _scan_huge_regions(fd: int, path: str, ranges: Iterable[AddrRange]) -> list[AddrRange]:
    """The parts of `ranges` mapped by PMD huge pages."""
    return [found for rng in ranges
            for found in pagemap_scan(fd, path, rng.start, rng.end, PAGE_IS_HUGE)]


# /proc/PID/pagemap: one u64 per virtual page; bit 63 = present in RAM (readable without root).
PAGEMAP_ENTRY_BYTES = 8
PAGEMAP_PRESENT = 1 << 63


def _resident_pages(fd: int, path: str, starts: Iterable[int]) -> dict[int, int]:
    """Resident (present) base pages of each 2 MiB range starting at `starts`.

    Ranges are joined into runs of neighbours and each run is asked of PAGEMAP_SCAN once (a
    dense run comes back as one stretch); without PAGEMAP_SCAN (before 6.7) the run's pagemap
    entries are read and their present bits counted.
    """
    wanted = sorted(set(starts))
    if any(start % HUGE_PAGE_BYTES for start in wanted):
        raise ValueError("resident pages are counted per 2 MiB-aligned range")
    counts = dict.fromkeys(wanted, 0)
    runs: list[list[int]] = []
    for start in wanted:
        if runs and runs[-1][1] == start:
            runs[-1][1] = start + HUGE_PAGE_BYTES
        else:
            runs.append([start, start + HUGE_PAGE_BYTES])
    try:
        for lo, hi in runs:
            for found in pagemap_scan(fd, path, lo, hi, PAGE_IS_PRESENT):
                addr = found.start
                while addr < found.end:
                    window = addr - addr % HUGE_PAGE_BYTES
                    upto = min(found.end, window + HUGE_PAGE_BYTES)
                    counts[window] += (upto - addr) // PAGE_BYTES
                    addr = upto
        return counts
    except PagemapScanUnsupported:
        pass
    counts = dict.fromkeys(wanted, 0)
    per_window = HUGE_PAGE_BYTES // PAGE_BYTES
    for lo, hi in runs:
        want = (hi - lo) // PAGE_BYTES * PAGEMAP_ENTRY_BYTES
        try:
            data = os.pread(fd, want, lo // PAGE_BYTES * PAGEMAP_ENTRY_BYTES)
        except OSError as e:
            if e.errno in (errno.ESRCH, errno.ENOENT):
                raise ProcessGone(f"{path}: the process has exited") from e
            raise
        entries = memoryview(data[: len(data) // PAGEMAP_ENTRY_BYTES * PAGEMAP_ENTRY_BYTES])
        entries = entries.cast("Q")
        for i in range(0, len(entries), per_window):
            counts[lo + i * PAGE_BYTES] = sum(
                1 for e in entries[i:i + per_window] if e & PAGEMAP_PRESENT)
    return counts


def resident_pages_in(pid: int, starts: Iterable[int]) -> dict[int, int]:
    """Resident base pages of each 2 MiB range of `pid` starting at `starts` (0..512 each)."""
    fd, path = open_pagemap(pid)
    try:
        return _resident_pages(fd, path, starts)
    finally:
        os.close(fd)


def pid_exists(pid: int) -> bool:
    """Whether a process with this pid exists (ours to signal or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_cmdline(pid: int) -> list[str]:
    """The process's argv ([] for a kernel thread)."""
    raw = _read(f"/proc/{pid}/cmdline")
    return [a for a in raw.split("\0") if a]


class ProcessFiles:
    """The /proc files of one process, opened once and re-read with pread.

    Opening a /proc file costs far more than reading it on a slow (emulated) machine, and the
    agent reads the same few files every snapshot; a seq_file re-read at offset 0 is fresh.
    """

    _NAMES = ("maps", "status", "smaps_rollup", "stat")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fds: dict[str, int] = {}
        self._maps: tuple[str, list[Vma]] = ("", [])
        """the last maps text read and its VMAs: a steady process's maps are read again every
        aggregation, and parsing ~30 lines cost more than reading them"""

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            path = f"/proc/{self.pid}/{name}"
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except (FileNotFoundError, ProcessLookupError) as e:
                raise ProcessGone(f"{path}: the process has exited") from e
            self._fds[name] = fd
        return fd

    def _text(self, name: str) -> str:
        fd = self._fd(name)
        chunks = []
        offset = 0
        try:
            while chunk := os.pread(fd, 1 << 16, offset):
                chunks.append(chunk)
                offset += len(chunk)
        except OSError as e:
            if e.errno in (errno.ESRCH, errno.ENOENT):
                raise ProcessGone(f"/proc/{self.pid}/{name}: the process has exited") from e
            raise
        return b"".join(chunks).decode(errors="replace")

    # Opening these pins the process's address space of that moment (mm): after an exec they
    # show the old, dead one, empty. status and stat follow the task and stay valid.
    _MM_BOUND = ("maps", "smaps", "smaps_rollup", "pagemap")

    def maps(self) -> list[Vma]:
        """VMAs; ProcessGone once the process has no memory left (exited, maybe unreaped).

        Empty maps through an old file mean an exit or an exec (a launcher such as `env` or
        `sh -c` exec-ing the real program): the files are reopened once to tell which.
        """
        maps = self._parsed_maps()
        if not maps:
            for name in self._MM_BOUND:
                fd = self._fds.pop(name, None)
                if fd is not None:
                    os.close(fd)
            maps = self._parsed_maps()
        if not maps:
            raise ProcessGone(f"/proc/{self.pid}/maps is empty: the process has exited")
        return list(maps)

    def _parsed_maps(self) -> list[Vma]:
        text = self._text("maps")
        if text != self._maps[0]:
            self._maps = (text, parse_maps(text))
        return self._maps[1]

    def maps_cover(self, r: AddrRange) -> bool:
        """Whether the process's VMAs map every byte of `r` now; False once it has no memory."""
        try:
            maps = self.maps()
        except ProcessGone:
            return False
        return any(m.contains(r) for m in merge_adjacent(v.range for v in maps))

    def status(self) -> Status:
        return parse_status(self._text("status"))

    def rollup(self) -> dict[str, int]:
        return parse_rollup(self._text("smaps_rollup"))

    def stat(self) -> Stat:
        return parse_stat(self._text("stat"))

    def huge_bytes_in(self, ranges: Iterable[AddrRange]) -> int:
        return _scan_huge(self._fd("pagemap"), f"/proc/{self.pid}/pagemap", ranges)

    def resident_pages(self, starts: Iterable[int]) -> dict[int, int]:
        """Resident base pages of each 2 MiB range starting at `starts` (0..512 each)."""
        return _resident_pages(self._fd("pagemap"), f"/proc/{self.pid}/pagemap", starts)

    def resident_by_window(self, ranges: Iterable[AddrRange]) -> dict[int, int]:
        """Resident base pages of every 2 MiB range that lies wholly inside one of `ranges`."""
        starts = [s for rng in ranges for s in huge_starts(rng)]
        return self.resident_pages(starts) if starts else {}

    def huge_regions_in(self, ranges: Iterable[AddrRange]) -> list[AddrRange]:
        """The parts of `ranges` mapped by PMD huge pages."""
        return _scan_huge_regions(self._fd("pagemap"), f"/proc/{self.pid}/pagemap", ranges)

    def flagged_in(self, ranges: Iterable[AddrRange], flag: str) -> list[AddrRange]:
        """The parts of `ranges` in VMAs whose smaps VmFlags carry `flag` (hg: MADV_HUGEPAGE).

        smaps walks the page tables of every VMA: for occasional checks, not every snapshot.
        """
        flagged = merge_adjacent(m.range for m in parse_smaps(self._text("smaps"))
                                 if flag in m.vm_flags)
        return intersect(ranges, flagged)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> ProcessFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
