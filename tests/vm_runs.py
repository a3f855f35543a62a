"""The vm tier's VM runs on the host: which vm tests each VM runs, and running the VMs side by side.

One VM per kernel used to run that kernel's tests, one VM after the other. Under TCG with
`thread=single` (damon_hp.testvm) a guest's vCPUs all run on one host thread, so a VM keeps one
host core busy and the other one of a 2-core host sat idle through the whole vm tier. On
2026-11-27, after a reboot made this host's memory-bound work 3-5x slower, the main kernel's
VM alone needed more than its 2700-s timeout, where it had taken 15.4 min (tests/README.md).

So a kernel with many tests is split into shards, each a VM of its own, and up to `workers`
VMs run at once (DAMON_HP_VM_PARALLEL, default: the host's cores, at most 2); `plan` sizes
the shards from each test module's expected seconds so that the workers end together. A shard is a
set of whole test modules (module fixtures such as the smoke experiment run once), and tests
keep their collection order inside it: the tests that read DAMON_STAT's kdamond come first in
their shard, on a freshly booted guest (conftest.pytest_collection_modifyitems says why).

Results: each VM writes one JSON line per test phase (conftest._record); a host vm test passes
or fails on its own lines, or fails with the VM's failure when the VM itself failed.
"""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from damon_hp import testvm


@dataclass
class InsideResult:
    outcome: str = "passed"  # worst of setup/call/teardown: passed < skipped < failed
    texts: list[str] = field(default_factory=list)
    xfail: bool = False


@dataclass
class VmJob:
    """One VM: a kernel and the vm tests it runs (a shard of that kernel's tests)."""

    kernel: testvm.PinnedKernel
    nodeids: list[str]
    label: str  # k7.3, or k7.3 1/2 for a shard
    vm_result: testvm.VmResult | None = None
    setup_error: str | None = None
    results: dict[str, InsideResult] = field(default_factory=dict)
    collect_errors: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def read_results(self, path: Path) -> None:
        if not path.exists():
            return
        rank = {"passed": 0, "skipped": 1, "failed": 2}
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["kind"] == "collect":
                self.collect_errors.append(f"{rec['nodeid']}:\n{rec['text']}")
                continue
            res = self.results.setdefault(rec["nodeid"], InsideResult())
            res.xfail = res.xfail or rec["xfail"]
            if rank[rec["outcome"]] > rank[res.outcome]:
                res.outcome = rec["outcome"]
            if rec["outcome"] != "passed":
                res.texts.append(f"[inside the VM, {rec['when']}: {rec['outcome']}]\n"
                                 f"{rec['text']}{rec['sections']}")

    def failure(self, nodeid: str) -> str | None:
        """Why `nodeid` fails on the host, or None when it passed inside."""
        if self.setup_error:
            return f"vm tier: the test VM could not be started: {self.setup_error}"
        r = self.vm_result
        if r is None:
            return "vm tier: the test VM was stopped before it ran (the session was interrupted)"
        if r.vm_failed:
            return f"vm tier ({self.label}): {r.failure_text()}"
        res = self.results.get(nodeid)
        if res is None:
            errors = "\n".join(self.collect_errors) or (
                f"(no collection error recorded; see {r.run_dir}/stdout)")
            return (f"vm tier: {nodeid} did not run inside the VM (inside pytest exit "
                    f"{r.exit_code}). Inside collection errors:\n{errors}")
        if res.outcome == "failed":
            return "\n".join(res.texts)
        if res.outcome == "skipped" and not res.xfail:
            return "vm tier: skipped inside the VM, and the vm tier never skips:\n" + "\n".join(
                res.texts)
        return None


def default_workers() -> int:
    raw = os.environ.get("DAMON_HP_VM_PARALLEL")
    if raw is None:
        return max(1, min(2, os.cpu_count() or 1))
    try:
        workers = int(raw)
    except ValueError:
        workers = 0
    if workers < 1:
        raise ValueError(f"DAMON_HP_VM_PARALLEL={raw!r}: give the number of VMs to run at once "
                         "(1 or more)")
    return workers


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _modules(nodeids: list[str]) -> list[list[int]]:
    """The indexes of `nodeids`, grouped by test module, in collection order."""
    modules: dict[str, list[int]] = {}
    for i, nodeid in enumerate(nodeids):
        modules.setdefault(module_of(nodeid), []).append(i)
    return list(modules.values())


def _no_lead(_nodeid: str) -> bool:
    return False


def shards_under(nodeids: list[str], cap: float, weight: Callable[[str], float],
                 leads: Callable[[str], bool] = _no_lead) -> list[list[str]]:
    """Lists of whole modules of at most `cap` in weight (a module heavier than `cap` is a list
    of its own), each in collection order: the heaviest module first, each into the first list
    it fits in (first fit decreasing). A module holding a test that `leads` (it must run first
    on a freshly booted guest: conftest.pytest_collection_modifyitems) never joins a list that
    already holds such a module, since only one of them can run first."""
    buckets: list[tuple[list[float], list[int], list[bool]]] = []
    for indexes in sorted(_modules(nodeids), key=lambda ix: sum(weight(nodeids[i]) for i in ix),
                          reverse=True):
        heft = sum(weight(nodeids[i]) for i in indexes)
        lead = any(leads(nodeids[i]) for i in indexes)
        fits = [b for b in buckets if b[0][0] + heft <= cap and not (lead and b[2][0])]
        if not fits:
            buckets.append(([0.0], [], [False]))
        total, members, led = fits[0] if fits else buckets[-1]
        total[0] += heft
        members.extend(indexes)
        led[0] = led[0] or lead
    return [[nodeids[i] for i in sorted(members)] for _total, members, _led in buckets]


def makespan(loads: list[float], workers: int) -> float:
    """When the last of `loads` ends when they run heaviest first, each on the first worker
    free (VmRuns takes its jobs in order, a worker the next when its VM ends)."""
    ends = [0.0] * max(1, workers)
    for load in sorted(loads, reverse=True):
        ends[ends.index(min(ends))] += load
    return max(ends)


# What a VM costs besides its tests, in the weights' unit (seconds inside the VM): boot, the
# guest's pytest start-up and the shut-down, ~100 s per VM in the side-by-side runs of
# 2026-11-28 (a VM's wall time less its tests' durations in results.jsonl).
VM_START_S = 100.0
# No VM is planned longer than this (its tests' expected seconds), to stay well inside the VM
# timeout (DAMON_HP_VM_TIMEOUT_S, 2700 s): VMs of ~1,060-1,280 expected seconds took 1,175-1,356
# s side by side on the slowed host (tests/README.md), and a core kept busy beside CI slows
# them further.
MAX_VM_S = 1400.0
# How many caps between the heaviest module and MAX_VM_S the plan tries.
CAP_STEPS = 40


def plan(by_kernel: dict[str, list[str]], workers: int, weight: Callable[[str], float],
         leads: Callable[[str], bool] = _no_lead) -> list[VmJob]:
    """The VMs to run, the heaviest first. One worker: one VM per kernel. More: each kernel's
    modules packed into VMs under a common cap (shards_under), with the cap whose VMs end
    soonest when run side by side (makespan, each VM also paying VM_START_S), fewer VMs on a
    tie. Equal shards per kernel leave a worker idle at the end when the kernels' totals do not
    divide evenly (2026-11-28's weights, start-ups included: three 7.3 VMs of ~1,260 s and a
    6.12 one of ~800 end at ~2,520 s; 1,500/1,490/810 and 800 at ~2,310). With more than one
    worker, no two modules with tests that `leads` share a VM (shards_under)."""
    kernels = {name: ids for name, ids in by_kernel.items() if ids}
    if workers <= 1:
        shards = {name: [ids] for name, ids in kernels.items()}
    else:
        hefts = [sum(weight(ids[i]) for i in ix)
                 for ids in kernels.values() for ix in _modules(ids)]
        lo = max(hefts, default=0.0)
        caps = [lo + (MAX_VM_S - lo) * k / CAP_STEPS for k in range(CAP_STEPS + 1)]
        best: tuple[tuple[float, int], dict[str, list[list[str]]]] | None = None
        for cap in caps if lo < MAX_VM_S else [lo]:
            tried = {name: shards_under(ids, cap, weight, leads)
                     for name, ids in kernels.items()}
            loads = [sum(weight(i) for i in shard) + VM_START_S
                     for parts in tried.values() for shard in parts]
            key = (makespan(loads, workers), len(loads))
            if best is None or key < best[0]:
                best = (key, tried)
        shards = best[1] if best else {}
    jobs: list[tuple[float, VmJob]] = []
    for name, parts in shards.items():
        kernel = testvm.pinned_kernel(name)
        for n, shard in enumerate(parts, 1):
            label = f"k{kernel.series}" + (f" {n}/{len(parts)}" if len(parts) > 1 else "")
            jobs.append((sum(weight(i) for i in shard), VmJob(kernel, shard, label)))
    jobs.sort(key=lambda wj: wj[0], reverse=True)
    return [job for _w, job in jobs]


class _Prefixed:
    """A text stream that hands whole lines to `sink`, each behind `prefix`, so the output of
    VMs running side by side stays readable. One per stream: a partial line is its own."""

    def __init__(self, sink: Callable[[str], None], prefix: str) -> None:
        self.sink, self.prefix, self.partial = sink, prefix, ""

    def write(self, text: str) -> int:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        for line in lines:
            self.sink(f"{self.prefix}{line}")
        return len(text)

    def flush(self) -> None:
        # testvm's tails flush after every chunk, and a chunk may end mid-line: the partial
        # line waits for its end (or for finish()).
        pass

    def finish(self) -> None:
        if self.partial:
            self.write("\n")


class VmRuns:
    """The vm tier's VMs, started together at the first vm test and run `workers` at a time.

    The VMs' lines wait in a queue that the main thread prints while a host vm test waits
    (with pytest's capture off): worker threads never write to the terminal themselves.
    A SIGTERM or Ctrl-C while they run stops every VM (testvm kills each VM's process group)
    before the session ends; the threads are not daemons, so the interpreter waits for them."""

    def __init__(self, jobs: list[VmJob], workers: int, inside_args: Callable[[VmJob, Path],
                 list[str]], memory: str, timeout_s: float) -> None:
        self.jobs, self.workers, self.inside_args = jobs, workers, inside_args
        self.memory, self.timeout_s = memory, timeout_s
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.queue = list(jobs)
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.old_handler: object = None

    def wait_bound_s(self) -> float:
        """How long a test may wait for its VM: the rounds of VMs before it, each up to the
        VM timeout."""
        return math.ceil(len(self.jobs) / self.workers) * self.timeout_s + 120

    def say(self, text: str) -> None:
        self.lines.put(f"===== vm tier: {text}")

    def drain(self, out: TextIO) -> None:
        """Print the lines the VMs gave so far (main thread, pytest's capture off)."""
        text = []
        while True:
            try:
                text.append(self.lines.get_nowait())
            except queue.Empty:
                break
        if text:
            out.write("\n".join(text) + "\n")
            out.flush()

    def start(self) -> None:
        if self.threads:
            return
        shape = ", ".join(f"{j.label}: {len(j.nodeids)} tests" for j in self.jobs)
        self.say(f"{len(self.jobs)} VM run(s) ({shape}), {self.workers} at a time (TCG, mem "
                 f"{self.memory}, timeout {self.timeout_s:.0f} s each; lines from each VM "
                 "start with its label)")
        if threading.current_thread() is threading.main_thread():
            self.old_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        for _ in range(min(self.workers, len(self.jobs))):
            t = threading.Thread(target=self._worker, name="vm-runs")
            t.start()
            self.threads.append(t)

    def _on_sigterm(self, signum: int, _frame: object) -> None:
        self.stop.set()
        raise testvm.VmTerminated(signum)

    def _next(self) -> VmJob | None:
        with self.lock:
            return self.queue.pop(0) if self.queue and not self.stop.is_set() else None

    def _worker(self) -> None:
        while (job := self._next()) is not None:
            try:
                self._run(job)
            finally:
                job.done.set()
        # Jobs never started (stopped session) are done too: their tests fail, none waits.
        with self.lock:
            left, self.queue = self.queue, []
        for job in left:
            job.done.set()

    def _run(self, job: VmJob) -> None:
        try:
            run_dir = testvm.new_run_dir()
            self.say(f"{job.label}: booting {job.kernel.release} for {len(job.nodeids)} tests "
                     f"(files in {run_dir})")
            streams = [_Prefixed(self.lines.put, f"[{job.label}] ") for _ in range(2)]
            try:
                job.vm_result = testvm.run_in_vm(
                    self.inside_args(job, run_dir), memory=self.memory, timeout_s=self.timeout_s,
                    stdout=streams[0], stderr=streams[1], run_dir=run_dir, kernel=job.kernel,
                    stop=self.stop)
            finally:
                for stream in streams:
                    stream.finish()
        except testvm.DamonHpError as err:
            job.setup_error = str(err)
            self.say(f"{job.label}: cannot start the VM: {err}")
            return
        r = job.vm_result
        boot = f"{r.boot_seconds:.1f} s" if r.boot_seconds is not None else "never"
        self.say(f"{job.label}: done in {r.wall_seconds:.1f} s (booted after {boot}), inside "
                 f"pytest exit {r.exit_code if r.finished else 'n/a'}; files in {r.run_dir}")
        job.read_results(r.run_dir / "results.jsonl")

    def wait(self, job: VmJob, out: TextIO) -> None:
        """Until `job` is done, printing the VMs' lines to `out`; a SIGTERM or Ctrl-C meanwhile
        stops every VM first."""
        self.start()
        try:
            while not job.done.wait(0.5):
                self.drain(out)
        except BaseException:
            self.stop_all(out)
            raise
        self.drain(out)
        if all(j.done.is_set() for j in self.jobs):
            self._restore_handler()

    def stop_all(self, out: TextIO) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        self.drain(out)
        self._restore_handler()

    def _restore_handler(self) -> None:
        if self.old_handler is not None:
            signal.signal(signal.SIGTERM, self.old_handler)  # type: ignore[arg-type]
            self.old_handler = None
