"""The ground-truth microbenchmarks (hotcold, phases, gups) as real processes on this host.

What the agent's scoring relies on: the printed ranges are real, separate, 2 MiB-aligned
anonymous mappings of the requested sizes (checked in /proc/PID/maps and smaps), resident, not
madvised; the JSON lines have the documented shape; SIGTERM ends a run with its final line; bad
flags exit 2. Nothing global is touched.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from thp_settings import require_thp_mode

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
BIN = WORKLOADS / "bin"
MIB = 1 << 20
HUGE = 2 * MIB


@pytest.fixture(scope="session", autouse=True)
def built() -> None:
    r = subprocess.run(["make", "-s", "-C", str(WORKLOADS)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"make -C workloads failed:\n{r.stdout}{r.stderr}")


class Running:
    """A microbenchmark started in the background; its first JSON line already read."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen([str(BIN / argv[0]), *argv[1:]], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.first = json.loads(self.proc.stdout.readline())

    def stop(self) -> tuple[int, list[dict]]:
        """SIGTERM, then the exit status and every remaining JSON line."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        return self.proc.returncode, json_lines(out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def start() -> Iterator:
    started: list[Running] = []

    def _start(*argv: str) -> Running:
        started.append(Running(*argv))
        return started[-1]

    yield _start
    for r in started:
        r.kill()


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True,
                          timeout=120)


def json_lines(text: str) -> list[dict]:
    """The JSON lines of a run less its once-a-second progress lines."""
    return [d for d in map(json.loads, text.splitlines()) if "progress" not in d]


def smaps_entries(pid: int) -> dict[tuple[int, int], dict[str, str]]:
    """(start, end) of every mapping -> its smaps fields (values as text) and its maps line."""
    entries: dict[tuple[int, int], dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(None, 1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            current = {"line": line}
            entries[(lo, hi)] = current
        else:
            key, _, value = line.partition(":")
            current[key] = value.strip()
    return entries


def kib(field: str) -> int:
    return int(field.split()[0])


def assert_own_resident_mapping(pid: int, start: int, end: int) -> dict[str, str]:
    entries = smaps_entries(pid)
    assert (start, end) in entries, f"no /proc/{pid}/maps line is exactly {start:#x}-{end:#x}"
    e = entries[(start, end)]
    fields = e["line"].split()
    assert fields[1] == "rw-p" and fields[4] == "0" and len(fields) == 5, e["line"]  # anonymous
    assert start % HUGE == 0
    assert kib(e["Rss"]) * 1024 == end - start  # every 4 KiB page was touched
    assert "hg" not in e["VmFlags"].split()  # not madvise(MADV_HUGEPAGE)d
    return e


def test_hotcold_ranges_are_exact_resident_unadvised_mappings_of_the_asked_sizes(start):
    hc = start("hotcold", "--hot", "6M", "--cold", "10M", "--threads", "2", "--seconds", "0")
    info = hc.first
    assert set(info) == {"pid", "hot", "cold"} and info["pid"] == hc.proc.pid
    hot, cold = info["hot"], info["cold"]
    assert hot["end"] - hot["start"] == 6 * MIB
    assert cold["end"] - cold["start"] == 10 * MIB
    assert hot["end"] <= cold["start"] or cold["end"] <= hot["start"]
    assert_own_resident_mapping(hc.proc.pid, hot["start"], hot["end"])
    assert_own_resident_mapping(hc.proc.pid, cold["start"], cold["end"])

    code, lines = hc.stop()
    assert code == 0
    assert len(lines) == 1
    assert lines[0]["stopped_by"] == "SIGTERM"
    assert lines[0]["ops"] > 0 and lines[0]["ops_per_s"] > 0 and lines[0]["seconds"] > 0


def test_hotcold_odd_size_is_rounded_to_whole_pages_only():
    # 1 MiB + 1 byte: the range printed is what was asked; the mapping is the 4 KiB round-up.
    r = run("hotcold", "--hot", "1048577", "--cold", "4K", "--seconds", "0.1")
    assert r.returncode == 0, r.stderr
    first, last = json_lines(r.stdout)
    assert first["hot"]["end"] - first["hot"]["start"] == 1048577
    assert first["cold"]["end"] - first["cold"]["start"] == 4096
    assert last["stopped_by"] == "timeout" and last["ops"] > 0


def test_phases_moves_the_hot_set_through_each_region_in_order():
    r = run("phases", "--regions", "3", "--region-size", "2M", "--phase-seconds", "0.2",
            "--phases", "4", "--threads", "2")
    assert r.returncode == 0, r.stderr
    lines = json_lines(r.stdout)
    head, phases, tail = lines[0], lines[1:-1], lines[-1]
    regions = [(g["start"], g["end"]) for g in head["regions"]]
    assert len(regions) == 3 and len(set(regions)) == 3
    assert all(e - s == 2 * MIB and s % HUGE == 0 for s, e in regions)
    assert [p["phase"] for p in phases] == [0, 1, 2, 3]
    assert [p["region"] for p in phases] == [0, 1, 2, 0]
    assert [(p["start"], p["end"]) for p in phases] == [regions[i] for i in (0, 1, 2, 0)]
    monos = [p["t_mono"] for p in phases]
    walls = [p["t_wall"] for p in phases]
    assert monos == sorted(monos) and walls == sorted(walls)
    assert all(w > 1e9 for w in walls)  # seconds since the epoch, not since boot
    assert tail["phases"] == 4 and tail["stopped_by"] == "timeout" and tail["ops"] > 0


def test_phases_regions_are_separate_resident_mappings_and_sigterm_ends_the_run(start):
    ph = start("phases", "--regions", "2", "--region-size", "4M", "--phase-seconds", "30",
               "--phases", "0")
    for g in ph.first["regions"]:
        assert_own_resident_mapping(ph.proc.pid, g["start"], g["end"])
    first_phase = json.loads(ph.proc.stdout.readline())
    assert first_phase["phase"] == 0 and first_phase["start"] == ph.first["regions"][0]["start"]
    code, lines = ph.stop()
    assert code == 0
    assert lines[-1]["stopped_by"] == "SIGTERM" and lines[-1]["phases"] == 1


def _rss(pid: int, region: dict) -> int:
    entry = smaps_entries(pid)[(region["start"], region["end"])]
    return int(entry["Rss"].split()[0]) * 1024


def _frames(pid: int, region: dict) -> list[int]:
    """The frame numbers of the region's pages (root reads real ones)."""
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        f.seek(region["start"] // 4096 * 8)
        raw = f.read((region["end"] - region["start"]) // 4096 * 8)
    return [int.from_bytes(raw[i:i + 8], "little") & ((1 << 55) - 1)
            for i in range(0, len(raw), 8)]


def test_phases_lazy_writes_a_region_at_its_phase_and_a_never_read_one_beside_it(start):
    ph = start("phases", "--regions", "3", "--region-size", "8M", "--phase-seconds", "30",
               "--phases", "2", "--lazy")
    pid, (r0, r1, r2) = ph.proc.pid, ph.first["regions"]
    first_phase = json.loads(ph.proc.stdout.readline())
    assert first_phase["region"] == 0
    # region 0 and the never-read region 2 are written; region 1 waits for its phase
    assert _rss(pid, r0) == 8 * MIB and _rss(pid, r2) == 8 * MIB and _rss(pid, r1) == 0
    # written page by page in turn: their frames interleave in physical memory
    f0, f2 = _frames(pid, r0), _frames(pid, r2)
    assert min(f0) < max(f2) and min(f2) < max(f0)
    ph.proc.send_signal(signal.SIGUSR1)
    second = json.loads(ph.proc.stdout.readline())
    assert second["region"] == 1 and _rss(pid, r1) == 8 * MIB
    code, lines = ph.stop()
    assert code == 0 and lines[-1]["phases"] == 2


def test_gups_does_exactly_the_asked_updates_and_reports_ns_per_update():
    r = run("gups", "--size", "16M", "--updates", "200001", "--threads", "2")
    assert r.returncode == 0, r.stderr
    first, last = json_lines(r.stdout)
    assert first["table"]["end"] - first["table"]["start"] == 16 * MIB
    assert first["table"]["start"] % HUGE == 0
    assert last["updates"] == 200001 and last["threads"] == 2 and last["size"] == 16 * MIB
    assert last["hugepage"] is False and last["stopped_by"] == "done"
    assert last["ns_per_update"] > 0
    assert last["ns_per_update"] == pytest.approx(last["seconds"] * 1e9 / 200001, rel=1e-3)


def test_gups_hugepage_flag_madvises_its_table_and_gets_huge_pages(start):
    require_thp_mode("madvise", "always", why="under 'never' MADV_HUGEPAGE gives no huge pages")
    g = start("gups", "--size", "32M", "--seconds", "0", "--hugepage")
    table = g.first["table"]
    e = smaps_entries(g.proc.pid)[(table["start"], table["end"])]
    assert "hg" in e["VmFlags"].split()
    assert kib(e["AnonHugePages"]) > 0
    code, lines = g.stop()
    assert code == 0 and lines[-1]["hugepage"] is True and lines[-1]["anon_huge_kb"] > 0


def test_gups_without_the_flag_leaves_its_table_unadvised(start):
    g = start("gups", "--size", "8M", "--seconds", "0")
    table = g.first["table"]
    e = smaps_entries(g.proc.pid)[(table["start"], table["end"])]
    assert "hg" not in e["VmFlags"].split()
    code, lines = g.stop()
    assert code == 0 and lines[-1]["stopped_by"] == "SIGTERM"


@pytest.mark.parametrize("argv", [
    ("hotcold", "--hot", "4M", "--cold", "4M"),
    ("gups", "--size", "4M"),
], ids=["hotcold", "gups"])
def test_sparse_region_is_its_own_unadvised_mapping_with_one_resident_page_per_stride(start, argv):
    require_thp_mode("madvise", "never", why="under 'always' any fault may take a huge page")
    w = start(*argv, "--sparse", "10M", "--stride", "128K", "--seconds", "0")
    sparse = w.first["sparse"]
    assert sparse["end"] - sparse["start"] == 10 * MIB and sparse["start"] % HUGE == 0
    assert sparse["stride"] == 128 * 1024 and sparse["touched_pages"] == 80
    e = smaps_entries(w.proc.pid)[(sparse["start"], sparse["end"])]
    assert "hg" not in e["VmFlags"].split()
    assert kib(e["Rss"]) == 80 * 4 and kib(e["AnonHugePages"]) == 0
    code, lines = w.stop()
    assert code == 0 and lines[-1]["stopped_by"] == "SIGTERM"


@pytest.mark.parametrize("program", ["hotcold", "gups"])
def test_without_sparse_there_is_no_sparse_region(program):
    r = run(program, "--seconds", "0.1", *(["--hot", "4M", "--cold", "4M"] if program == "hotcold"
                                          else ["--size", "4M"]))
    assert r.returncode == 0, r.stderr
    assert "sparse" not in json_lines(r.stdout)[0]


BAD_FLAGS = [
    ("hotcold", ["--bogus"]),
    ("hotcold", ["--hot", "12Q"]),
    ("hotcold", ["--hot", "0"]),
    ("hotcold", ["--threads", "0"]),
    ("hotcold", ["--seconds", "-1"]),
    ("hotcold", ["--threads"]),
    ("hotcold", ["stray"]),
    ("phases", ["--regions", "0"]),
    ("phases", ["--phase-seconds", "0"]),
    ("phases", ["--region-size", "1x"]),
    ("gups", ["--updates", "10", "--seconds", "1"]),
    ("gups", ["--size", "4"]),
    ("gups", ["--updates", "0"]),
    ("hotcold", ["--sparse", "1x"]),
    ("hotcold", ["--stride", "1000"]),
    ("gups", ["--sparse", "-1"]),
    ("gups", ["--stride", "0"]),
]


@pytest.mark.parametrize("program,args", BAD_FLAGS, ids=[f"{p} {' '.join(a)}" for p, a in
                                                          BAD_FLAGS])
def test_bad_flags_print_usage_and_exit_2(program, args):
    r = run(program, *args)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.startswith(f"{program}: ") and "usage:" in r.stderr


@pytest.mark.parametrize("program", ["hotcold", "phases", "gups"])
def test_help_prints_usage_on_stdout_and_exits_0(program):
    r = run(program, "--help")
    assert r.returncode == 0 and r.stdout.startswith(f"usage: {program}")
