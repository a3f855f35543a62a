"""procfs readers against real processes of this host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from collapse_errors import until_settled
from damon_hp import actuate, procfs
from damon_hp.ranges import HUGE_PAGE_BYTES, AddrRange

CHILD = Path(__file__).with_name("memchild.py")


@pytest.fixture
def child():
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), "8"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    info = json.loads(proc.stdout.readline())
    yield info
    proc.stdin.close()
    proc.wait(timeout=30)


def test_smaps_shows_the_populated_buffer_as_resident_and_not_huge(child) -> None:
    maps = procfs.read_smaps(child["pid"])
    mem = procfs.smaps_in_ranges(maps, [AddrRange(child["start"], child["end"])])
    assert mem.rss_bytes == child["end"] - child["start"]
    assert mem.anon_huge_bytes == 0
    vma = next(m for m in maps if m.start <= child["start"] < m.end)
    assert vma.anonymous_private
    assert "rd" in vma.vm_flags and "wr" in vma.vm_flags and "nh" not in vma.vm_flags
    assert vma.counter("Anonymous") >= child["end"] - child["start"]


def test_maps_and_smaps_list_the_same_vmas(child) -> None:
    plain = [(m.start, m.end, m.perms, m.path) for m in procfs.read_maps(child["pid"])]
    full = [(m.start, m.end, m.perms, m.path) for m in procfs.read_smaps(child["pid"])]
    assert plain == full


def test_file_mappings_are_not_anonymous_private(child) -> None:
    maps = procfs.read_maps(child["pid"])
    python_text = [m for m in maps if m.path and m.path.startswith("/") and m.inode]
    assert python_text and not any(m.anonymous_private for m in python_text)


def test_a_prot_none_reservation_is_not_watched_and_its_usable_part_is() -> None:
    """A server-style reservation: 1 TiB PROT_NONE, the first 8 MiB of it made usable and
    written. Only the usable part is memory a collapse can back (and worth counting)."""
    code = ("import ctypes, mmap, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.mmap.restype = ctypes.c_void_p\n"
            "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,"
            " ctypes.c_int, ctypes.c_long]\n"
            "size = 1 << 40\n"
            # PROT_NONE private memory is not committed (no overcommit charge)
            "base = libc.mmap(None, size, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)\n"
            "assert base not in (None, ctypes.c_void_p(-1).value)\n"
            "assert libc.mprotect(ctypes.c_void_p(base), 8 << 20, 3) == 0\n"
            "ctypes.memset(base, 1, 8 << 20)\n"
            "print(base, size, flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        base, size = map(int, proc.stdout.readline().split())
        maps = procfs.read_maps(proc.pid)
        usable = next(m for m in maps if m.start == base)
        reserved = next(m for m in maps if m.start == base + (8 << 20))
        assert usable.perms.startswith("rw") and usable.end == reserved.start
        assert reserved.perms == "---p" and reserved.end == base + size
        assert usable.anonymous_private and not reserved.anonymous_private
        watched = [m.range for m in maps if m.anonymous_private]
        assert not any(r.start < reserved.end and reserved.start < r.end for r in watched)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_rollup_and_status_agree_on_resident_memory_after_collapse(child) -> None:
    with actuate.Target.open(child["pid"]) as target:
        until_settled(lambda s: actuate.collapse(target, s),
                      range(child["start"], child["end"], HUGE_PAGE_BYTES))
    rollup = procfs.smaps_rollup(child["pid"])
    status = procfs.read_status(child["pid"])
    assert rollup["AnonHugePages"] >= child["end"] - child["start"]
    assert status.vm_rss >= child["end"] - child["start"]
    assert status.vm_pte > 0
    assert status.threads == 1


def test_stat_counts_the_faults_of_populating_the_buffer(child) -> None:
    st = procfs.read_stat(child["pid"])
    assert st.comm.startswith("python")
    # One minor fault per 4 KiB page written (no THP at fault: the buffer is not madvised).
    assert st.minflt >= (child["end"] - child["start"]) // 4096


def test_stat_parses_a_command_name_with_spaces_and_parentheses() -> None:
    code = "open('/proc/self/comm', 'w').write('a) (b c'); print(flush=True); input()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        proc.stdout.readline()
        st = procfs.read_stat(proc.pid)
        assert st.comm == "a) (b c"
        assert st.state in "SR"
        assert st.minflt > 0
    finally:
        proc.kill()
        proc.wait()


def test_readers_raise_process_gone_for_an_exited_process() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    for reader in (procfs.read_smaps, procfs.read_status, procfs.read_stat, procfs.smaps_rollup):
        with pytest.raises(procfs.ProcessGone):
            reader(proc.pid)
    with pytest.raises(procfs.ProcessGone):
        procfs.huge_bytes_in(proc.pid, [AddrRange(0, HUGE_PAGE_BYTES)])


def test_thp_mode_is_one_of_the_kernel_modes() -> None:
    assert procfs.thp_mode() in ("always", "madvise", "never")


def test_process_files_rereads_are_fresh_after_collapse(child) -> None:
    size = child["end"] - child["start"]
    with procfs.ProcessFiles(child["pid"]) as files:
        assert files.rollup()["AnonHugePages"] == 0
        assert files.huge_bytes_in([AddrRange(child["start"], child["end"])]) == 0
        with actuate.Target.open(child["pid"]) as target:
            until_settled(lambda s: actuate.collapse(target, s),
                          range(child["start"], child["end"], HUGE_PAGE_BYTES))
        assert files.rollup()["AnonHugePages"] >= size
        assert files.huge_bytes_in([AddrRange(child["start"], child["end"])]) == size
        assert any(m.start <= child["start"] < m.end for m in files.maps())
        assert files.status().vm_rss >= size


def test_process_files_raise_process_gone_once_the_process_exits() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    proc.stdout.readline()
    files = procfs.ProcessFiles(proc.pid)
    try:
        assert files.maps()
        proc.stdin.close()
        proc.wait(timeout=30)
        with pytest.raises(procfs.ProcessGone):
            files.maps()
    finally:
        files.close()


def test_smaps_shows_the_nohugepage_flag_the_process_set_itself() -> None:
    proc = subprocess.Popen([sys.executable, str(CHILD), "4", "nohuge"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        vma = next(m for m in procfs.read_smaps(info["pid"]) if m.start <= info["start"] < m.end)
        assert "nh" in vma.vm_flags
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_process_files_follow_the_process_through_exec() -> None:
    # A launcher (env, sh -c) execs the real program: files opened before the exec must not
    # keep showing the launcher's dead address space.
    code = ("import os, sys; print(flush=True); sys.stdin.readline(); "
            f"os.execv(sys.executable, [sys.executable, {str(CHILD)!r}, '4'])")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    files = procfs.ProcessFiles(proc.pid)
    try:
        proc.stdout.readline()
        before = files.maps()
        files.rollup()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        info = json.loads(proc.stdout.readline())  # the exec'd program's buffer is ready
        after = files.maps()
        assert any(m.start <= info["start"] < m.end for m in after)
        assert not any(m.start <= info["start"] < m.end for m in before)
        assert files.rollup()["Rss"] >= info["end"] - info["start"]
        assert files.huge_bytes_in([AddrRange(info["start"], info["end"])]) == 0
    finally:
        files.close()
        proc.stdin.close()
        proc.wait(timeout=30)


def test_stat_tells_a_live_process_from_one_in_exit():
    # A live process is not exiting; the same stat line with PF_EXITING set in its flags field
    # (field 9) is, which is how the agent drops a measurement taken while exit unmapped memory.
    text = Path("/proc/self/stat").read_text()
    assert not procfs.parse_stat(text).exiting
    head, rest = text[: text.rindex(")") + 2], text[text.rindex(")") + 2 :].split()
    rest[6] = str(int(rest[6]) | procfs.PF_EXITING)
    assert procfs.parse_stat(head + " ".join(rest)).exiting


def test_process_files_maps_follow_an_unmap_and_status_keeps_its_fields() -> None:
    """ProcessFiles keeps the last maps it parsed while the text reads the same: a change
    must show at once. parse_status reads only the lines Status keeps: the same values as
    every line parsed."""
    proc = subprocess.Popen([sys.executable, str(CHILD), "8"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        start = info["start"]
        with procfs.ProcessFiles(info["pid"]) as files:
            first = files.maps()
            assert files.maps() == first
            assert any(m.start <= start < m.end for m in first)
            proc.stdin.write(f"munmap {start} {HUGE_PAGE_BYTES}\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "ok"
            assert not any(m.start <= start < m.end for m in files.maps())
            text = Path(f"/proc/{info['pid']}/status").read_text()
        every = dict(p for line in text.splitlines() if (p := procfs._parse_counter(line)))
        st = procfs.parse_status(text)
        assert (st.vm_rss, st.vm_hwm, st.vm_pte, st.threads, st.thp_disabled) == (
            every["VmRSS"], every["VmHWM"], every["VmPTE"], every["Threads"],
            every.get("THP_enabled", 1) == 0)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
