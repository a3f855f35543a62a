"""Give the daemon's freed heap back to the kernel (glibc's malloc_trim), once a round.

A round allocates and frees arrays of every size (pagemap entries, reverse-map columns,
event pages) between objects that live on (status records, the round history). glibc keeps
what is freed inside its heap, raises its mmap threshold after each large free (so later
large blocks come from the heap too), and gives memory back only from the heap's top: in a
30-minute soak with 100 processes coming and going a minute, damon-hpd's VmRSS grew 13.6 MiB
after its warm-up while the Python objects it held did not grow (tracemalloc), and with
MALLOC_TRIM_THRESHOLD_=0 MALLOC_MMAP_THRESHOLD_=131072 MALLOC_ARENA_MAX=1 it stayed flat
(2026-11-27, docs/daemon.md). malloc_trim(0) returns the free pages of every arena, those
inside the heap too (madvise MADV_DONTNEED, glibc 2.8+).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_looked = False


def release_free_heap() -> bool:
    """malloc_trim(0) where the C library has it (glibc); False where it has not (musl)."""
    global _trim, _looked
    if not _looked:
        _looked = True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
            fn = libc.malloc_trim
        except (OSError, AttributeError):
            fn = None
        if fn is not None:
            fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
            _trim = fn
    if _trim is None:
        return False
    _trim(0)
    return True
