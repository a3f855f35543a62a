#!/usr/bin/env python3
"""Host benchmark (not a test): one workload with transparent huge pages off vs on, for that
process only, interleaved, N repetitions; prints each run, the medians and their ratio.

    workloads/bench-thp.py --reps 5 gups --size 2G --updates 100000000
    workloads/bench-thp.py --reps 5 streamcluster simlarge --threads 2
    workloads/bench-thp.py --reps 5 water_nsquared simlarge --threads 2

How "off" and "on" are made, without touching the global THP switch (host mode: madvise):
  off  the child calls prctl(PR_SET_THP_DISABLE, 1) before exec (inherited across execve):
       no huge pages for it whatever it or glibc madvises.
  on   gups:                       its own --hugepage flag, which madvise(MADV_HUGEPAGE)s the table
                                   before filling it;
       streamcluster, water_nsquared: GLIBC_TUNABLES=glibc.malloc.hugetlb=1, which makes glibc's
                                   malloc madvise(MADV_HUGEPAGE) its heap and its mmap'd chunks.
Each run's peak AnonHugePages (sampled from /proc/PID/smaps_rollup) is printed so that the
mechanism is visible: off must show 0, on must show more than 0, or the ratio means nothing.

Metric: gups' own ns_per_update (excludes filling the table); otherwise the wall time of the
whole process. Lower is better; ratio = median(off) / median(on), > 1 means huge pages help.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import inputsets  # noqa: E402

PR_SET_THP_DISABLE = 41
THP_SYSFS = Path("/sys/kernel/mm/transparent_hugepage")
SAMPLE_S = 0.1
README = Path(__file__).resolve().parent / "README.md"


@dataclass
class Run:
    rep: int
    mode: str  # "off" | "on"
    value: float  # the metric, lower is better
    wall_s: float
    max_rss_kib: int
    peak_anon_huge_kib: int
    exit_code: int


def _thp_off() -> None:
    """preexec_fn of the 'off' child: runs after fork, before exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        os.write(2, b"bench-thp: prctl(PR_SET_THP_DISABLE) failed\n")
        os._exit(127)


def _proc_kib(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def _is_exec_done(pid: int, binary: str) -> bool:
    """True once the child runs `binary`: before the exec, its memory is the forked Python's."""
    try:
        return os.path.realpath(f"/proc/{pid}/exe") == binary
    except OSError:
        return False


def run_once(argv: list[str], cwd: str | None, stdin: str | None, env: dict[str, str],
             thp_off: bool, outdir: Path, tag: str) -> tuple[float, int, int, int, Path]:
    """Runs argv to completion; returns wall seconds, peak RSS (KiB), peak AnonHugePages (KiB),
    exit code and the file holding its stdout. Both peaks are sampled from /proc while it runs:
    wait4's ru_maxrss would include the forked Python's own RSS from before the exec."""
    out_path, err_path = outdir / f"{tag}.out", outdir / f"{tag}.err"
    stdin_f = open(stdin, "rb") if stdin else open(os.devnull, "rb")
    with stdin_f, open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # child: plain fork+exec so that the prctl happens in the right process
            try:
                os.dup2(stdin_f.fileno(), 0)
                os.dup2(out_f.fileno(), 1)
                os.dup2(err_f.fileno(), 2)
                if cwd:
                    os.chdir(cwd)
                if thp_off:
                    _thp_off()
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        binary = os.path.realpath(argv[0])
        peak_huge = hwm = 0
        while True:
            done, status, _ = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if _is_exec_done(pid, binary):
                peak_huge = max(peak_huge, _proc_kib(f"/proc/{pid}/smaps_rollup",
                                                     "AnonHugePages:"))
                hwm = max(hwm, _proc_kib(f"/proc/{pid}/status", "VmHWM:"))
            time.sleep(SAMPLE_S)
        wall = time.monotonic() - t0
    return wall, hwm, peak_huge, os.waitstatus_to_exitcode(status), out_path


def _last_json(path: Path) -> dict:
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"no JSON line in {path}")
    return json.loads(lines[-1])


def build_plan(ns: argparse.Namespace):
    """Returns (describe, argv_off, argv_on, cwd, stdin, env_off, env_on, metric_name, metric)."""
    base_env = dict(os.environ)
    if ns.workload == "gups":
        binary = str(inputsets.BIN_DIR / "gups")
        argv = [binary, "--size", ns.size, "--updates", str(ns.updates),
                "--threads", str(ns.threads)]
        return (argv, argv + ["--hugepage"], None, None, base_env, base_env,
                "ns_per_update", lambda out, wall: float(_last_json(out)["ns_per_update"]))
    if ns.set is None:
        raise SystemExit(f"bench-thp: {ns.workload} needs an input set "
                         f"({', '.join(inputsets.SET_NAMES)})")
    spec = inputsets.command(ns.workload, ns.set, ns.threads)
    env_on = dict(base_env)
    tun = env_on.get("GLIBC_TUNABLES")
    env_on["GLIBC_TUNABLES"] = (tun + ":" if tun else "") + "glibc.malloc.hugetlb=1"
    return (spec.argv, spec.argv, spec.cwd, spec.stdin, base_env, env_on,
            "wall_s", lambda out, wall: wall)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="bench-thp.py", description=__doc__.split("\n\n")[0],
        epilog="See the module docstring (head workloads/bench-thp.py) for the mechanism.")
    p.add_argument("workload", choices=["gups", *inputsets.PROGRAMS])
    p.add_argument("set", nargs="?", choices=inputsets.SET_NAMES,
                   help="PARSEC input set (streamcluster, water_nsquared)")
    p.add_argument("--reps", type=int, default=5, help="runs per mode (default 5)")
    p.add_argument("--threads", type=int, default=1, help="threads (default 1)")
    p.add_argument("--size", default="2G", help="gups table size (default 2G)")
    p.add_argument("--updates", type=int, default=100_000_000,
                   help="gups updates per run (default 100000000)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument("--record", action="store_true",
                   help="also write the command and its output into workloads/README.md")
    ns = p.parse_args(argv)
    if ns.reps < 1:
        p.error("--reps must be >= 1")

    argv_off, argv_on, cwd, stdin, env_off, env_on, metric_name, metric = build_plan(ns)
    if not os.access(argv_off[0], os.X_OK):
        print(f"bench-thp: {argv_off[0]} is not built; run make -C workloads", file=sys.stderr)
        return 2
    thp_mode = (THP_SYSFS / "enabled").read_text().strip()
    defrag = (THP_SYSFS / "defrag").read_text().strip()
    log_file = sys.stderr if ns.json else sys.stdout
    transcript: list[str] = []

    def log(line: str) -> None:
        transcript.append(line)
        print(line, file=log_file, flush=True)

    log(f"# host THP enabled: {thp_mode}; defrag: {defrag} (read only, never changed)")
    log(f"# load average at start: {_loadavg()}")
    log(f"# off: PR_SET_THP_DISABLE + {shlex.join(argv_off)}")
    on_how = ("GLIBC_TUNABLES=" + env_on["GLIBC_TUNABLES"] + " "
              if env_on is not env_off else "")
    log(f"# on:  {on_how}{shlex.join(argv_on)}")
    if cwd:
        log(f"# cwd: {cwd}" + (f"; stdin: {stdin}" if stdin else ""))

    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-thp-") as tmp:
        for rep in range(ns.reps):
            # Alternate which mode goes first so that drift on the host hits both equally.
            order = ("off", "on") if rep % 2 == 0 else ("on", "off")
            for mode in order:
                off = mode == "off"
                wall, rss, huge, code, out = run_once(
                    argv_off if off else argv_on, cwd, stdin, env_off if off else env_on,
                    off, Path(tmp), f"{rep}-{mode}")
                if code != 0:
                    err = (Path(tmp) / f"{rep}-{mode}.err").read_text()[-2000:]
                    print(f"bench-thp: run {rep} ({mode}) exited with {code}:\n{err}",
                          file=sys.stderr)
                    return 1
                r = Run(rep, mode, metric(out, wall), wall, rss, huge, code)
                runs.append(r)
                log(f"rep {rep} {mode:3}: {metric_name} {r.value:.4f}  wall {wall:.2f} s  "
                    f"peak RSS {rss / 1024:.1f} MiB  peak AnonHugePages {huge / 1024:.1f} MiB")

    med = {m: statistics.median(r.value for r in runs if r.mode == m) for m in ("off", "on")}
    ratio = med["off"] / med["on"] if med["on"] > 0 else float("nan")
    huge_on = min(r.peak_anon_huge_kib for r in runs if r.mode == "on")
    huge_off = max(r.peak_anon_huge_kib for r in runs if r.mode == "off")
    warnings = []
    if huge_on == 0:
        warnings.append("an 'on' run never had AnonHugePages > 0 (sampled every "
                        f"{SAMPLE_S} s): huge pages were not used, the ratio measures nothing")
    if huge_off > 0:
        warnings.append("an 'off' run had AnonHugePages > 0: PR_SET_THP_DISABLE did not hold")
    if ns.json:
        print(json.dumps({"workload": ns.workload, "set": ns.set, "threads": ns.threads,
                          "metric": metric_name, "median_off": med["off"],
                          "median_on": med["on"], "ratio_off_on": ratio,
                          "warnings": warnings, "runs": [asdict(r) for r in runs]}))
    log(f"# load average at end: {_loadavg()}")
    summary = (f"median {metric_name}: off {med['off']:.4f}  on {med['on']:.4f}  "
               f"ratio off/on {ratio:.3f} ({ns.reps} reps each, interleaved)")
    if not ns.json:
        log(summary)
    else:
        transcript.append(summary)
    for w in warnings:
        print(f"bench-thp: warning: {w}", file=sys.stderr)
        transcript.append(f"warning: {w}")
    if ns.record:
        record(ns.workload, argv if argv is not None else sys.argv[1:], transcript)
    return 0


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def record(workload: str, args: list[str], transcript: list[str]) -> None:
    """Replace README.md's block for this workload with the command and its output."""
    name = "streamcluster" if workload.startswith("streamcluster") else workload
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    text = README.read_text()
    if begin not in text or end not in text:
        print(f"bench-thp: {README} has no {begin} ... {end} markers; not recorded",
              file=sys.stderr)
        return
    shown = [a for a in args if a != "--record"]
    block = "\n".join(
        [f"Recorded {time.strftime('%Y-%m-%d %H:%M %Z')}:", "",
         f"    $ workloads/bench-thp.py {shlex.join(shown)}"]
        + [f"    {line}" for line in transcript])
    head, rest = text.split(begin, 1)
    README.write_text(head + begin + "\n" + block + "\n" + end + rest.split(end, 1)[1])


if __name__ == "__main__":
    sys.exit(main())
