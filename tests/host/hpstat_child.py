"""A child process for the hpstat and perf host tests, driven one command per stdin line;
`Child` (below) starts and drives it from a test.

As a script it prints {"pid": P} when ready, then one JSON line per command:
  touch N T    map N fresh 4 KiB pages (private, anonymous, MADV_NOHUGEPAGE so each write
               faults exactly once) and write one byte to each, split over T threads
               (T = 0: the main thread)  -> {"touched": N}
  huge K       map K 2 MiB-aligned areas (private, anonymous; no madvise) and write every
               4 KiB page of them        -> {"start": A, "end": B}
  madvise N    call madvise(MADV_COLD) N times on one page -> {"madvised": N}
  exit         exit 0
"""

import ctypes
import json
import mmap
import os
import subprocess
import sys
import threading

PAGE = 4096
HUGE = 2 << 20
MADV_COLD = 20
libc = ctypes.CDLL(None, use_errno=True)
keep = []  # mappings stay alive until exit: unmapping would add TLB work to later counts


def anon(nbytes: int) -> tuple[mmap.mmap, int]:
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    keep.append(m)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def touch(n: int, threads: int) -> None:
    m, _ = anon(n * PAGE)
    m.madvise(mmap.MADV_NOHUGEPAGE)

    def write(first: int, last: int) -> None:
        for i in range(first, last):
            m[i * PAGE] = 1

    if threads == 0:
        write(0, n)
        return
    bounds = [n * t // threads for t in range(threads + 1)]
    workers = [threading.Thread(target=write, args=(bounds[t], bounds[t + 1]))
               for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def huge(k: int) -> tuple[int, int]:
    m, base = anon((k + 1) * HUGE)
    start = -(-base // HUGE) * HUGE
    for off in range(start - base, start - base + k * HUGE, PAGE):
        m[off] = 1
    return start, start + k * HUGE


def madvise(n: int) -> None:
    _, addr = anon(PAGE)
    for _ in range(n):
        if libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(PAGE), MADV_COLD):
            raise OSError(ctypes.get_errno(), "madvise")


def reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    # Warm up the paths the commands use, so the counted runs fault only on their buffers.
    touch(256, 2)
    touch(256, 0)
    json.dumps({"x": 1})
    reply({"pid": os.getpid()})
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "touch":
            touch(int(args[0]), int(args[1]))
            reply({"touched": int(args[0])})
        elif cmd == "huge":
            start, end = huge(int(args[0]))
            reply({"start": start, "end": end})
        elif cmd == "madvise":
            madvise(int(args[0]))
            reply({"madvised": int(args[0])})
        elif cmd == "exit":
            return


def build_hpstat() -> str:
    """Build hpstat through the Makefile `make bpf` uses (a no-op when up to date)."""
    bpf = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bpf")
    done = subprocess.run(["make", "-s", "-C", bpf], capture_output=True, text=True,
                          check=False)
    binary = os.path.join(bpf, ".output", "hpstat")
    if done.returncode != 0 or not os.access(binary, os.X_OK):
        raise RuntimeError(f"make -C bpf failed:\n{done.stdout}{done.stderr}")
    return os.path.realpath(binary)


class Child:
    """The script above as a child of the test; stop() ends it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.pid: int = self.ask_raw()["pid"]

    def ask_raw(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the child process died (exit code {self.proc.wait()})")
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.ask_raw()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("exit\n")
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


if __name__ == "__main__":
    main()
