"""The test VM is what the vm tier promises: the pinned kernel, a free DAMON with vaddr,
tracefs, cgroup2, loadable modules (zram) and DAMON_HP_IN_VM set."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from damon_hp.testvm import pinned_kernel

DAMON_ADMIN = Path("/sys/kernel/mm/damon/admin")


def _mounts() -> dict[str, str]:
    """mount point -> filesystem type."""
    out = {}
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, mnt, fstype, *_ = line.split()
        out[mnt] = fstype
    return out


@pytest.mark.both_kernels
def test_vm_runs_the_pinned_kernel(vm_kernel: str):
    assert os.uname().release == pinned_kernel(vm_kernel).release


def test_in_vm_flag_is_set():
    assert os.environ.get("DAMON_HP_IN_VM") == "1"


def test_damon_sysfs_offers_vaddr_and_paddr_operations():
    kdamonds = DAMON_ADMIN / "kdamonds"
    existing = sorted(kdamonds.glob("*/contexts/*/avail_operations"))
    if existing:
        # An earlier vm test left a kdamond directory: its context lists the same set.
        ops = existing[0].read_text().split()
    else:
        # No kdamond directory: make a scratch one (ours alone in this VM) and remove it.
        (kdamonds / "nr_kdamonds").write_text("1")
        try:
            contexts = kdamonds / "0" / "contexts"
            (contexts / "nr_contexts").write_text("1")
            ops = (contexts / "0" / "avail_operations").read_text().split()
        finally:
            (kdamonds / "nr_kdamonds").write_text("0")
        assert (kdamonds / "nr_kdamonds").read_text().strip() == "0"
    assert "vaddr" in ops
    assert "paddr" in ops


def test_tracefs_is_mounted_with_damon_events():
    assert _mounts().get("/sys/kernel/tracing") == "tracefs"
    assert Path("/sys/kernel/tracing/events/damon/damon_aggregated").is_dir()


def test_cgroup2_is_mounted_with_memory_controller():
    assert _mounts().get("/sys/fs/cgroup") == "cgroup2"
    assert "memory" in Path("/sys/fs/cgroup/cgroup.controllers").read_text().split()


def test_zram_module_loads_from_the_unpacked_kernel():
    module_file = subprocess.run(["modinfo", "-n", "zram"], check=True, capture_output=True,
                                 text=True).stdout.strip()
    assert module_file.startswith(f"/lib/modules/{os.uname().release}/")
    # An earlier vm test may have loaded zram (and removed its devices): leave it as found.
    loaded_before = Path("/sys/module/zram").is_dir()
    if not loaded_before:
        subprocess.run(["modprobe", "zram"], check=True, capture_output=True, text=True)
    try:
        assert Path("/sys/module/zram").is_dir()
        assert Path("/sys/class/zram-control/hot_add").exists()
    finally:
        if not loaded_before:
            subprocess.run(["modprobe", "-r", "zram"], check=False)
