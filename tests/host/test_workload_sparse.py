"""The sparse microbenchmark as a real process on this host.

What the later THP-overhead experiment relies on: on 4 KiB pages the sparse region holds exactly
one resident page per stride (so the process's RSS is hot + cold + sparse/16 with the default
64 KiB stride), and with --madvise-hugepage (MADV_HUGEPAGE before the first touch, which under
the host's THP mode "madvise" makes faults take huge pages as THP "always" would) the same
touches make nearly the whole sparse region resident. Checked in /proc/PID/smaps and
smaps_rollup. Nothing global is touched; no timing is asserted beyond "a retouch happened
within a second", so another process keeping a core busy does not matter.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from thp_settings import require_thp_mode

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
SPARSE = WORKLOADS / "bin" / "sparse"
KIB = 1024
MIB = 1 << 20
HUGE = 2 * MIB


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    r = subprocess.run(["make", "-s", "-C", str(WORKLOADS)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"make -C workloads failed:\n{r.stdout}{r.stderr}")



def results(out: str) -> list[dict]:
    """The JSON lines of a run less its once-a-second progress lines."""
    return [d for d in map(json.loads, out.splitlines()) if "progress" not in d]

class Sparse:
    """sparse started with --seconds 0; its first JSON line read (all memory touched by then)."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([str(SPARSE), "--seconds", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line, f"sparse printed nothing: {self.proc.communicate()[1]}"
        self.first = json.loads(line)

    def region(self, name: str) -> dict[str, str]:
        """The smaps entry of the mapping that is exactly the named range."""
        r = self.first[name]
        entries = smaps_entries(self.proc.pid)
        assert (r["start"], r["end"]) in entries, f"{name} is not one whole mapping"
        return entries[(r["start"], r["end"])]

    def rollup_kib(self, field: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} in smaps_rollup")

    def stop(self) -> tuple[int, list[dict]]:
        """SIGTERM, then the exit status and every remaining JSON line."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=60)
        return self.proc.returncode, results(out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def start() -> Iterator:
    started: list[Sparse] = []

    def _start(*args: str) -> Sparse:
        started.append(Sparse(*args))
        return started[-1]

    yield _start
    for s in started:
        s.kill()


def smaps_entries(pid: int) -> dict[tuple[int, int], dict[str, str]]:
    """(start, end) of every mapping -> its smaps fields (values as text)."""
    entries: dict[tuple[int, int], dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(None, 1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            current = {}
            entries[(lo, hi)] = current
        else:
            key, _, value = line.partition(":")
            current[key] = value.strip()
    return entries


def kib(field: str) -> int:
    return int(field.split()[0])


def size_of(r: dict) -> int:
    return r["end"] - r["start"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SPARSE), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("sparse,stride,touched", [
    ("512M", "64K", 8192),   # the default stride: 1 page in 16
    ("10M", "4M", 3),        # a partial last stride still has its first page touched
    ("8M", "4K", 2048),      # stride 4K: dense
])
def test_on_4k_pages_the_sparse_region_holds_one_page_per_stride(start, sparse, stride, touched):
    require_thp_mode("madvise", "never", why="under 'always' any fault may take a huge page")
    s = start("--hot", "32M", "--cold", "8M", "--sparse", sparse, "--stride", stride)
    info = s.first
    assert set(info) == {"pid", "hot", "cold", "sparse"} and info["pid"] == s.proc.pid
    assert set(info["sparse"]) == {"start", "end", "stride", "touched_pages"}
    assert info["sparse"]["touched_pages"] == touched
    for name in ("hot", "cold", "sparse"):
        assert info[name]["start"] % HUGE == 0
        e = s.region(name)
        assert "hg" not in e["VmFlags"].split()  # nothing madvised without the flag
        assert kib(e["AnonHugePages"]) == 0
    assert kib(s.region("hot")["Rss"]) * KIB == 32 * MIB
    assert kib(s.region("cold")["Rss"]) * KIB == 8 * MIB
    assert kib(s.region("sparse")["Rss"]) * KIB == touched * 4 * KIB

    code, lines = s.stop()
    assert code == 0 and len(lines) == 1
    last = lines[0]
    assert set(last) == {"retouches", "ops", "seconds", "ops_per_s", "cpu_s", "stopped_by"}
    assert last["stopped_by"] == "SIGTERM" and last["retouches"] == 0 and last["ops"] > 0


def test_process_rss_is_hot_plus_cold_plus_a_sixteenth_of_the_sparse_region(start):
    require_thp_mode("madvise", "never", why="under 'always' any fault may take a huge page")
    s = start("--hot", "64M", "--cold", "16M", "--sparse", "1G")
    expected = size_of(s.first["hot"]) + size_of(s.first["cold"]) + size_of(s.first["sparse"]) // 16
    rss = s.rollup_kib("Rss") * KIB
    # the rest of the process (binary, libc, stack, thread) is about 2 MiB of these 144 MiB
    assert abs(rss - expected) <= 0.04 * expected, (rss / MIB, expected / MIB)
    assert s.rollup_kib("AnonHugePages") == 0


def test_madvise_hugepage_makes_the_sparse_touches_fault_in_whole_huge_pages(start):
    require_thp_mode("madvise", "always", why="without THP or under 'never' MADV_HUGEPAGE "
                     "gives no huge pages")
    s = start("--hot", "32M", "--cold", "8M", "--sparse", "512M", "--madvise-hugepage")
    sparse = s.region("sparse")
    assert "hg" in sparse["VmFlags"].split()  # madvised, and before the touches (below)
    sparse_size = size_of(s.first["sparse"])
    four_k_rss = s.first["sparse"]["touched_pages"] * 4 * KIB  # 32 MiB on 4 KiB pages
    # Every 2 MiB of the region holds 32 touched pages: each first touch faulted in a whole huge
    # page. A fault that found no free huge page falls back to 4 KiB, hence the margin.
    assert kib(sparse["AnonHugePages"]) * KIB >= sparse_size // 2
    assert kib(sparse["Rss"]) * KIB >= 8 * four_k_rss
    assert s.rollup_kib("Rss") * KIB >= 32 * MIB + 8 * MIB + sparse_size // 2
    code, lines = s.stop()
    assert code == 0 and lines[-1]["stopped_by"] == "SIGTERM"


def test_retouch_reads_the_sparse_pages_again_without_making_more_resident(start):
    require_thp_mode("madvise", "never", why="under 'always' any fault may take a huge page")
    s = start("--hot", "8M", "--cold", "4M", "--sparse", "64M", "--retouch-seconds", "0.05")
    before = kib(s.region("sparse")["Rss"])
    assert before * KIB == 64 * MIB // 16
    # sparse waits 0.05 s between retouches: a second leaves room for a loaded machine
    time.sleep(1.0)
    after = kib(s.region("sparse")["Rss"])
    code, lines = s.stop()
    assert code == 0
    assert lines[-1]["retouches"] >= 1
    assert after == before


BAD_ARGS = [
    ["--bogus"],
    ["--sparse", "0"],
    ["--sparse", "1x"],
    ["--stride", "1000"],
    ["--stride", "0"],
    ["--stride"],
    ["--retouch-seconds", "-1"],
    ["--threads", "0"],
    ["--seconds", "x"],
    ["--hot", "32"],
    ["stray"],
]


@pytest.mark.parametrize("args", BAD_ARGS, ids=[" ".join(a) for a in BAD_ARGS])
def test_bad_arguments_exit_2_with_a_message_and_the_usage(args):
    r = run(*args)
    assert r.returncode == 2
    assert r.stdout == ""
    first, _, rest = r.stderr.partition("\n")
    assert first.startswith("sparse: ") and len(first) > len("sparse: ")
    assert rest.startswith("usage: sparse")


def test_help_prints_usage_on_stdout_and_exits_0():
    r = run("--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: sparse") and r.stderr == ""


def test_a_timed_run_prints_two_json_lines_and_exits_0():
    r = run("--hot", "4M", "--cold", "4K", "--sparse", "8M", "--threads", "2", "--seconds", "0.2")
    assert r.returncode == 0, r.stderr
    first, last = results(r.stdout)
    assert size_of(first["cold"]) == 4096 and size_of(first["sparse"]) == 8 * MIB
    assert last["stopped_by"] == "timeout" and last["ops"] > 0 and last["seconds"] > 0
