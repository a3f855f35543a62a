"""Memory conditions: one cgroup v2 per run (the workload only, never the runner or the agent)
and, for the `insufficient` condition inside the VM, a zram swap device.

Every object here undoes itself: `RunCgroup.remove` kills what is left in the cgroup and removes
it; `ZramSwap.teardown` swaps off and resets the device it created. Neither touches a cgroup or a
swap device it did not create.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from damon_hp.errors import DamonHpError, EnvironmentProblem

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT_NAME = "damon-hp-experiment"


def cgroup2_available(root: Path = CGROUP_ROOT) -> bool:
    return (root / "cgroup.controllers").exists()


def _enable_controllers(path: Path, wanted: tuple[str, ...]) -> None:
    available = (path / "cgroup.controllers").read_text().split()
    missing = [c for c in wanted if c not in available]
    if missing:
        raise EnvironmentProblem(
            f"cgroup {path} lacks the {', '.join(missing)} controller(s); the experiment runner "
            "needs memory (limits, peaks, faults) and cpu (CPU time) accounting"
        )
    enabled = (path / "cgroup.subtree_control").read_text().split()
    todo = [c for c in wanted if c not in enabled]
    if todo:
        (path / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in todo))


def _read_kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                out[k] = int(v)
    except FileNotFoundError:
        pass
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


@dataclass
class CgroupStats:
    user_s: float | None
    sys_s: float | None
    minflt: int | None
    majflt: int | None
    peak_bytes: int | None
    swap_peak_bytes: int | None
    oom_kills: int | None


class RunCgroup:
    """/sys/fs/cgroup/damon-hp-experiment/<name>, holding one run's workload."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str, memory_max: int | None = None,
               root: Path = CGROUP_ROOT) -> RunCgroup:
        if not cgroup2_available(root):
            raise EnvironmentProblem(
                f"no cgroup v2 hierarchy at {root}; the experiment runner needs one for memory "
                "limits and per-run accounting (the test VM mounts it)"
            )
        _enable_controllers(root, ("memory", "cpu"))
        parent = root / PARENT_NAME
        parent.mkdir(exist_ok=True)
        _enable_controllers(parent, ("memory", "cpu"))
        path = parent / name
        if path.exists():
            cls(path).remove()  # a leftover of an interrupted earlier run of the same cell
        path.mkdir()
        cg = cls(path)
        if memory_max is not None:
            (path / "memory.max").write_text(str(memory_max))
            # Pressure should show as swapping, not as an early OOM kill.
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("max")
        return cg

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def stats(self) -> CgroupStats:
        cpu = _read_kv(self.path / "cpu.stat")
        mem = _read_kv(self.path / "memory.stat")
        events = _read_kv(self.path / "memory.events")
        return CgroupStats(
            user_s=cpu["user_usec"] / 1e6 if "user_usec" in cpu else None,
            sys_s=cpu["system_usec"] / 1e6 if "system_usec" in cpu else None,
            minflt=(mem["pgfault"] - mem.get("pgmajfault", 0)) if "pgfault" in mem else None,
            majflt=mem.get("pgmajfault"),
            peak_bytes=_read_int(self.path / "memory.peak"),
            swap_peak_bytes=_read_int(self.path / "memory.swap.peak"),
            oom_kills=events.get("oom_kill"),
        )

    def kill_all(self, timeout_s: float = 10.0) -> None:
        """Kill every process left in the cgroup and wait until it is empty."""
        deadline = time.monotonic() + timeout_s
        while self.pids():
            kill_file = self.path / "cgroup.kill"
            if kill_file.exists():
                kill_file.write_text("1")
            else:
                for pid in self.pids():
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass
            if time.monotonic() > deadline:
                raise DamonHpError(
                    f"processes {self.pids()} in {self.path} did not die within {timeout_s:.0f} s"
                )
            time.sleep(0.05)

    def remove(self) -> None:
        if not self.path.exists():
            return
        self.kill_all()
        for _ in range(100):
            try:
                self.path.rmdir()
                break
            except OSError as e:
                if e.errno == errno.ENOENT:
                    break
                if e.errno != errno.EBUSY:
                    raise
                time.sleep(0.05)  # zombies leave the cgroup a moment after dying
        parent = self.path.parent
        if parent.name == PARENT_NAME:
            try:
                parent.rmdir()
            except OSError:
                pass  # another run's cgroup is still there, or it is gone already


def active_swap_bytes() -> int:
    """Total size of the swap areas in use (from /proc/swaps)."""
    total = 0
    try:
        lines = Path("/proc/swaps").read_text().splitlines()[1:]
    except FileNotFoundError:
        return 0
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[2].isdigit():
            total += int(parts[2]) * 1024
    return total


class ZramSwap:
    """A zram swap device made for the experiment (VM only) and removed after it."""

    def __init__(self, device: str, hot_added: int | None) -> None:
        self.device = device
        self.hot_added = hot_added

    @classmethod
    def setup(cls, size_bytes: int) -> ZramSwap:
        if os.environ.get("DAMON_HP_IN_VM") != "1":
            raise EnvironmentProblem(
                "refusing to create a swap device outside the test VM (DAMON_HP_IN_VM is not 1)"
            )
        control = Path("/sys/class/zram-control")
        if not control.exists():
            r = subprocess.run(["modprobe", "zram", "num_devices=0"], capture_output=True,
                               text=True, check=False)
            if r.returncode != 0 and not control.exists():
                raise EnvironmentProblem(
                    f"cannot load the zram module ({r.stderr.strip() or 'modprobe failed'}); "
                    "set [insufficient] swap = \"none\" to run without swap (pressure then "
                    "shows as OOM kills)"
                )
        hot_added: int | None = None
        if (control / "hot_add").exists():
            hot_added = int((control / "hot_add").read_text().strip())
            dev_id = hot_added
        else:
            dev_id = 0
        sysdir = Path(f"/sys/block/zram{dev_id}")
        device = f"/dev/zram{dev_id}"
        swap = cls(device, hot_added)
        try:
            (sysdir / "disksize").write_text(str(size_bytes))
            for cmd in (["mkswap", device], ["swapon", device]):
                r = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if r.returncode != 0:
                    raise EnvironmentProblem(
                        f"{' '.join(cmd)} failed: {r.stderr.strip() or r.stdout.strip()}"
                    )
        except BaseException:
            swap.teardown()
            raise
        return swap

    def teardown(self) -> None:
        subprocess.run(["swapoff", self.device], capture_output=True, check=False)
        dev_id = self.device.removeprefix("/dev/zram")
        try:
            Path(f"/sys/block/zram{dev_id}/reset").write_text("1")
        except OSError:
            pass
        if self.hot_added is not None:
            try:
                Path("/sys/class/zram-control/hot_remove").write_text(str(self.hot_added))
            except OSError:
                pass
