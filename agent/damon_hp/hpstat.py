"""Run the hpstat BPF tool (bpf/.output/hpstat) and read its JSON lines into dataclasses.

    with HpStat.start(pid=1234, interval_s=1.0) as trace:   # returns once events are counted
        ...                                                 # the agent does its work
        summary = trace.stop()                              # SIGINT, then the final totals
    summary.total.madv_collapse.collapsed, summary.total.page_faults_user

hpstat exits 2 when BPF is not permitted (not root, lockdown) or the PID does not exist; that
becomes an EnvironmentProblem carrying hpstat's own explanation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from damon_hp.errors import DamonHpError, EnvironmentProblem

HPSTAT_ENV = "DAMON_HP_HPSTAT"
_PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BINARY = _PROJECT_ROOT / "bpf" / ".output" / "hpstat"

# The VM runs code ~25x slower than the host: loading and verifying takes seconds there.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def find_hpstat() -> Path:
    """The hpstat binary: $DAMON_HP_HPSTAT, else the one `make bpf` builds."""
    path = Path(os.environ.get(HPSTAT_ENV) or DEFAULT_BINARY)
    if not os.access(path, os.X_OK):
        raise EnvironmentProblem(
            f"hpstat is not built: {path} is missing or not executable. "
            "Build it with `make bpf` (needs clang, bpftool and libbpf-dev; `make setup` "
            f"installs them), or point ${HPSTAT_ENV} at a built hpstat."
        )
    return path


@dataclass(frozen=True)
class HistogramBucket:
    """Events with lo_us <= duration < hi_us."""

    lo_us: int
    hi_us: int
    count: int


@dataclass(frozen=True)
class LatencyHistogram:
    count: int
    total_us: float
    buckets: tuple[HistogramBucket, ...]

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LatencyHistogram:
        return cls(
            count=int(obj["count"]),
            total_us=float(obj["total_us"]),
            buckets=tuple(
                HistogramBucket(int(b["lo_us"]), int(b["hi_us"]), int(b["count"]))
                for b in obj["buckets"]
            ),
        )

    @property
    def mean_us(self) -> float | None:
        return self.total_us / self.count if self.count else None

    @property
    def slowest_below_us(self) -> int | None:
        """Upper bound of the slowest bucket with events: every event was shorter."""
        return max((b.hi_us for b in self.buckets), default=None)


@dataclass(frozen=True)
class ThpActivity:
    """THP work by one source (khugepaged or MADV_COLLAPSE), by the kernel's status names."""

    scan_pmd: dict[str, int]
    collapse: dict[str, int]
    scan_file: dict[str, int]
    collapse_file: dict[str, int]

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ThpActivity:
        return cls(
            scan_pmd=_counts(obj.get("scan_pmd")),
            collapse=_counts(obj.get("collapse")),
            scan_file=_counts(obj.get("scan_file")),
            collapse_file=_counts(obj.get("collapse_file")),
        )

    @property
    def collapsed(self) -> int:
        """2 MiB ranges turned into huge pages (anonymous and file/shmem)."""
        return self.collapse.get("succeeded", 0) + self.collapse_file.get("succeeded", 0)

    @property
    def collapse_failed(self) -> dict[str, int]:
        """Collapse attempts that failed, by status."""
        failed: dict[str, int] = {}
        for counts in (self.collapse, self.collapse_file):
            for status, n in counts.items():
                if status != "succeeded":
                    failed[status] = failed.get(status, 0) + n
        return failed

    @property
    def already_huge(self) -> int:
        """Scans that found the range already mapped by a huge page."""
        return self.scan_pmd.get("page_pmd_mapped", 0)


def _counts(obj: dict[str, Any] | None) -> dict[str, int]:
    return {str(k): int(v) for k, v in (obj or {}).items()}


@dataclass(frozen=True)
class HpStatRecord:
    """One interval (kind "interval") or the whole run (kind "summary")."""

    kind: str
    pid: int | None
    elapsed_s: float
    span_s: float
    page_faults_user: int
    khugepaged_scans: int
    khugepaged: ThpActivity
    madv_collapse: ThpActivity
    compaction_direct: LatencyHistogram
    compaction_kthread: LatencyHistogram
    compaction_result: dict[str, int]
    direct_reclaim: LatencyHistogram
    direct_reclaim_pages: int
    tlb_flush: dict[str, int]
    madvise: dict[str, int]
    process_madvise: dict[str, int]
    unmatched_end: int
    target_exited: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> HpStatRecord:
        thp = obj["thp"]
        compaction = obj["compaction"]
        reclaim = obj["direct_reclaim"]
        return cls(
            kind=str(obj["type"]),
            pid=obj.get("pid"),
            elapsed_s=float(obj["elapsed_s"]),
            span_s=float(obj["span_s"]),
            page_faults_user=int(obj["page_faults_user"]),
            khugepaged_scans=int(obj["khugepaged_scans"]),
            khugepaged=ThpActivity.from_json(thp["khugepaged"]),
            madv_collapse=ThpActivity.from_json(thp["madv_collapse"]),
            compaction_direct=LatencyHistogram.from_json(compaction["direct"]),
            compaction_kthread=LatencyHistogram.from_json(compaction["kthread"]),
            compaction_result=_counts(compaction.get("result")),
            direct_reclaim=LatencyHistogram.from_json(reclaim["stalls"]),
            direct_reclaim_pages=int(reclaim["pages_reclaimed"]),
            tlb_flush=_counts(obj.get("tlb_flush")),
            madvise=_counts(obj.get("madvise")),
            process_madvise=_counts(obj.get("process_madvise")),
            unmatched_end=int(obj.get("unmatched_end", 0)),
            target_exited=bool(obj.get("target_exited", False)),
            raw=obj,
        )

    @property
    def tlb_flushes(self) -> int:
        return sum(self.tlb_flush.values())

    def headline(self) -> dict[str, Any]:
        """The few figures a run report shows: faults, collapses, stall time, TLB flushes."""
        failed: dict[str, int] = {}
        for activity in (self.khugepaged, self.madv_collapse):
            for status, n in activity.collapse_failed.items():
                failed[status] = failed.get(status, 0) + n
        return {
            "page_faults_user": self.page_faults_user,
            "collapsed": {"khugepaged": self.khugepaged.collapsed,
                          "madv_collapse": self.madv_collapse.collapsed},
            "collapse_failed": failed,
            "compaction_stall_ms": round(self.compaction_direct.total_us / 1000, 3),
            "direct_reclaim_stall_ms": round(self.direct_reclaim.total_us / 1000, 3),
            "tlb_flushes": self.tlb_flushes,
        }

    def to_json(self) -> dict[str, Any]:
        """The record exactly as hpstat printed it."""
        return self.raw


@dataclass(frozen=True)
class HpStatSummary:
    total: HpStatRecord
    intervals: tuple[HpStatRecord, ...]
    attached: tuple[str, ...]
    unavailable: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "attached": list(self.attached),
            "unavailable": list(self.unavailable),
            "total": self.total.to_json(),
            "intervals": [r.to_json() for r in self.intervals],
        }


def parse_output(lines: Iterable[str]) -> HpStatSummary:
    """Parse a whole hpstat JSON-lines output (start, intervals, summary)."""
    start: dict[str, Any] = {}
    intervals: list[HpStatRecord] = []
    total: HpStatRecord | None = None
    for line in lines:
        obj = _parse_line(line)
        if obj is None:
            continue
        if obj["type"] == "start":
            start = obj
        elif obj["type"] == "interval":
            intervals.append(HpStatRecord.from_json(obj))
        elif obj["type"] == "summary":
            total = HpStatRecord.from_json(obj)
    if total is None:
        raise DamonHpError("hpstat output has no summary line: it was stopped before finishing")
    return HpStatSummary(
        total=total,
        intervals=tuple(intervals),
        attached=tuple(start.get("attached", ())),
        unavailable=tuple(start.get("unavailable", ())),
    )


def _parse_line(line: str) -> dict[str, Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DamonHpError(f"hpstat printed a line that is not JSON: {line[:200]!r}") from exc
    if not isinstance(obj, dict) or "type" not in obj:
        raise DamonHpError(f"hpstat printed an unexpected JSON line: {line[:200]!r}")
    return obj


class HpStat:
    """A running hpstat process. Build with HpStat.start(); always stop() (or use `with`)."""

    def __init__(
        self,
        proc: subprocess.Popen[str],
        on_interval: Callable[[HpStatRecord], None] | None,
    ) -> None:
        self._proc = proc
        self._on_interval = on_interval
        self._started = threading.Event()
        self._start: dict[str, Any] = {}
        self._intervals: list[HpStatRecord] = []
        self._summary: HpStatRecord | None = None
        self._error: Exception | None = None
        self._stderr: list[str] = []
        self._lock = threading.Lock()
        self._out_thread = threading.Thread(target=self._read_stdout, daemon=True)
        self._err_thread = threading.Thread(target=self._read_stderr, daemon=True)
        self._out_thread.start()
        self._err_thread.start()

    @classmethod
    def start(
        cls,
        pid: int | None = None,
        interval_s: float = 1.0,
        duration_s: float | None = None,
        *,
        binary: Path | None = None,
        on_interval: Callable[[HpStatRecord], None] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> HpStat:
        """Start hpstat; return once every tracepoint is attached (events from now on count).

        pid None traces the whole system. on_interval is called from a reader thread with
        each interval record as it arrives.
        """
        # --exit-with-parent: hpstat ends if we die without stopping it (its death signal
        # follows the *thread* that started it, so start from a thread that lives as long).
        cmd = [str(binary or find_hpstat()), "--exit-with-parent", "-i", f"{interval_s:g}"]
        if pid is not None:
            cmd += ["-p", str(pid)]
        if duration_s:
            cmd += ["-d", f"{duration_s:g}"]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Ctrl-C in a terminal must reach only the agent, which then stops hpstat in order
            # and collects its summary; a terminal SIGINT sent to hpstat too would race that.
            start_new_session=True,
        )
        trace = cls(proc, on_interval)
        if not trace._started.wait(start_timeout_s):
            trace._kill()
            raise DamonHpError(
                f"hpstat did not attach within {start_timeout_s:g} s; stopped it. "
                f"Its stderr: {trace.stderr.strip() or '(empty)'}"
            )
        if not trace._start:
            trace._raise_exit_error()
        return trace

    # -- reader threads --

    def _read_stdout(self) -> None:
        assert self._proc.stdout is not None
        try:
            for line in self._proc.stdout:
                obj = _parse_line(line)
                if obj is None:
                    continue
                kind = obj["type"]
                if kind == "start":
                    self._start = obj
                    self._started.set()
                elif kind == "interval":
                    record = HpStatRecord.from_json(obj)
                    with self._lock:
                        self._intervals.append(record)
                    if self._on_interval:
                        self._on_interval(record)
                elif kind == "summary":
                    self._summary = HpStatRecord.from_json(obj)
        except Exception as exc:  # surfaced by stop(): a reader thread cannot raise
            self._error = exc
        finally:
            self._started.set()

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)

    # -- state --

    @property
    def pid(self) -> int:
        """hpstat's own process id."""
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    @property
    def intervals(self) -> list[HpStatRecord]:
        with self._lock:
            return list(self._intervals)

    @property
    def attached(self) -> tuple[str, ...]:
        return tuple(self._start.get("attached", ()))

    @property
    def unavailable(self) -> tuple[str, ...]:
        return tuple(self._start.get("unavailable", ()))

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    # -- ending --

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> HpStatSummary:
        """Ask hpstat to finish (SIGINT), wait for its summary and return everything."""
        if self.running:
            self._proc.send_signal(signal.SIGINT)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float | None = None) -> HpStatSummary:
        """Wait for hpstat to end on its own (its duration passed or the target exited)."""
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
            raise DamonHpError(
                f"hpstat did not finish within {timeout_s:g} s of being asked; killed it"
            ) from None
        self._out_thread.join()
        self._err_thread.join()
        if self._error:
            raise self._error
        if self._proc.returncode != 0 or self._summary is None:
            self._raise_exit_error()
        assert self._summary is not None
        return HpStatSummary(
            total=self._summary,
            intervals=tuple(self.intervals),
            attached=self.attached,
            unavailable=self.unavailable,
        )

    def _raise_exit_error(self) -> None:
        self._proc.wait()
        self._err_thread.join()
        message = self.stderr.strip().removeprefix("hpstat: ") or "(no message)"
        code = self._proc.returncode
        if code == 2:
            raise EnvironmentProblem(f"hpstat cannot run here: {message}")
        raise DamonHpError(f"hpstat failed (exit code {code}): {message}")

    def _kill(self) -> None:
        if self.running:
            self._proc.kill()
        self._proc.wait()

    def __enter__(self) -> HpStat:
        return self

    def __exit__(self, *exc: object) -> None:
        # Leave nothing behind, even when the body raised; errors of the body win.
        if self.running:
            try:
                self.stop()
            except DamonHpError:
                self._kill()


def format_table(record: HpStatRecord) -> str:
    """The record as a human table (empty groups left out; zero faults shown)."""
    who = f"pid {record.pid}" if record.pid is not None else "system-wide"
    title = "summary" if record.kind == "summary" else "interval"
    lines = [f"hpstat {title}: {who}, {record.span_s:.2f} s"]

    def row(label: str, value: str) -> None:
        lines.append(f"  {label:<34}{value}")

    def counts(label: str, values: dict[str, int]) -> None:
        if values:
            row(label, ", ".join(f"{k} {v}" for k, v in values.items()))

    def hist(label: str, h: LatencyHistogram) -> None:
        if h.count:
            row(label, f"{h.count}, total {h.total_us / 1000:.3f} ms, mean {h.mean_us:.1f} us, "
                f"all < {h.slowest_below_us} us")

    row("user page faults", str(record.page_faults_user))
    row("khugepaged PMD/file scans", str(record.khugepaged_scans))
    for source, activity in (("khugepaged", record.khugepaged),
                             ("MADV_COLLAPSE", record.madv_collapse)):
        counts(f"THP collapses ({source})", activity.collapse)
        counts(f"THP PMD scans ({source})", activity.scan_pmd)
        counts(f"THP file collapses ({source})", activity.collapse_file)
        counts(f"THP file scans ({source})", activity.scan_file)
    hist("compaction, direct (stalls task)", record.compaction_direct)
    hist("compaction, kernel thread", record.compaction_kthread)
    counts("compaction results", record.compaction_result)
    hist("direct reclaim stalls", record.direct_reclaim)
    counts("TLB flushes", record.tlb_flush)
    counts("madvise calls", record.madvise)
    counts("process_madvise calls", record.process_madvise)
    if record.target_exited:
        lines.append("  (the target process exited)")
    return "\n".join(lines)
