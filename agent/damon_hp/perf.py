"""TLB misses, page faults, cycles and instructions of a process through `perf stat -x,`.

    session = PerfSession.start(pid)      # returns once perf counts (enabled through --control)
    ...
    result = session.stop()               # SIGINT to perf, then its CSV output parsed
    result.value("dTLB-load-misses")      # None where the PMU cannot count it, never 0
    format_value(result.counts["cycles"]) # "n/a (no PMU)" on machines without a PMU

    result = PerfSession.run(["./workloads/bin/gups", "--size", "1G"])

A figure perf could not produce is None in Python and null in JSON, with the reason kept
(`no PMU`, `not supported`, `not counted`); it is never reported as zero.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from damon_hp import procfs
from damon_hp.errors import DamonHpError, EnvironmentProblem

PERF_EVENTS: tuple[str, ...] = (
    "dTLB-load-misses",
    "dTLB-store-misses",
    "iTLB-load-misses",
    "page-faults",
    "cycles",
    "instructions",
)
# Counted by the CPU's PMU; software events (page-faults) are counted by the kernel and work
# on any machine, a PMU or not.
HARDWARE_EVENTS = frozenset(
    {"dTLB-load-misses", "dTLB-store-misses", "iTLB-load-misses", "cycles", "instructions",
     "dTLB-loads", "dTLB-stores", "iTLB-loads", "cache-misses", "cache-references",
     "branch-misses", "branches", "ref-cycles"}
)

COUNTED = "counted"
NOT_SUPPORTED = "not supported"
NOT_COUNTED = "not counted"
NO_PMU = "no PMU"

ENABLE_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0

# "cpu_core/dTLB-load-misses/" (hybrid CPUs print one line per core type) -> "dTLB-load-misses"
_PMU_PREFIXED = re.compile(r"^[\w.-]+/(?P<event>[^/]+)/$")


@dataclass(frozen=True)
class PerfCount:
    """One event's figure from perf stat, or why there is none."""

    event: str
    value: int | float | None
    status: str
    unit: str = ""
    running_pct: float | None = None
    metric_value: float | None = None
    metric_unit: str = ""

    @property
    def available(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class PerfResult:
    counts: dict[str, PerfCount]
    target: str = ""
    elapsed_s: float | None = None
    exit_code: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)

    def value(self, event: str) -> int | float | None:
        count = self.counts.get(event)
        return count.value if count else None

    def reason(self, event: str) -> str | None:
        """Why `event` has no figure (None when it has one)."""
        count = self.counts.get(event)
        if count is None:
            return "not measured"
        return None if count.available else self.unavailable.get(event, count.status)

    def format(self, event: str) -> str:
        count = self.counts.get(event)
        if count is None:
            return "n/a (not measured)"
        return format_value(count, self.unavailable.get(event))

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "elapsed_s": self.elapsed_s,
            "events": {name: c.value for name, c in self.counts.items()},
            "unavailable": {
                name: self.reason(name) for name, c in self.counts.items() if not c.available
            },
        }


def format_value(count: PerfCount, reason: str | None = None) -> str:
    """A figure for a human table: '1,234,567', or 'n/a (no PMU)' -- never 0 for no data."""
    if count.value is None:
        return f"n/a ({reason or count.status})"
    if isinstance(count.value, float) and not count.value.is_integer():
        return f"{count.value:,.2f}"
    return f"{int(count.value):,}"


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


def _optional_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _base_event(name: str) -> str:
    match = _PMU_PREFIXED.match(name)
    return match.group("event") if match else name


def parse_perf_csv(text: str, separator: str = ",") -> PerfResult:
    """Parse `perf stat -x<separator>` output (no -I, -A, -r): the fields are value, unit,
    event, run time, % running, metric value, metric unit. Comment lines (`# started on`),
    blank lines and perf's notices ("Events enabled") are skipped. A hybrid CPU's per-PMU
    lines (cpu_core/x/, cpu_atom/x/) are summed into x.
    """
    counts: dict[str, PerfCount] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split(separator)
        if len(fields) < 5 or not fields[2]:
            continue
        raw_value, unit, name = fields[0].strip(), fields[1], _base_event(fields[2])
        if raw_value == "<not supported>":
            value, status = None, NOT_SUPPORTED
        elif raw_value == "<not counted>":
            value, status = None, NOT_COUNTED
        else:
            try:
                value, status = _number(raw_value), COUNTED
            except ValueError:
                continue
        count = PerfCount(
            event=name,
            value=value,
            status=status,
            unit=unit,
            running_pct=_optional_float(fields[4]),
            metric_value=_optional_float(fields[5]) if len(fields) > 5 else None,
            metric_unit=fields[6].strip() if len(fields) > 6 else "",
        )
        counts[name] = _merge(counts[name], count) if name in counts else count
    return PerfResult(counts=counts, unavailable=_reasons(counts))


def _merge(a: PerfCount, b: PerfCount) -> PerfCount:
    """One core type counted and another did not: the counted figure stands."""
    if a.value is None:
        return b if b.value is not None else a
    if b.value is None:
        return a
    return PerfCount(a.event, a.value + b.value, COUNTED, a.unit, None, None, "")


def _reasons(counts: dict[str, PerfCount]) -> dict[str, str]:
    # A CPU with a PMU counts at least some hardware event; if none was counted, the
    # hardware events are missing because there is no PMU at all (VMs without PMU passthrough).
    hw_counted = any(c.available for n, c in counts.items() if n in HARDWARE_EVENTS)
    reasons = {}
    for name, c in counts.items():
        if c.available:
            continue
        if c.status == NOT_SUPPORTED and name in HARDWARE_EVENTS and not hw_counted:
            reasons[name] = NO_PMU
        else:
            reasons[name] = c.status
    return reasons


def find_perf() -> str:
    path = shutil.which("perf")
    if not path:
        raise EnvironmentProblem(
            "perf is not installed, so TLB misses and page faults cannot be measured. "
            "Install it with `apt-get install linux-perf` (or run `make setup`)."
        )
    return path


def _stat_command(perf: str, out: Path, events: Sequence[str]) -> list[str]:
    return [perf, "stat", "-x,", "-o", str(out), "-e", ",".join(events)]


class PerfSession:
    """perf stat attached to a running process. Build with start(); always stop()."""

    def __init__(self, proc: subprocess.Popen[bytes], tmpdir: Path, target: str,
                 started: float) -> None:
        self._proc = proc
        self._tmpdir = tmpdir
        self._target = target
        self._started = started

    @classmethod
    def start(cls, pid: int, events: Sequence[str] = PERF_EVENTS) -> PerfSession:
        """Attach to `pid` (all its threads); returns once the counters are enabled."""
        perf = find_perf()
        tmpdir = Path(tempfile.mkdtemp(prefix="damon-hp-perf-"))
        ctl_r, ctl_w = os.pipe()
        ack_r, ack_w = os.pipe()
        # Start disabled (-D -1), then enable through --control and wait for perf's ack: the
        # counts then cover exactly the time after start() returned.
        cmd = _stat_command(perf, tmpdir / "stat.csv", events) + [
            "-D", "-1", "--control", f"fd:{ctl_r},{ack_w}", "-p", str(pid),
        ]
        try:
            with open(tmpdir / "stderr", "wb") as err:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=err, pass_fds=(ctl_r, ack_w),
                                        start_new_session=True)
        except OSError:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        finally:
            os.close(ctl_r)
            os.close(ack_w)
        session = cls(proc, tmpdir, f"pid {pid}", time.monotonic())
        try:
            os.write(ctl_w, b"enable\n")
            ready, _, _ = select.select([ack_r], [], [], ENABLE_TIMEOUT_S)
            ack = os.read(ack_r, 64) if ready else b""
        except OSError:
            ack = b""
        finally:
            os.close(ctl_w)
            os.close(ack_r)
        if not ack.startswith(b"ack"):
            session._kill()
            message = session._stderr() or "no output"
            session._cleanup()
            if not procfs.pid_exists(pid):
                raise EnvironmentProblem(f"perf cannot attach to PID {pid}: no such process")
            if "paranoid" in message or "ermission" in message:
                first = next((ln for ln in message.splitlines()
                              if ln.strip() and ln.strip() != "Error:"), message)
                raise EnvironmentProblem(
                    f"perf is not permitted to count PID {pid}: {first.strip()} Run as root, or "
                    "lower /proc/sys/kernel/perf_event_paranoid on a machine you own."
                )
            raise DamonHpError(f"perf stat did not start counting PID {pid}: {message}")
        session._started = time.monotonic()
        return session

    @classmethod
    def run(cls, argv: Sequence[str], events: Sequence[str] = PERF_EVENTS) -> PerfResult:
        """Run a command under perf stat and return its counts (exit_code: the command's)."""
        perf = find_perf()
        with tempfile.TemporaryDirectory(prefix="damon-hp-perf-") as tmp:
            out = Path(tmp) / "stat.csv"
            started = time.monotonic()
            proc = subprocess.run(_stat_command(perf, out, events) + ["--", *argv],
                                  stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
            elapsed = time.monotonic() - started
            text = out.read_text() if out.exists() else ""
        parsed = parse_perf_csv(text)
        if not parsed.counts:
            raise DamonHpError(
                f"perf stat printed no counts for {' '.join(argv)!r}: "
                f"{proc.stderr.decode(errors='replace').strip() or 'no output'}"
            )
        return PerfResult(parsed.counts, " ".join(argv), elapsed, proc.returncode,
                          parsed.unavailable)

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> PerfResult:
        """Stop counting (SIGINT makes perf print its totals) and parse them."""
        try:
            if self.running:
                self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._kill()
                raise DamonHpError(
                    f"perf stat did not stop within {timeout_s:g} s; killed it"
                ) from None
            elapsed = time.monotonic() - self._started
            out = self._tmpdir / "stat.csv"
            parsed = parse_perf_csv(out.read_text() if out.exists() else "")
            if not parsed.counts:
                raise DamonHpError(
                    f"perf stat printed no counts for {self._target} "
                    f"(exit code {self._proc.returncode}): {self._stderr() or 'no output'}"
                )
            return PerfResult(parsed.counts, self._target, elapsed, None, parsed.unavailable)
        finally:
            self._cleanup()

    def _stderr(self) -> str:
        try:
            return (self._tmpdir / "stderr").read_text(errors="replace").strip()
        except OSError:
            return ""

    def _kill(self) -> None:
        if self.running:
            self._proc.kill()
        self._proc.wait()

    def _cleanup(self) -> None:
        shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> PerfSession:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.running:
            self._kill()
        self._cleanup()
