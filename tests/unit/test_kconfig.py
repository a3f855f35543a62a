"""Kernel config parsing and the damon-hp.config fragment."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from damon_hp import kconfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

CONFIG = """\
#
# Automatically generated file; DO NOT EDIT.
#
CONFIG_DAMON=y
CONFIG_DAMON_VADDR=y
# CONFIG_DAMON_PADDR is not set
CONFIG_ZRAM=m
CONFIG_DEFAULT_HOSTNAME="(none)"
CONFIG_NR_CPUS=64
"""


def test_config_values_y_m_strings_and_not_set():
    cfg = kconfig.parse_config(CONFIG, "test")
    assert cfg.value("DAMON") == "y"
    assert cfg.value("CONFIG_ZRAM") == "m"
    assert cfg.value("DAMON_PADDR") == "n"
    assert cfg.value("DEFAULT_HOSTNAME") == "(none)"
    assert cfg.value("NR_CPUS") == "64"
    assert cfg.value("NEVER_MENTIONED") == "n"


def test_fragment_marks_each_option_required_or_optional_with_a_reason():
    wants = kconfig.parse_fragment(
        "# header\n\n# required: needed\nCONFIG_A=y\n# optional: nice\nCONFIG_B=m\n")
    assert [(w.name, w.value, w.required, w.reason) for w in wants] == [
        ("CONFIG_A", "y", True, "needed"), ("CONFIG_B", "m", False, "nice")]


def test_fragment_option_without_a_mark_is_an_error():
    with pytest.raises(ValueError, match="CONFIG_B has no"):
        kconfig.parse_fragment("# required: x\nCONFIG_A=y\nCONFIG_B=y\n")


def test_builtin_or_module_both_satisfy_y_and_m():
    want_y = kconfig.Want("CONFIG_ZRAM", "y", False, "")
    want_m = kconfig.Want("CONFIG_ZRAM", "m", False, "")
    for w in (want_y, want_m):
        assert w.satisfied_by("y") and w.satisfied_by("m")
        assert not w.satisfied_by("n")


def test_project_fragment_lists_what_damon_hp_cannot_run_without():
    wants = {w.name: w for w in kconfig.load_fragment()}
    for name in ("CONFIG_DAMON", "CONFIG_DAMON_SYSFS",
                 "CONFIG_TRANSPARENT_HUGEPAGE", "CONFIG_ADVISE_SYSCALLS",
                 "CONFIG_PROC_PAGE_MONITOR"):
        assert wants[name].required, name
    # vaddr or paddr will do: each is one access source (damon/sources.py)
    for name in ("CONFIG_DAMON_VADDR", "CONFIG_DAMON_PADDR", "CONFIG_TRANSPARENT_HUGEPAGE_MADVISE",
                 "CONFIG_BPF_SYSCALL", "CONFIG_DEBUG_INFO_BTF", "CONFIG_PERF_EVENTS",
                 "CONFIG_TRACEPOINTS", "CONFIG_FTRACE", "CONFIG_MEMCG", "CONFIG_SWAP",
                 "CONFIG_ZRAM"):
        assert not wants[name].required, name
    assert all(w.reason for w in wants.values())


def test_check_against_recorded_host_config_finds_only_vaddr_missing():
    facts = json.loads((FIXTURES / "doctor-host-6.18.44.json").read_text())["facts"]
    cfg = kconfig.KernelConfig(facts["kconfig_source"], facts["kconfig"])
    bad = [r.want.name for r in kconfig.check(cfg, kconfig.load_fragment()) if not r.ok]
    assert bad == ["CONFIG_DAMON_VADDR"]


def test_running_config_is_read_from_a_gzip_file(tmp_path, monkeypatch):
    path = tmp_path / "config.gz"
    path.write_bytes(gzip.compress(CONFIG.encode()))
    monkeypatch.setenv("DAMON_HP_KERNEL_CONFIG", str(path))
    cfg = kconfig.read_running_config()
    assert cfg is not None and cfg.source == str(path)
    assert cfg.value("DAMON_VADDR") == "y"
