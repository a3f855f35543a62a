"""go-ycsb, the YCSB client of the app experiment: where the pinned build lives, the core
workload's properties for workloads C (read only) and A (50 % reads, 50 % updates) with the
request distribution asked for, one client run bounded by an operation count and by time, and
its final totals.

go-ycsb ignores its `maxexecutiontime` property (v1.0.3), so a timed run gets SIGTERM: it stops
its threads, and still writes the final per-operation totals (count, throughput, average and
percentile latencies, in µs) to `measurement.output_file`, here as JSON (`outputstyle=json`).
Its debug HTTP server would listen on :6060 of every interface by default, and a second client
would fight the first for that port: it is put on an ephemeral port of 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.experiment.apps import server as srv
from damon_hp.experiment.apps.client import ClientResult

ROOT = Path(__file__).resolve().parents[4]
PIN = ROOT / "workloads" / "go-ycsb" / "pin.env"
TESTS = ("ycsb-c", "ycsb-a")
# The standard core workloads (go-ycsb's workloads/workloadc and workloada), but for the request
# distribution, which the experiment chooses.
MIXES = {
    "ycsb-c": {"readproportion": "1", "updateproportion": "0"},
    "ycsb-a": {"readproportion": "0.5", "updateproportion": "0.5"},
}
DISTRIBUTIONS = ("zipfian", "uniform", "latest", "hotspot")
STOP_WAIT_S = 30.0  # go-ycsb forces its own exit 10 s after the first signal
MAX_ERROR_SHARE = 0.01  # more failed operations than this: the run is not a measurement


def version() -> str:
    for line in PIN.read_text().splitlines():
        if line.startswith("GO_YCSB_VERSION="):
            return line.split("=", 1)[1].strip()
    raise EnvironmentProblem(f"{PIN} names no GO_YCSB_VERSION")


def binary() -> Path:
    """The pinned build (workloads/go-ycsb/build.sh puts it there)."""
    return ROOT / ".cache" / "go-ycsb" / f"go-ycsb-{version()}"


def check_installed() -> None:
    if not os.access(binary(), os.X_OK):
        raise EnvironmentProblem(f"the YCSB apps need go-ycsb at {binary()}; build it with "
                                 "`make setup` (workloads/go-ycsb/build.sh)")


def core_properties(records: int, field_count: int, field_bytes: int,
                    distribution: str) -> dict[str, str]:
    return {"workload": "core", "recordcount": str(records), "fieldcount": str(field_count),
            "fieldlength": str(field_bytes), "requestdistribution": distribution,
            "readallfields": "true", "scanproportion": "0", "insertproportion": "0",
            "readmodifywriteproportion": "0", "debug.pprof": "127.0.0.1:0",
            "outputstyle": "json"}


def argv(command: str, db: str, props: dict[str, str], threads: int) -> list[str]:
    out = [str(binary()), command, db, "--threads", str(threads)]
    for k, v in props.items():
        out += ["-p", f"{k}={v}"]
    return out


@dataclass
class Totals:
    """go-ycsb's final totals: successful operations by kind, failed ones by kind, and the
    latency of all of them (TOTAL), in µs."""

    ops: dict[str, int]
    errors: dict[str, int]
    seconds: float
    p50_us: float | None
    p99_us: float | None
    p999_us: float | None

    @property
    def requests(self) -> int:
        return sum(self.ops.values())

    def client_result(self) -> ClientResult:
        def ms(v: float | None) -> float | None:
            return None if v is None else v / 1000

        tp = self.requests / self.seconds if self.seconds > 0 else 0.0
        extra = {f"ops_{k.lower()}": v for k, v in self.ops.items()}
        extra["errors"] = sum(self.errors.values())
        return ClientResult(self.requests, self.seconds, tp, ms(self.p50_us), ms(self.p99_us),
                            ms(self.p999_us), extra)


def parse_totals(text: str) -> Totals:
    """The JSON list go-ycsb writes with outputstyle=json: one object per operation kind
    ("READ", "UPDATE", "READ_ERROR", ..., "TOTAL"), every value a string."""
    try:
        rows = json.loads(text)
    except ValueError:
        raise DamonHpError("go-ycsb's totals are not JSON") from None
    ops: dict[str, int] = {}
    errors: dict[str, int] = {}
    total: dict[str, str] | None = None
    for row in rows:
        name = row.get("Operation", "")
        if name == "TOTAL":
            total = row
        elif name.endswith("_ERROR"):
            errors[name[:-6]] = int(row["Count"])
        elif name:
            ops[name] = int(row["Count"])
    if total is None:
        raise DamonHpError("go-ycsb's totals have no TOTAL row")

    def num(key: str) -> float | None:
        v = total.get(key) if total else None
        return float(v) if v not in (None, "") else None

    return Totals(ops, errors, num("Takes(s)") or 0.0, num("50th(us)"), num("99th(us)"),
                  num("99.9th(us)"))


def run(cmd: list[str], out_json: Path, log: Path, seconds: float | None, timeout_s: float,
        what: str) -> Totals:
    """Run go-ycsb until it has done its operation count or, with `seconds`, until then
    (SIGTERM); its totals. In a session of its own, killed on timeout or Ctrl-C."""
    out_json.unlink(missing_ok=True)
    cmd = [*cmd, "-p", f"measurement.output_file={out_json}",
           "-p", "measurement.interval=10"]
    with open(log, "wb") as f:
        proc = srv.spawn(cmd, subprocess.DEVNULL, f)
        code: int | None = None
        try:
            limit = timeout_s if seconds is None else min(seconds, timeout_s)
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(limit)
            if code is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = proc.wait(STOP_WAIT_S)
                if code is None or seconds is None or seconds > timeout_s:
                    raise DamonHpError(f"{what} did not finish within {timeout_s:.0f} s; "
                                       f"its output: {log}")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
    if code != 0:
        raise DamonHpError(f"{what} failed (exit {code}): {tail}")
    try:
        totals = parse_totals(out_json.read_text())
    except OSError:
        raise DamonHpError(f"{what} wrote no totals ({out_json}): {tail}") from None
    failed = sum(totals.errors.values())
    if totals.requests == 0 or failed > MAX_ERROR_SHARE * (totals.requests + failed):
        raise DamonHpError(f"{what}: {totals.requests} operations succeeded and {failed} "
                           f"failed ({totals.errors}); see {log}")
    return totals


def check_common(p: Any, tests_ok: tuple[str, ...] = TESTS) -> None:
    """Checks shared by both YCSB apps' Params (ValueError naming the bad value)."""
    for name in ("records", "field_bytes", "operations"):
        v = getattr(p, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    tests = p.tests
    if not tests or any(t not in tests_ok for t in tests):
        raise ValueError(f"tests must be a non-empty list of {', '.join(tests_ok)}, "
                         f"got {tests!r}")
    dist = p.distribution
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, "
                         f"got {dist!r}")
    for name in ("seconds", "warmup_seconds", "settle_s", "timeout_s"):
        v = getattr(p, name)
        if not isinstance(v, int | float) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be seconds >= 0, got {v!r}")
    port = p.port
    if not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"port must be 0 (pick a free one) or a TCP port, got {port!r}")


def timed(seconds: float) -> float | None:
    """A test's time bound: 0 means the operation count alone bounds it."""
    return seconds if seconds > 0 else None
