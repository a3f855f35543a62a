"""The only place that changes a target's memory: collapses and DAMOS huge-page marks.

- `Target` holds a pidfd on the process, so an exited and recycled PID can never be hit.
- `collapse` = process_madvise(MADV_COLLAPSE) on 2 MiB ranges of the target (Linux 6.1+;
  independent of the system THP mode). Each range is its own call, so each range's result is
  known: bytes collapsed, errno name, seconds taken.
- `mark_schemes` builds the DAMOS `hugepage` / `nohugepage` schemes limited to given ranges by
  address filters (MADV_HUGEPAGE and MADV_NOHUGEPAGE cannot be applied to another process except
  by DAMOS), and `collapse_scheme` the DAMOS `collapse` scheme of Linux 7.2+.
  The DAMON layer's `OwnedKdamond.set_schemes` installs them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from damon_hp.damon.model import AddrRange, Scheme
from damon_hp.errors import EnvironmentProblem
from damon_hp.policy import HUGE_PAGE_BYTES, Span

# Syscall numbers of the generic table, the same on x86-64 and arm64.
SYS_PIDFD_OPEN = 434
SYS_PROCESS_MADVISE = 440
MADV_HUGEPAGE = 14
MADV_NOHUGEPAGE = 15
MADV_COLLAPSE = 25

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def errno_name(code: int) -> str:
    return errno.errorcode.get(code, f"errno {code}")


class Target:
    """A process we act on, pinned by a pidfd (no PID-reuse race after `open`)."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.pidfd = pidfd

    @classmethod
    def open(cls, pid: int) -> Target:
        """Pin `pid`; EnvironmentProblem (exit 2) when it does not exist or is not ours to touch."""
        if pid <= 0:
            raise EnvironmentProblem(f"damon-hp: {pid} is not a process id (must be > 0)")
        fd = _syscall(ctypes.c_long(SYS_PIDFD_OPEN), ctypes.c_int(pid), ctypes.c_uint(0))
        if fd < 0:
            err = ctypes.get_errno()
            if err == errno.ESRCH:
                raise EnvironmentProblem(
                    f"damon-hp: no process {pid}: it does not exist or has already exited; "
                    f"check the PID with `ps -p {pid}`"
                )
            if err == errno.ENOSYS:
                raise EnvironmentProblem(
                    "damon-hp: this kernel has no pidfd_open (needs Linux 5.3+)"
                )
            raise EnvironmentProblem(
                f"damon-hp: cannot pin process {pid}: pidfd_open failed with {errno_name(err)}"
            )
        target = cls(pid, fd)
        if target.exited():
            # A zombie has a pidfd but no memory left to manage.
            target.close()
            raise EnvironmentProblem(f"damon-hp: process {pid} has already exited")
        return target

    def exited(self, timeout_s: float = 0.0) -> bool:
        """True once the process has exited (the pidfd turns readable), waiting up to timeout_s."""
        ready, _, _ = select.select([self.pidfd], [], [], timeout_s)
        return bool(ready)

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class ActionResult:
    """Outcome of one action on one range."""

    action: str  # collapse | hugepage | nohugepage
    start: int
    end: int
    bytes_done: int
    error: str | None  # errno name (EAGAIN, ENOMEM, EINVAL, ...) or None
    seconds: float

    def to_dict(self) -> dict:
        return {
            "action": self.action,
            "start": self.start,
            "end": self.end,
            "bytes": self.bytes_done,
            "error": self.error,
            "seconds": round(self.seconds, 6),
        }


def process_madvise(target: Target, start: int, length: int, advice: int) -> int:
    """One process_madvise call on [start, start + length); returns bytes advised or -errno."""
    iov = _IoVec(ctypes.c_void_p(start), ctypes.c_size_t(length))
    done = _syscall(
        ctypes.c_long(SYS_PROCESS_MADVISE),
        ctypes.c_int(target.pidfd),
        ctypes.byref(iov),
        ctypes.c_size_t(1),
        ctypes.c_int(advice),
        ctypes.c_uint(0),
    )
    if done < 0:
        return -ctypes.get_errno()
    return done


def collapse(target: Target, starts: Iterable[int]) -> list[ActionResult]:
    """Collapse each 2 MiB range now with process_madvise(MADV_COLLAPSE); one result per range.

    The kernel copies the range into a huge page synchronously (compacting or reclaiming if it
    must), charged to this process. A range that is not mapped, is VM_NOHUGEPAGE, or has no
    resident page fails with an errno that is recorded, not raised; ESRCH (target gone) stops
    the batch.
    """
    results = []
    for start in starts:
        t0 = time.monotonic()
        done = process_madvise(target, start, HUGE_PAGE_BYTES, MADV_COLLAPSE)
        seconds = time.monotonic() - t0
        error = None if done >= 0 else errno_name(-done)
        results.append(
            ActionResult("collapse", start, start + HUGE_PAGE_BYTES, max(done, 0), error, seconds)
        )
        if done == -errno.ESRCH:
            break
    return results


def _ranges(spans: Sequence[Span]) -> tuple[AddrRange, ...]:
    return tuple(AddrRange(s.start, s.end) for s in spans if s.end > s.start)


def mark_schemes(
    hugepage_marks: Sequence[Span], nohugepage_marks: Sequence[Span]
) -> list[Scheme]:
    """DAMOS schemes that keep `hugepage_marks` MADV_HUGEPAGE and `nohugepage_marks` NOHUGEPAGE.

    Each scheme matches every region (any size, frequency and age) and is limited to its ranges
    by address filters, so the kernel madvises exactly those ranges of the target. A scheme with
    no ranges is left out: without filters it would apply to the whole address space.
    """
    schemes = []
    if hugepage_marks:
        schemes.append(Scheme(action="hugepage", addr_filters=_ranges(hugepage_marks)))
    if nohugepage_marks:
        schemes.append(Scheme(action="nohugepage", addr_filters=_ranges(nohugepage_marks)))
    return schemes


def collapse_scheme(ranges: Sequence[Span]) -> Scheme | None:
    """The DAMOS `collapse` scheme (Linux 7.2+) limited to `ranges`, or None when empty."""
    if not ranges:
        return None
    return Scheme(action="collapse", addr_filters=_ranges(ranges))
