"""What the daemon's host tests share: hotcold copies under unique paths (so the rules select
only this test's processes, never another engineer's), a damon-hpd process with a private run
directory, `damon-hp status --json` as the user sees it, and the leftovers to look for.

Everything here waits on what the daemon says or writes (its log, its status records), with
deadlines generous for a loaded 2-core host; nothing waits on the passive source seeing a hot
set, whose timing is the foreign kdamond's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from damon_hp import procfs, status_records
from leftovers import damon_read, wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOTCOLD = ROOT / "workloads/bin/hotcold"
ADMIN = Path("/sys/kernel/mm/damon/admin")
MIB = 1 << 20
START_S = 60.0  # the daemon's start and first scan: seconds here, more on a loaded host


def running_kdamonds() -> set[str]:
    out = set()
    for d in (ADMIN / "kdamonds").glob("[0-9]*"):
        try:
            if damon_read(d / "state") == "on":
                out.add(damon_read(d / "pid"))
        except OSError:
            continue
    return out




def anon_huge(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0




class BudgetWatcher(threading.Thread):
    """Looks at the processes' huge pages twice a second until halted; keeps what broke: the
    managed ones together over `budget`, or any huge page in the excluded one (if any).
    `managed` may be changed while it runs (list append/remove are atomic in CPython): drop a
    pid before reaping its process, so that a reused pid is never counted."""

    def __init__(self, managed: list[int], excluded: int | None, budget: int) -> None:
        super().__init__(daemon=True)
        self.managed, self.excluded, self.budget = managed, excluded, budget
        self.looks = 0
        self.most = 0
        self.broken: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.5):
            total = sum(anon_huge(p) for p in list(self.managed))
            self.most = max(self.most, total)
            if total > self.budget:
                self.broken.append(f"{total / MIB:.0f} MiB huge over the "
                                   f"{self.budget / MIB:.0f} MiB budget")
            if self.excluded is not None and anon_huge(self.excluded):
                self.broken.append("the excluded process has huge pages")
            self.looks += 1


class Workloads:
    """hotcold copies named `names` in `folder`; every one started is killed by `stop_all`."""

    def __init__(self, folder: Path, names: list[str]) -> None:
        self.folder = folder
        for name in names:
            shutil.copy(HOTCOLD, folder / name)
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, key: str, exe: str, hot: str, cold: str, threads: int = 1,
              seconds: int = 150, nice: int = 0) -> int:
        """`nice`: for a CPU shared with the daemon (the test VM's one vCPU), where busy
        readers at the daemon's priority slow every `damon-hp status` to a minute."""
        self.procs[key] = subprocess.Popen(
            [str(self.folder / exe), "--hot", hot, "--cold", cold, "--threads", str(threads),
             "--seconds", str(seconds)], stdout=subprocess.PIPE, text=True,
            preexec_fn=(lambda: os.nice(nice)) if nice else None)
        return self.procs[key].pid

    def pid(self, key: str) -> int:
        return self.procs[key].pid

    def hot_range(self, key: str) -> tuple[int, int]:
        """The hot region hotcold reports on its first line (once its pages are written)."""
        p = self.procs[key]
        assert p.stdout is not None
        hot = json.loads(p.stdout.readline())["hot"]
        return hot["start"], hot["end"]

    def stop(self, key: str) -> None:
        p = self.procs[key]
        p.kill()
        p.wait()

    def stop_all(self) -> None:
        for p in self.procs.values():
            p.kill()
            p.wait()


class Daemon:
    """One damon-hpd; its stderr (the journal under systemd) goes to a file we can reread."""

    def __init__(self, config: Path, run_dir: Path, log: Path,
                 json_path: Path | None = None) -> None:
        self.env = {**os.environ, "DAMON_HP_RUN_DIR": str(run_dir)}
        self.run_dir = run_dir
        self.log_path = log
        args = [str(BIN / "damon-hpd"), "--config", str(config)]
        if json_path is not None:
            args += ["--json", str(json_path)]
        with open(log, "a") as err:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err, env=self.env,
                                         cwd=ROOT, start_new_session=True)
        self.pid = self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text()

    def running(self) -> bool:
        assert self.proc.poll() is None, f"damon-hpd exited early:\n{self.log()}"
        return True

    def managed(self) -> set[int]:
        """Target pids `damon-hp status --json` shows under this daemon."""
        self.running()
        return {r["target_pid"] for r in status(self.env)
                if r.get("agent_pid") == self.pid and r.get("alive")}

    def wait_managing(self, pids: set[int], timeout_s: float = START_S) -> float:
        return wait_for(f"damon-hpd {self.pid} to manage {sorted(pids)}",
                        lambda: pids <= self.managed(), timeout_s)

    def records(self) -> list[Path]:
        return sorted(self.run_dir.glob(f"agent-{self.pid}-*.json"))

    def record_path(self, target_pid: int) -> Path:
        """Where this daemon keeps its status record of `target_pid` (status_records.py)."""
        return self.run_dir / status_records.status_path(self.pid, target_pid).name

    def fds(self) -> int:
        """Open file descriptors, from the kernel (/proc/PID/fd)."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss(self) -> int:
        """Resident bytes (VmRSS)."""
        return procfs.read_status(self.pid).vm_rss

    def cpu_s(self) -> float:
        """CPU seconds used so far (utime + stime)."""
        return procfs.read_stat(self.pid).cpu_s

    def terminate(self, timeout_s: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def status(env: dict[str, str]) -> list[dict]:
    st = subprocess.run([str(BIN / "damon-hp"), "status", "--json"], capture_output=True,
                        text=True, env=env, timeout=60)
    assert st.returncode == 0, st.stderr
    return json.loads(st.stdout)["agents"]
