"""A child process for host tests: a 2 MiB-aligned, fully populated anonymous buffer.

Run as `python memchild.py MIB [nohuge] [thp-off|thp-advised]`; prints {"start": A, "end": B,
"pid": P} once the buffer is populated, then waits until its stdin closes. With `nohuge` the
buffer is MADV_NOHUGEPAGE; `thp-off` turns THP off for the process first
(prctl(PR_SET_THP_DISABLE, 1)), `thp-advised` does it with PR_THP_DISABLE_EXCEPT_ADVISED (6.18+).
Meanwhile each stdin line `madvise START LENGTH ADVICE` (decimal) is madvise(2) done by the child
itself, as a DAMOS action is done on the target's own mm, and `thp-disable N FLAGS` is
prctl(PR_SET_THP_DISABLE, N, FLAGS), `munmap START LENGTH` unmaps part of the buffer (as a free
or an exit does), and with `spare` (an 8 MiB mapping made at start, never
remapped) `refault START LENGTH` gives those pages new frames without changing which pages are
present or any mapping (MADV_DONTNEED, the next LENGTH x 2 of the spare mapping written so that
the freed frames go to it, then every page written again); the child answers `ok` or `errno N`.
"""

import ctypes
import json
import mmap
import os
import sys

HUGE = 2 << 20
MADV_NOHUGEPAGE = 15
MADV_DONTNEED = 4
SPARE = 8 << 20
PR_SET_THP_DISABLE = 41
PR_THP_DISABLE_EXCEPT_ADVISED = 1 << 1


def thp_disable(libc: ctypes.CDLL, disable: int, flags: int) -> int:
    """prctl(PR_SET_THP_DISABLE); 0 or the errno."""
    if libc.prctl(PR_SET_THP_DISABLE, disable, flags, 0, 0):
        return ctypes.get_errno()
    return 0


def main() -> None:
    size = int(sys.argv[1]) << 20
    libc = ctypes.CDLL(None, use_errno=True)
    if "thp-off" in sys.argv[2:] or "thp-advised" in sys.argv[2:]:
        flags = PR_THP_DISABLE_EXCEPT_ADVISED if "thp-advised" in sys.argv[2:] else 0
        if err := thp_disable(libc, 1, flags):
            raise OSError(err, "prctl(PR_SET_THP_DISABLE)")
    buf = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    start = -(-base // HUGE) * HUGE
    if "nohuge" in sys.argv[2:]:
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(size), MADV_NOHUGEPAGE):
            raise OSError(ctypes.get_errno(), "madvise")
    for off in range(start - base, start - base + size, 4096):
        buf[off] = 1
    print(json.dumps({"pid": os.getpid(), "start": start, "end": start + size}), flush=True)
    spare = (mmap.mmap(-1, SPARE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
             if "spare" in sys.argv[2:] else None)
    spare_used = 0
    for line in sys.stdin:
        verb, *args = line.split()
        if verb == "refault":
            addr, length = map(int, args)
            if spare is None or spare_used + 2 * length > SPARE:
                print("errno 12", flush=True)  # ENOMEM: no spare frames left to take
                continue
            if libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(length), MADV_DONTNEED):
                print(f"errno {ctypes.get_errno()}", flush=True)
                continue
            for off in range(spare_used, spare_used + 2 * length, 4096):
                spare[off] = 1
            spare_used += 2 * length
            for off in range(addr - base, addr - base + length, 4096):
                buf[off] = 2
            print("ok", flush=True)
        if verb == "madvise":
            addr, length, advice = map(int, args)
            failed = libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(length), advice)
            print(f"errno {ctypes.get_errno()}" if failed else "ok", flush=True)
        elif verb == "munmap":
            addr, length = map(int, args)
            failed = libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(length))
            print(f"errno {ctypes.get_errno()}" if failed else "ok", flush=True)
        elif verb == "thp-disable":
            err = thp_disable(libc, int(args[0]), int(args[1]))
            print(f"errno {err}" if err else "ok", flush=True)


if __name__ == "__main__":
    main()
