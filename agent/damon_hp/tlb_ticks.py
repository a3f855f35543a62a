"""Test VM only: one process per CPU waking every few milliseconds, so that each CPU switches
address spaces and QEMU empties its software TLB, as a real CPU's small TLB misses constantly.

Why: DAMON clears accessed bits without flushing TLBs, so it sees an access only when the CPU
walks the page table again. QEMU's software TLB grows until it holds a whole hot set; a buffer
read all the time then looks idle to DAMON (seen in the VM: a 256 MiB buffer read at random
showed 0 % for 17 s, and an agent reading the event stream, which leaves the CPUs to the
target, saw no hot memory at all for 45 s). The test VM starts this for every command
(testvm.guest_script); run as `python -m damon_hp.tlb_ticks`, it ends with its parent.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PERIOD_S = 0.005
PR_SET_PDEATHSIG = 1


def _tick(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        time.sleep(PERIOD_S)


def main() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    children = []
    for cpu in sorted(os.sched_getaffinity(0)):
        pid = os.fork()
        if pid == 0:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            _tick(cpu)
        children.append(pid)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
