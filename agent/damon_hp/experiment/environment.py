"""The environment a set of runs saw: kernel, host or VM, CPU, memory, THP settings, swap, PMU,
git commit. Read-only."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from damon_hp import __version__
from damon_hp.experiment.memory import active_swap_bytes
from damon_hp.vmguard import in_vm

PROJECT_ROOT = Path(__file__).resolve().parents[3]
THP_DIR = Path("/sys/kernel/mm/transparent_hugepage")


def _bracketed(text: str) -> str:
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text.strip()


def thp_settings(root: Path = THP_DIR) -> dict[str, str]:
    out = {}
    for name in ("enabled", "defrag", "khugepaged/defrag", "khugepaged/pages_to_scan",
                 "khugepaged/scan_sleep_millisecs"):
        try:
            out[name] = _bracketed((root / name).read_text())
        except OSError:
            pass
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def pmu_available() -> bool:
    """A hardware PMU exposes /sys/bus/event_source/devices/cpu (or cpu_core on hybrids)."""
    base = Path("/sys/bus/event_source/devices")
    return (base / "cpu").exists() or (base / "cpu_core").exists()


def git_commit(root: Path = PROJECT_ROOT) -> str:
    try:
        r = subprocess.run(["git", "-C", str(root), "-c", "safe.directory=*", "rev-parse",
                            "HEAD"], capture_output=True, text=True, timeout=20, check=False)
        commit = r.stdout.strip()
        if r.returncode != 0 or not commit:
            return "unknown"
        d = subprocess.run(["git", "-C", str(root), "-c", "safe.directory=*", "status",
                            "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, timeout=20, check=False)
        return commit + (" (with uncommitted changes)" if d.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def capture() -> dict[str, Any]:
    swap = active_swap_bytes()
    return {
        "where": "vm" if in_vm() else "host",
        "kernel": platform.release(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "mem_total_bytes": mem_total_bytes(),
        "thp": thp_settings(),
        "swap": f"{swap / 2**20:.0f} MiB active" if swap else "none active at start",
        "pmu": "available" if pmu_available() else "n/a (no PMU: TLB counters unavailable)",
        "git_commit": git_commit(),
        "damon_hp_version": __version__,
        "python": sys.version.split()[0],
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
