"""The vm tier runs its VMs side by side (tests/vm_runs.py); a SIGTERM or Ctrl-C to the pytest
running them stops every VM, and the session ends at once instead of booting the next one.

Real VMs: a pytest of two vm tests, one per pinned kernel, so two VMs boot at once (the
VMs are in sessions of their own, so the signal reaches them only through the harness)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from leftovers import alive, wait_for

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PYTEST = PROJECT_ROOT / ".venv" / "bin" / "pytest"
TWO_KERNELS = "test_vm_runs_the_pinned_kernel"


def descendants(pid: int) -> dict[int, str]:
    """pid -> name of every process below `pid`, by parent links."""
    parent: dict[int, int] = {}
    name: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        close = stat.rindex(")")
        parent[int(entry)] = int(stat[close + 2:].split()[1])
        name[int(entry)] = stat[stat.index("(") + 1:close]
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        for child, ppid in parent.items():
            if ppid == p and child not in found:
                found[child] = name[child]
                frontier.append(child)
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_every_vm_of_the_tier_and_ends_the_session(
        sig: signal.Signals, tmp_path: Path) -> None:
    log = tmp_path / "pytest.log"
    env = dict(os.environ, DAMON_HP_VM_PARALLEL="2", PYTHONUNBUFFERED="1")
    with open(log, "w") as out:
        # SIGINT back to its default in the child, as a terminal's Ctrl-C finds it: a suite
        # started in the background by a non-interactive shell (nohup, CI) inherits SIGINT
        # ignored, and Python then never raises KeyboardInterrupt.
        proc = subprocess.Popen([str(PYTEST), "-p", "no:cacheprovider", "tests/vm", "-k",
                                 TWO_KERNELS], cwd=PROJECT_ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        def both_booting() -> bool:
            return len(re.findall(r"booting \S+ for 1 tests", log.read_text())) == 2

        wait_for("two VMs booting side by side", both_booting, 120)

        def two_qemus() -> list[int]:
            return [p for p, n in descendants(proc.pid).items() if n.startswith("qemu")]

        wait_for("a QEMU for each VM", lambda: len(two_qemus()) == 2, 60)
        time.sleep(3)  # into the boot, past the start-up of vng
        below = descendants(proc.pid)
        os.kill(proc.pid, sig)
        t0 = time.monotonic()
        code = proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    left = {p: n for p, n in below.items() if alive(p)}
    assert left == {}, f"still running after the session ended: {left}\n{text[-3000:]}"
    # SIGTERM: pytest.exit with 128+15; Ctrl-C: pytest's "interrupted" (2).
    assert code == (128 + signal.SIGTERM if sig == signal.SIGTERM else 2), text[-3000:]
    assert took < 30, f"the session took {took:.1f} s to end\n{text[-3000:]}"
    assert "passed" not in text.splitlines()[-1], text[-3000:]
    print(f"{sig.name}: {len(below)} processes below pytest, all gone {took:.1f} s later",
          file=sys.stderr)
