#!/usr/bin/env python3
"""What damon-hpd costs as the processes it manages grow in number (issue #26). Not a test.

For each process count N (--counts, default 1,10,50): start N copies of workloads/bin/hotcold
that share --total bytes (default 8 GiB; --hot-share of each process read at random, the rest
written once and never read; at nice 19, so that the daemon is never short of a CPU on a small
machine), wait until every one has written its memory, start damon-hpd with a config selecting
exactly those copies (no budget), let it run --seconds, stop it with SIGTERM and read its
--json. Reported per N:

  monitoring CPU   the daemon's own CPU (user + system, every thread) from its first scan on
                   (its start-up, ~0.3 s of imports and set-up, left out: a service runs for
                   days), less its CPU inside MADV_COLLAPSE calls (the kernel copying the
                   promoted memory, charged to the caller: the collapses' cost, not the
                   watching's), as % of one core over the daemon's wall time; per process,
                   that CPU divided by N and by the number of aggregations decided on;
  by stage         the same CPU per stage (the daemon's --json `monitoring_cpu_by_stage`:
                   events, procfs, reverse map, decide, act, measure, scan, status);
  hot set huge     from each copy's own page table (/proc/PID/smaps, AnonHugePages of the
                   mapping holding its hot buffer) every 5 s: the seconds from the daemon's
                   start until 90 % of the hot buffer is huge (median, max; "never" counted
                   apart) and the share at the end; cold huge: the same of the cold buffers.

--daemon PATH runs another build's damon-hpd (an older commit's worktree, say) for a before/
after comparison; where its --json lacks the CPU fields, the monitoring CPU is read from
/proc/PID/stat just before SIGTERM, start-up and collapse copies included (said in the
output), and no stages are shown.

The access source is whatever damon-hpd picks here (on the CI host: passive, a foreign paddr
kdamond's events, aggregation 5 s). How much of a hot set a physical source sees depends on
how scattered the processes' frames are: on a machine whose free memory is fragmented, few hot
sets may become huge; the cost figures stand either way.

Example (from the project root; ~4 minutes per count with the defaults):
  .venv/bin/python experiments/bench-daemon.py --counts 1,10,50 --seconds 150 --json /tmp/bd.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAEMON = str(ROOT / ".venv/bin/damon-hpd")
HOTCOLD = ROOT / "workloads/bin/hotcold"
MIB = 1 << 20
SHARE = 0.90
LOOK_EVERY_S = 5.0

sys.path.insert(0, str(ROOT / "agent"))
from damon_hp import procfs  # noqa: E402
from damon_hp.ranges import AddrRange  # noqa: E402
from damon_hp.sizes import parse_size  # noqa: E402


def huge_share(maps: list[procfs.Vma], lo: int, hi: int) -> float:
    """Share of [lo, hi) on huge pages (smaps AnonHugePages of the mappings over it)."""
    return procfs.smaps_in_ranges(maps, [AddrRange(lo, hi)]).anon_huge_bytes / (hi - lo)


class Copies:
    """N hotcold copies under one temp dir, their hot and cold buffers as they printed them."""

    def __init__(self, folder: Path, n: int, hot: int, cold: int) -> None:
        exe = folder / "bench-daemon-hotcold"
        shutil.copy(HOTCOLD, exe)
        self.exe = exe
        self.procs = [subprocess.Popen(
            [str(exe), "--hot", f"{hot // MIB}M", "--cold", f"{cold // MIB}M", "--seconds", "0"],
            stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.nice(19))
            for _ in range(n)]
        self.layout = []
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line:
                raise SystemExit(f"bench-daemon: hotcold {p.pid} exited before writing its memory")
            self.layout.append(json.loads(line))

    def huge_shares(self) -> list[tuple[float, float]]:
        """(hot, cold) share of each copy's buffers on huge pages now."""
        out = []
        for p, lay in zip(self.procs, self.layout, strict=True):
            hot, cold = lay["hot"], lay["cold"]
            try:
                maps = procfs.read_smaps(p.pid)
            except procfs.ProcessGone:
                maps = []
            out.append((huge_share(maps, hot["start"], hot["end"]),
                        huge_share(maps, cold["start"], cold["end"])))
        return out

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def one_count(n: int, args: argparse.Namespace, tmp: Path) -> dict:
    per = args.total // n
    hot = max(2 * MIB, int(per * args.hot_share) // (2 * MIB) * (2 * MIB))
    cold = max(2 * MIB, (per - hot) // (2 * MIB) * (2 * MIB))
    folder = tmp / f"n{n}"
    folder.mkdir()
    copies = Copies(folder, n, hot, cold)
    daemon = None
    try:
        cfg = folder / "daemon.toml"
        cfg.write_text(f'[daemon]\nscan_every_s = 5\nsummary_every_s = 60\n\n[[rule]]\n'
                       f'name = "bench"\nexe = "{copies.exe}"\n')
        out = folder / "daemon.json"
        env = {**os.environ, "DAMON_HP_RUN_DIR": str(folder / "run")}
        with open(folder / "daemon.err", "w") as err:
            daemon = subprocess.Popen([args.daemon, "--config", str(cfg), "--json", str(out)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=err, env=env, start_new_session=True)
        started = time.monotonic()
        reached: list[float | None] = [None] * n
        shares = copies.huge_shares()
        while time.monotonic() - started < args.seconds:
            time.sleep(LOOK_EVERY_S)
            if daemon.poll() is not None:
                raise SystemExit(f"bench-daemon: damon-hpd exited early:\n"
                                 f"{(folder / 'daemon.err').read_text()}")
            shares = copies.huge_shares()
            t = time.monotonic() - started
            for i, (h, _) in enumerate(shares):
                if reached[i] is None and h >= SHARE:
                    reached[i] = t
            if args.progress:
                print(f"#   n={n} {t:5.0f} s: {sum(r is not None for r in reached)} of {n} hot "
                      f"sets 90 % huge", flush=True)
        proc_cpu_s = procfs.read_stat(daemon.pid).cpu_s
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(timeout=120)
        if rc != 0:
            raise SystemExit(f"bench-daemon: damon-hpd exited {rc}:\n"
                             f"{(folder / 'daemon.err').read_text()}")
        d = json.loads(out.read_text())
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        copies.stop()
    wall = d["wall_s"]
    whole = "cpu_s" not in d  # an older damon-hpd: its whole CPU from /proc
    mon = proc_cpu_s if whole else d["cpu_s"] - d["start_cpu_s"] - d["collapse_cpu_s"]
    rounds = max(1, d["totals"]["rounds"])
    return {
        "processes": n, "hot_bytes_each": hot, "cold_bytes_each": cold, "wall_s": wall,
        "source": d["source"]["name"] if d.get("source") else None,
        "cpu_s": d.get("cpu_s", proc_cpu_s), "start_cpu_s": d.get("start_cpu_s"),
        "collapse_cpu_s": d.get("collapse_cpu_s"),
        "cpu_includes_start_and_copies": whole,
        "monitoring_pct": 100 * mon / wall,
        "per_process_round_ms": 1000 * mon / n / rounds, "rounds": rounds,
        "by_stage_pct": {k: round(100 * v / wall, 3)
                         for k, v in d.get("monitoring_cpu_by_stage", {}).items()},
        "t90_s": reached,
        "hot_huge_end": [round(h, 3) for h, _ in shares],
        "cold_huge_end": [round(c, 3) for _, c in shares],
        "collapses": d["totals"]["collapses"],
    }


def fmt_t90(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return f"never ({len(values)})"
    txt = f"{statistics.median(got):.0f} / {max(got):.0f}"
    return txt + (f" ({len(values) - len(got)} never)" if len(got) < len(values) else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--counts", default="1,10,50", help="process counts (default 1,10,50)")
    p.add_argument("--total", default="8G", help="memory of all copies together (default 8G)")
    p.add_argument("--hot-share", type=float, default=0.25,
                   help="share of each copy read at random (default 0.25)")
    p.add_argument("--seconds", type=float, default=150, help="daemon run per count")
    p.add_argument("--progress", action="store_true", help="a line every 5 s")
    p.add_argument("--json", help="write every count's figures to this file")
    p.add_argument("--daemon", default=DAEMON, help="the damon-hpd to run (default: this tree's)")
    args = p.parse_args()
    try:
        counts = [int(x) for x in args.counts.split(",")]
        args.total = parse_size(args.total)
    except ValueError as e:
        p.error(str(e))
    if any(c < 1 for c in counts) or not 0 < args.hot_share < 1:
        p.error("counts must be >= 1 and --hot-share within (0, 1)")
    if os.geteuid() != 0:
        p.error("damon-hpd needs root")
    print(f"# kernel {os.uname().release}, {args.total / (1 << 30):g} GiB in all, "
          f"{args.hot_share:.0%} hot, {args.seconds:g} s per count, counts {counts}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-daemon-") as tmp:
        for n in counts:
            r = one_count(n, args, Path(tmp))
            results.append(r)
            print(json.dumps(r), flush=True)
    print("\n| processes | source | monitoring CPU % of a core | per process per aggregation "
          "(ms) | largest stages (% of a core) | hot set 90 % huge after (s, median / max) | "
          "hot huge at end (median) | cold huge at end (max) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        top = sorted(r["by_stage_pct"].items(), key=lambda kv: -kv[1])[:3]
        whole = " (whole CPU)" if r["cpu_includes_start_and_copies"] else ""
        print(f"| {r['processes']} | {r['source']} | {r['monitoring_pct']:.2f}{whole} | "
              f"{r['per_process_round_ms']:.1f} | "
              f"{', '.join(f'{k} {v:.2f}' for k, v in top)} | {fmt_t90(r['t90_s'])} | "
              f"{100 * statistics.median(r['hot_huge_end']):.0f} % | "
              f"{100 * max(r['cold_huge_end']):.1f} % |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
