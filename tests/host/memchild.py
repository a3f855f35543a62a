"""A child process for host tests: a 2 MiB-aligned, fully populated anonymous buffer.

Run as `python memchild.py MIB [nohuge]`; prints {"start": A, "end": B, "pid": P} once the buffer
is populated, then waits until its stdin closes. With `nohuge` the buffer is MADV_NOHUGEPAGE.
Meanwhile each stdin line `madvise START LENGTH ADVICE` (decimal) is madvise(2) done by the child
itself, as a DAMOS action is done on the target's own mm; the child answers `ok` or `errno N`.
"""

import ctypes
import json
import mmap
import os
import sys

HUGE = 2 << 20
MADV_NOHUGEPAGE = 15


def main() -> None:
    size = int(sys.argv[1]) << 20
    buf = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    start = -(-base // HUGE) * HUGE
    if "nohuge" in sys.argv[2:]:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(size), MADV_NOHUGEPAGE):
            raise OSError(ctypes.get_errno(), "madvise")
    for off in range(start - base, start - base + size, 4096):
        buf[off] = 1
    print(json.dumps({"pid": os.getpid(), "start": start, "end": start + size}), flush=True)
    libc = ctypes.CDLL(None, use_errno=True)
    for line in sys.stdin:
        verb, *args = line.split()
        if verb == "madvise":
            addr, length, advice = map(int, args)
            failed = libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(length), advice)
            print(f"errno {ctypes.get_errno()}" if failed else "ok", flush=True)


if __name__ == "__main__":
    main()
