"""The host's per-process THP always (workloads/bin/libthp-always.so + glibc.malloc.hugetlb=1):
under the host's global THP mode madvise, memory a program mmaps itself and memory it mallocs
both fault in as huge pages, read back from AnonHugePages; without it, none do. The global
THP settings are read, never written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from damon_hp.experiment import arms
from thp_settings import require_thp_mode

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "workloads" / "bin"
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")



@pytest.fixture(autouse=True)
def _madvise_host() -> None:
    require_thp_mode("madvise", why="the shim is a THP-always for hosts in THP mode madvise")


def _anon_huge_kb(argv: list[str], env: dict[str, str]) -> tuple[int, int]:
    """Run a microbenchmark until its first line (all memory touched); its Rss and
    AnonHugePages in kB at that moment."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        first = proc.stdout.readline()  # type: ignore[union-attr]
        assert first.startswith('{"pid"'), first
        rollup = Path(f"/proc/{proc.pid}/smaps_rollup").read_text()
    finally:
        proc.kill()
        proc.wait()
    values = {line.split(":")[0]: int(line.split()[1]) for line in rollup.splitlines()[1:]}
    return values["Rss"], values["AnonHugePages"]


@pytest.fixture(scope="module")
def shim() -> Path:
    if not arms.THP_ALWAYS_SHIM.exists():
        subprocess.run(["make", "-C", str(ROOT / "workloads")], check=True,
                       capture_output=True)
    return arms.THP_ALWAYS_SHIM


def test_mmapd_memory_is_huge_with_the_shim_and_not_without(shim):
    argv = [str(BIN / "hotcold"), "--hot", "64M", "--cold", "64M", "--seconds", "30"]
    before = THP.read_text()
    _, plain = _anon_huge_kb(argv, dict(os.environ))
    rss, huge = _anon_huge_kb(argv, dict(os.environ, **arms.thp_always_env()))
    assert plain == 0
    assert huge >= 128 * 1024  # both 64 MiB regions, every 2 MiB of them
    assert rss >= huge
    assert THP.read_text() == before


def test_sparse_memory_is_inflated_by_the_shim(shim):
    argv = [str(BIN / "sparse"), "--hot", "16M", "--cold", "16M", "--sparse", "256M",
            "--seconds", "30"]
    rss_plain, huge_plain = _anon_huge_kb(argv, dict(os.environ))
    rss, huge = _anon_huge_kb(argv, dict(os.environ, **arms.thp_always_env()))
    assert huge_plain == 0
    assert huge >= (16 + 16 + 256) * 1024
    assert rss >= 4 * rss_plain  # 256 MiB touched one page in 16: 16x on huge pages


@pytest.mark.parametrize("argv", [
    ["hotcold", "--hot", "16M", "--cold", "16M"],
    ["gups", "--size", "16M"],
], ids=["hotcold", "gups"])
def test_the_sparse_heap_of_hotcold_and_gups_is_inflated_by_the_shim(shim, argv):
    # host.toml's THP memory overhead on gups and hotcold comes from this region
    argv = [str(BIN / argv[0]), *argv[1:], "--sparse", "256M", "--seconds", "30"]
    rss_plain, huge_plain = _anon_huge_kb(argv, dict(os.environ))
    rss, huge = _anon_huge_kb(argv, dict(os.environ, **arms.thp_always_env()))
    assert huge_plain == 0
    assert huge >= 256 * 1024
    assert rss - rss_plain >= 200 * 1024  # 16 of 256 MiB resident on 4 KiB pages, all on 2 MiB


def test_mallocd_memory_is_huge_with_the_shim(shim):
    code = ("b = bytearray(64 << 20)\n"
            "for i in range(0, len(b), 4096): b[i] = 1\n"
            "print([l for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHuge')][0]"
            ".split()[1])\n")
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env=dict(os.environ))
    shimmed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env=dict(os.environ, **arms.thp_always_env()))
    assert int(plain.stdout) == 0
    assert int(shimmed.stdout) >= 60 * 1024


def test_the_environment_keeps_what_was_there():
    env = arms.thp_always_env({"LD_PRELOAD": "/x.so", "GLIBC_TUNABLES": "glibc.a.b=1"})
    assert env["LD_PRELOAD"] == f"{arms.THP_ALWAYS_SHIM} /x.so"
    assert env["GLIBC_TUNABLES"] == "glibc.a.b=1:glibc.malloc.hugetlb=1"
    assert arms.thp_always_env({}) == {"LD_PRELOAD": str(arms.THP_ALWAYS_SHIM),
                                       "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
