"""The memory THP would add to a process, from its mappings and its page table.

A huge page backs one whole 2 MiB-aligned virtual range inside one mapping (for shared memory
and files, also aligned in the file: the kernel maps a PMD only where virtual address and file
offset agree modulo 2 MiB). Per such range of the process, with `resident` of its 512 base
pages present now (pagemap), two rules say whether THP would put a huge page there:

- THP `always`, at fault: the first touch of an empty 2 MiB range faults in a whole huge page
  (do_huge_pmd_anonymous_page), so every range with at least one resident page would hold 512.
  Adds 512 - resident pages.
- khugepaged: collapses a range when at most `max_ptes_none` of its pages are absent
  (/sys/kernel/mm/transparent_hugepage/khugepaged/max_ptes_none; 511 by default: one resident
  page is enough). Adds 512 - resident pages where it would collapse.
A range already PMD-mapped reads 512 resident and adds nothing. A mapping marked
MADV_NOHUGEPAGE (`nh` in smaps VmFlags) gets neither.

Kinds: private anonymous memory (THP `enabled`), shared memory (shmem, SysV shm, memfd,
MAP_SHARED|MAP_ANONYMOUS: governed by `shmem_enabled` instead), file-backed (huge pages only by
khugepaged on read-only executable mappings, with CONFIG_READ_ONLY_THP_FOR_FS). The estimate is
made per kind for every kind; `counted` says whether THP `always` on this machine would really
act on it (so whether it enters "RSS under THP-always").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from damon_hp import procfs
from damon_hp.ranges import HUGE_PAGE_BYTES, PAGE_BYTES, PAGES_PER_HUGE, align_down, align_up

ANON, SHMEM, FILE = "anon", "shmem", "file"
KINDS = (ANON, SHMEM, FILE)
KIND_LABELS = {ANON: "private anonymous", SHMEM: "shared memory", FILE: "file-backed"}

# Shared memory shows in maps as a file on the kernel's internal shmem mount (SysV segments,
# shared anonymous mappings, memfds) or on a tmpfs a program opened.
_SHMEM_PREFIXES = ("/dev/zero", "/SYSV", "/memfd:", "/dev/shm/", "/run/shm/", "/[aio]")
_SPECIAL = ("[vdso]", "[vvar]", "[vsyscall]", "[vvar_vclock]", "[uprobes]")


def kind_of(m: procfs.Vma) -> str | None:
    """anon, shmem, file or None (a kernel-provided mapping no huge page can back)."""
    if m.path in _SPECIAL:
        return None
    if m.anonymous_private:
        return ANON
    shared = m.perms[3:4] == "s"
    if shared and m.path.startswith(_SHMEM_PREFIXES):
        return SHMEM
    if m.inode != 0:
        return FILE
    return SHMEM if shared else ANON


def name_of(m: procfs.Vma) -> str:
    return m.path or "[anon]"


def huge_slots(m: procfs.Vma, kind: str) -> list[int]:
    """Starts of the 2 MiB-aligned ranges wholly inside `m` where a PMD can map a huge page."""
    lo, hi = align_up(m.start), align_down(m.end)
    if kind != ANON and (m.start - m.offset) % HUGE_PAGE_BYTES:
        return []  # virtual address and file offset disagree modulo 2 MiB: no PMD mapping
    return list(range(lo, hi, HUGE_PAGE_BYTES)) if hi > lo else []


def always_adds(resident: int) -> int:
    """Base pages THP `always` adds to a range with `resident` pages (a fault fills it)."""
    return PAGES_PER_HUGE - resident if resident > 0 else 0


def khugepaged_adds(resident: int, max_ptes_none: int) -> int:
    """Base pages khugepaged adds to a range with `resident` pages (0 if it would not collapse)."""
    if resident <= 0 or PAGES_PER_HUGE - resident > max_ptes_none:
        return 0
    return PAGES_PER_HUGE - resident


@dataclass
class MappingGrowth:
    """One mapping: its resident memory and what each rule would add to it, in bytes."""

    start: int
    end: int
    kind: str
    name: str
    rss_bytes: int
    slots: int
    """2 MiB ranges where a huge page fits"""
    always_ranges: int
    always_added_bytes: int
    khugepaged_ranges: int
    khugepaged_added_bytes: int
    no_hugepage: bool = False
    """marked MADV_NOHUGEPAGE: no rule places a huge page here"""

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass
class KindGrowth:
    kind: str
    mappings: int = 0
    rss_bytes: int = 0
    always_ranges: int = 0
    always_added_bytes: int = 0
    khugepaged_ranges: int = 0
    khugepaged_added_bytes: int = 0
    counted: bool = True
    why: str = ""
    """why THP `always` here would, or would not, act on this kind"""

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass
class Growth:
    """The whole estimate. `always_resident` feeds the choices: range -> resident pages of
    every range THP `always` would make huge, in the kinds it counts."""

    rss_bytes: int
    max_ptes_none: int
    kinds: dict[str, KindGrowth]
    mappings: list[MappingGrowth]
    always_resident: dict[int, int] = field(default_factory=dict)
    always_kind: dict[int, str] = field(default_factory=dict)

    @property
    def added_bytes(self) -> int:
        return sum(k.always_added_bytes for k in self.kinds.values() if k.counted)

    @property
    def rss_always_bytes(self) -> int:
        return self.rss_bytes + self.added_bytes

    @property
    def added_pct(self) -> float:
        return 100.0 * self.added_bytes / self.rss_bytes if self.rss_bytes else 0.0

    def largest(self, n: int) -> list[MappingGrowth]:
        """The n mappings that would be largest under THP-always (RSS + growth)."""
        return sorted(self.mappings,
                      key=lambda m: (-(m.rss_bytes + m.always_added_bytes), m.start))[:n]

    def to_dict(self) -> dict[str, object]:
        return {"rss_bytes": self.rss_bytes, "rss_always_bytes": self.rss_always_bytes,
                "added_bytes": self.added_bytes, "added_pct": self.added_pct,
                "max_ptes_none": self.max_ptes_none,
                "kinds": {k: v.to_dict() for k, v in self.kinds.items()},
                "mappings": [m.to_dict() for m in self.mappings]}


@dataclass(frozen=True)
class KindRules:
    """Which kinds THP `always` would act on here, and why (from the machine's settings)."""

    shmem: bool
    shmem_why: str
    file: bool
    file_why: str


def estimate(maps: Sequence[procfs.Vma], resident: Mapping[int, int], rss_bytes: int,
             max_ptes_none: int, rules: KindRules) -> Growth:
    """Pure: the growth of each mapping of `maps` (smaps, with Rss and VmFlags) given the
    resident pages of each of its huge slots (`resident`: slot start -> 0..512; a slot not in
    it has none)."""
    kinds = {k: KindGrowth(k) for k in KINDS}
    kinds[ANON].why = "THP enabled=always faults huge pages in private anonymous memory"
    kinds[SHMEM].counted, kinds[SHMEM].why = rules.shmem, rules.shmem_why
    kinds[FILE].counted, kinds[FILE].why = rules.file, rules.file_why
    out: list[MappingGrowth] = []
    always_resident: dict[int, int] = {}
    always_kind: dict[int, str] = {}
    for m in maps:
        kind = kind_of(m)
        if kind is None:
            continue
        nh = "nh" in m.vm_flags
        slots = [] if nh else huge_slots(m, kind)
        if kind == FILE and not _file_candidate(m):
            slots = []
        g = MappingGrowth(m.start, m.end, kind, name_of(m), m.counter("Rss"), len(slots),
                          0, 0, 0, 0, nh)
        for s in slots:
            res = resident.get(s, 0)
            a, k = always_adds(res), khugepaged_adds(res, max_ptes_none)
            if res > 0:
                g.always_ranges += 1
                g.always_added_bytes += a * PAGE_BYTES
                if kinds[kind].counted:
                    always_resident[s] = res
                always_kind[s] = kind
            if res > 0 and PAGES_PER_HUGE - res <= max_ptes_none:
                g.khugepaged_ranges += 1
                g.khugepaged_added_bytes += k * PAGE_BYTES
        kg = kinds[kind]
        kg.mappings += 1
        kg.rss_bytes += g.rss_bytes
        kg.always_ranges += g.always_ranges
        kg.always_added_bytes += g.always_added_bytes
        kg.khugepaged_ranges += g.khugepaged_ranges
        kg.khugepaged_added_bytes += g.khugepaged_added_bytes
        out.append(g)
    return Growth(rss_bytes, max_ptes_none, kinds, out, always_resident, always_kind)


def _file_candidate(m: procfs.Vma) -> bool:
    # khugepaged collapses file memory only in read-only executable private mappings (program
    # text) under CONFIG_READ_ONLY_THP_FOR_FS; writable file mappings stay on base pages.
    return m.perms.startswith("r-x") and m.perms[3:4] == "p"


def all_slots(maps: Iterable[procfs.Vma]) -> list[int]:
    """Every huge slot of every mapping that may hold one (for one pagemap read)."""
    out: list[int] = []
    for m in maps:
        kind = kind_of(m)
        if kind is not None and "nh" not in m.vm_flags:
            out.extend(huge_slots(m, kind))
    return out


def read_kind_rules() -> KindRules:
    """Whether THP `always` here acts on shared memory and on files (sysfs, kernel config)."""
    shmem_mode = read_bracketed("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
    per_size = read_bracketed(
        "/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/shmem_enabled")
    effective = shmem_mode if per_size in ("inherit", "") else per_size
    shmem = effective in ("always", "force", "within_size")
    shmem_why = (f"shmem_enabled {shmem_mode}"
                 + (f" (2048kB: {per_size})" if per_size not in ("inherit", "") else "")
                 + (": shared memory faults huge pages" if shmem else
                    ": shared memory stays on base pages whatever `enabled` says"))
    from damon_hp import kconfig

    cfg = kconfig.read_running_config()
    ro = cfg is not None and cfg.value("READ_ONLY_THP_FOR_FS") == "y"
    file_why = ("CONFIG_READ_ONLY_THP_FOR_FS=y: khugepaged collapses program text (page cache)"
                if ro else "no CONFIG_READ_ONLY_THP_FOR_FS"
                + (" in this kernel" if cfg is not None else " known (kernel config unreadable)")
                + ": file memory is not made huge by THP settings")
    return KindRules(shmem, shmem_why, ro, file_why)


def read_bracketed(path: str) -> str:
    """The [selected] word of a THP sysfs file; "" when missing."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return ""
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text.strip()


def read_max_ptes_none() -> int:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/khugepaged/max_ptes_none") as f:
            return int(f.read())
    except (OSError, ValueError):
        return PAGES_PER_HUGE - 1  # the kernel's default


def measure(pid: int, rss_bytes: int, rules: KindRules | None = None,
            max_ptes_none: int | None = None) -> Growth:
    """Read the process's smaps and page table (read-only) and estimate its growth."""
    maps = procfs.read_smaps(pid)
    resident = procfs.resident_pages_in(pid, all_slots(maps))
    return estimate(maps, resident, rss_bytes,
                    read_max_ptes_none() if max_ptes_none is None else max_ptes_none,
                    rules or read_kind_rules())
