"""damon-hpd's /proc scan (selection.Scanner) against real processes: what it keeps of a
process it has seen is what a fresh read finds, an exec is seen at the next scan, and what it
keeps is read again once REFRESH_S old."""

from __future__ import annotations

import subprocess
import sys
import time

from damon_hp.daemon import selection

# Prints a line, waits for one, then execs `sleep 60` (same pid and start time, a new comm).
CHILD = ("import os, sys; print('up', flush=True); sys.stdin.readline(); "
         "os.execvp('sleep', ['sleep', '60'])")


def by_pid(infos) -> dict:
    return {p.pid: p for p in infos}


def test_the_scanner_keeps_what_it_read_until_an_exec_or_the_refresh() -> None:
    now = [0.0]
    scanner = selection.Scanner(refresh_s=30.0, clock=lambda: now[0])
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        first = by_pid(scanner.scan())[child.pid]
        assert first == selection.read_process(child.pid)
        assert first.comm.startswith("python")
        now[0] += 5
        again = by_pid(scanner.scan())[child.pid]
        assert again is first  # kept, not read again
        child.stdin.write("go\n")
        child.stdin.flush()
        for _ in range(200):  # the exec takes a moment
            if selection.read_process(child.pid).comm == "sleep":
                break
            time.sleep(0.01)
        now[0] += 5
        after = by_pid(scanner.scan())[child.pid]
        assert after.comm == "sleep" and after.cmdline == ("sleep", "60")
        assert after.start_ticks == first.start_ticks
        now[0] += 5
        assert by_pid(scanner.scan())[child.pid] is after
        now[0] += 30
        refreshed = by_pid(scanner.scan())[child.pid]
        assert refreshed is not after and refreshed == after
        # every process a plain scan finds, the scanner finds (less any that came or went)
        plain, kept = by_pid(selection.scan()), by_pid(scanner.scan())
        assert child.pid in plain and plain[child.pid] == kept[child.pid]
    finally:
        child.kill()
        child.wait()
    assert child.pid not in by_pid(scanner.scan())
