"""What `damon-hp doctor` reads: every fact about this machine, read-only, in one record.

`gather()` reads the system into a `Facts` record: kernel, config, DAMON sysfs (through the
DAMON layer's read-only `probe`), THP settings, syscall probes on scratch memory of its own,
tracefs, BTF, PMU and capabilities. It never writes to DAMON sysfs or to THP settings. The
record is JSON-able, so checks.py judges facts recorded on other machines the same way
(tests/fixtures/doctor-*.json).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import platform
import signal
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import damon, kconfig
from ..damon import module_pause
from ..damon.io import DamonBusy
from ..damon.status import detect_features
from ..errors import EnvironmentProblem
from ..ranges import HUGE_PAGE_BYTES

MADV_COLLAPSE = 25
THP = Path("/sys/kernel/mm/transparent_hugepage")


@dataclass
class Facts:
    """Everything doctor looked at; JSON-able so it can be recorded and judged again later."""

    release: str
    machine: str
    euid: int
    cap_eff: int
    kconfig_source: str | None
    kconfig: dict[str, str]  # only the options the fragment names
    damon: dict[str, Any]  # DamonStatus.to_dict()
    thp: dict[str, str | None]
    madv_collapse: str  # "ok" or an errno name
    process_madvise: str  # "ok" or an errno name
    tracefs: dict[str, Any]
    btf: bool
    pmu: dict[str, Any] = field(default_factory=dict)
    foreign: dict[str, Any] = field(default_factory=dict)
    """per running kdamond not ours (by index): its intervals and scheme actions, for the
    passive source"""
    paused: list[str] = field(default_factory=list)
    """DAMON modules damon-hp paused (--pause-damon-stat), as module_pause describes them"""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Facts:
        return cls(**d)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}


def _errname(code: int) -> str:
    return errno.errorcode.get(code, f"errno {code}")


@contextlib.contextmanager
def _scratch_huge_range():
    """An anonymous mapping with one 2 MiB-aligned 2 MiB range in it, untouched; yields
    (mmap object, offset of the aligned range, its address)."""
    m = mmap.mmap(-1, 2 * HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        off = (-base) % HUGE_PAGE_BYTES
        yield m, off, base + off
    finally:
        with contextlib.suppress(BufferError):
            m.close()


def probe_madv_collapse() -> str:
    """madvise(MADV_COLLAPSE) on 2 MiB of doctor's own scratch memory: "ok" or errno name."""
    with _scratch_huge_range() as (m, off, addr):
        m[off] = 1  # MADV_COLLAPSE needs at least one resident page in the range
        rc = _libc.madvise(ctypes.c_void_p(addr), HUGE_PAGE_BYTES, MADV_COLLAPSE)
        return "ok" if rc == 0 else _errname(ctypes.get_errno())


def probe_process_madvise() -> str:
    """process_madvise(MADV_COLLAPSE) through a pidfd on a forked child's scratch memory."""
    from .. import actuate  # the one module that calls process_madvise

    with _scratch_huge_range() as (m, off, addr):
        ready_r, ready_w = os.pipe()
        done_r, done_w = os.pipe()
        child = os.fork()
        if child == 0:  # the child: fault its own page in, then wait to be probed
            try:
                os.close(ready_r)
                os.close(done_w)
                m[off] = 1
                os.write(ready_w, b"r")
                os.read(done_r, 1)
            finally:
                os._exit(0)
        os.close(ready_w)
        os.close(done_r)
        try:
            os.read(ready_r, 1)
            try:
                target = actuate.Target.open(child)
            except EnvironmentProblem:
                return "ESRCH"
            with target:
                rc = actuate.process_madvise(target, addr, HUGE_PAGE_BYTES, MADV_COLLAPSE)
            return "ok" if rc >= 0 else _errname(-rc)
        finally:
            os.close(done_w)
            os.close(ready_r)
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)


def _perf_open(type_: int, config: int) -> str:
    nr = PERF_EVENT_OPEN.get(platform.machine())
    if nr is None:
        return "unknown arch"
    attr = bytearray(112)  # PERF_ATTR_SIZE_VER5
    flags = 1 | (1 << 5) | (1 << 6)  # disabled, exclude_kernel, exclude_hv
    struct.pack_into("<IIQQQQQ", attr, 0, type_, len(attr), config, 0, 0, 0, flags)
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    fd = _libc.syscall(ctypes.c_long(nr), buf, ctypes.c_int(0), ctypes.c_int(-1),
                       ctypes.c_int(-1), ctypes.c_ulong(8))  # PERF_FLAG_FD_CLOEXEC
    if fd < 0:
        return _errname(ctypes.get_errno())
    os.close(fd)
    return "ok"


def probe_pmu() -> dict[str, Any]:
    try:
        devices = sorted(os.listdir("/sys/bus/event_source/devices"))
    except OSError:
        devices = []
    return {
        "devices": devices,
        "cycles": _perf_open(0, 0),  # PERF_TYPE_HARDWARE, CPU_CYCLES
        # PERF_TYPE_HW_CACHE: DTLB | OP_READ << 8 | RESULT_MISS << 16
        "dtlb_load_misses": _perf_open(3, 3 | (0 << 8) | (1 << 16)),
    }


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _selected(text: str | None) -> str | None:
    """'always [madvise] never' -> 'madvise'."""
    if text is None:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text


def read_thp() -> dict[str, str | None]:
    return {
        "enabled": _selected(_read(THP / "enabled")),
        "defrag": _selected(_read(THP / "defrag")),
        "khugepaged_defrag": _read(THP / "khugepaged/defrag"),
        "khugepaged_pages_to_scan": _read(THP / "khugepaged/pages_to_scan"),
        "khugepaged_scan_sleep_millisecs": _read(THP / "khugepaged/scan_sleep_millisecs"),
        "khugepaged_max_ptes_none": _read(THP / "khugepaged/max_ptes_none"),
    }


def read_tracefs() -> dict[str, Any]:
    mount = None
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[2] == "tracefs":
                mount = parts[1]
                if mount == "/sys/kernel/tracing":
                    break
    except OSError:
        pass
    base = Path(mount) if mount else None

    readable = bool(base) and os.access(base, os.R_OK | os.X_OK)

    def is_dir(rel: str) -> bool:
        try:  # tracefs is mode 0700: a non-root doctor gets EACCES
            return bool(base and (base / rel).is_dir())
        except OSError:
            return False

    if mount is None:
        # The agent mounts tracefs when it starts (events.mount_tracefs); until then the
        # kernel's symbols say which tracepoints it would find.
        found = _tracepoints_in_kallsyms(("damon_aggregated", "mm_khugepaged_scan_pmd",
                                          "damon_monitor_intervals_tune"))
        return {
            "mount": None,
            "readable": False,
            "mountable": "tracefs" in (_read(Path("/proc/filesystems")) or ""),
            "damon_aggregated": "damon_aggregated" in found,
            "damon_monitor_intervals_tune": "damon_monitor_intervals_tune" in found,
            "huge_memory": "mm_khugepaged_scan_pmd" in found,
        }
    return {
        "mount": mount,
        "readable": readable,
        "damon_aggregated": is_dir("events/damon/damon_aggregated"),
        "damon_monitor_intervals_tune": is_dir("events/damon/damon_monitor_intervals_tune"),
        "huge_memory": is_dir("events/huge_memory"),
    }


def _tracepoints_in_kallsyms(names: tuple[str, ...]) -> set[str]:
    # Every tracepoint has a __traceiter_<name> function; symbol names are readable even
    # where kptr_restrict hides the addresses.
    wanted = {f"__traceiter_{n}": n for n in names}
    found = set()
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                name = line.rsplit(None, 1)[-1]
                if name in wanted:
                    found.add(wanted[name])
    except OSError:
        pass
    return found


def read_cap_eff() -> int:
    for line in (_read(Path("/proc/self/status")) or "").splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def gather(wants: list[kconfig.Want]) -> Facts:
    cfg = kconfig.read_running_config()
    names = {w.name for w in wants}
    try:
        status = damon.probe()
    except DamonBusy as e:
        # Another DAMON user held its sysfs lock past the agent's bound: say so as the reason
        # DAMON could not be read, not as a traceback.
        feats, src = detect_features(None, os.uname().release)
        status = damon.DamonStatus(True, False, str(e).removeprefix("damon-hp: "), (),
                                   "unknown", (), feats, src)
    return Facts(
        release=os.uname().release,
        machine=platform.machine(),
        euid=os.geteuid(),
        cap_eff=read_cap_eff(),
        kconfig_source=cfg.source if cfg else None,
        kconfig={n: cfg.value(n) for n in sorted(names)} if cfg else {},
        damon=status.to_dict(),
        thp=read_thp(),
        madv_collapse=probe_madv_collapse(),
        process_madvise=probe_process_madvise(),
        tracefs=read_tracefs(),
        btf=Path("/sys/kernel/btf/vmlinux").exists(),
        pmu=probe_pmu(),
        foreign=read_foreign_kdamonds(status),
        paused=[r.describe() for r in module_pause.read_records()],
    )


def read_foreign_kdamonds(status: damon.DamonStatus) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in status.foreign_running:
        out[str(k.index)] = {"intervals_us": damon.read_intervals(k.index),
                             "schemes": damon.scheme_actions(k.index)}
    return out
