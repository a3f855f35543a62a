"""damon-hpd's /proc scan (selection.Scanner) against real processes: what it keeps of a
process it has seen is what a fresh read finds, an exec is seen at the next scan, what it
keeps is read again once REFRESH_S old, and a process caught inside an exec is never lost."""

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
        for _ in range(200):  # the exec takes a moment (and reads as None inside it)
            if getattr(selection.read_process(child.pid), "comm", None) == "sleep":
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


# Execs itself N times, alternating /bin/sh and /bin/dash (so the comm changes at every exec
# and the Scanner reads the process again at every scan), then execs `sleep 60`.
CHAIN = ('n=$1; if [ "$n" -gt 0 ]; then if [ $((n % 2)) -eq 0 ]; '
         'then exec /bin/sh -c "$0" "$0" $((n-1)); else exec /bin/dash -c "$0" "$0" $((n-1)); '
         'fi; fi; exec sleep 60')
EXECS = 2000


def test_a_process_caught_inside_an_exec_stays_listed_with_a_whole_record() -> None:
    """Inside execve the command line reads empty for a moment (the new mm has no arguments
    yet: selection.Scanner.scan). A process seen before must stay listed at every scan, with
    a record read whole, or damon-hpd releases it as exited. Unfixed, ~3 % of these scans
    lost it (30-36 of 1,056-1,145 scans in three runs, 2026-12-02)."""
    child = subprocess.Popen(["/bin/sh", "-c", f'read x; exec /bin/sh -c "$0" "$0" {EXECS}',
                              CHAIN], stdin=subprocess.PIPE, text=True)
    try:
        scanner = selection.Scanner()
        deadline = time.monotonic() + 10
        while child.pid not in by_pid(scanner.scan()):  # until the shell has started
            assert time.monotonic() < deadline
        child.stdin.write("go\n")
        child.stdin.flush()
        scans, lost, seen = 0, 0, set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            p = by_pid(scanner.scan()).get(child.pid)
            scans += 1
            if p is None:
                lost += 1
                continue
            # whole: never the empty command line read inside the exec
            assert p.cmdline and p.cmdline[0] in ("/bin/sh", "/bin/dash", "sleep"), p
            seen.add(p.comm)
            if p.comm == "sleep":
                break
        assert lost == 0, f"lost the process in {lost} of {scans} scans"
        assert seen == {"sh", "dash", "sleep"}, (seen, scans)
        assert scans > 100, "too few scans during the execs to have caught one inside"
    finally:
        child.kill()
        child.wait()
