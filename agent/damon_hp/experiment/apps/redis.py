"""Redis: redis-server with a private data directory and no persistence, driven by
redis-benchmark GET and SET with random keys over the whole key space, pipelined; and the churn:
a random half of the keys deleted and as many new ones loaded.

The data set is loaded once per experiment: a seed server is fed through `redis-cli --pipe`
(keys key:000000000000 ... exactly as redis-benchmark's -r names them) and SAVEs an RDB snapshot
into a seed directory; every run's server starts from a hard link to that snapshot. Loading
6 M keys through the pipe took most of a minute per run; reading the snapshot takes seconds.
The data set is laid out alike: Redis reads the snapshot key by key into the allocator size
classes the pipe's SETs use (key, object and a raw value longer than 44 bytes, allocated
together). It differs in the order (hash-table order, not the order of writing: random keys
over the whole key space cannot tell) and in the main hash table, sized once from the
snapshot's key count instead of doubled as keys arrive."""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from damon_hp import procfs
from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.experiment.apps import server as srv
from damon_hp.experiment.apps.client import ClientResult, quantile
from damon_hp.experiment.interrupts import deferred_interrupts

TOOLS = ("redis-server", "redis-cli", "redis-benchmark")
TESTS = ("get", "set")
LOAD_BATCH = 20_000
RDB = "dump.rdb"
SEED_DONE = "seed-complete"


@dataclass(frozen=True)
class RedisParams:
    keys: int = 8_000_000
    value_bytes: int = 256
    pipeline: int = 16
    requests: int = 10_000_000  # per measured test
    tests: tuple[str, ...] | list[str] = TESTS
    warmup_requests: int = 0  # 0: as many as there are keys
    settle_s: float = 30.0  # every arm waits this long after the warm-up, before measuring
    churn: bool = True
    churn_settle_s: float = 20.0
    port: int = 0  # 0: a free port
    timeout_s: float = 1800.0  # per client run

    def check(self) -> None:
        for name in ("keys", "value_bytes", "pipeline", "requests"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not self.tests or any(t not in TESTS for t in self.tests):
            raise ValueError(f"tests must be a non-empty list of {', '.join(TESTS)}, "
                             f"got {self.tests!r}")
        for name in ("settle_s", "churn_settle_s", "timeout_s"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or v < 0:
                raise ValueError(f"{name} must be seconds >= 0, got {v!r}")
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ValueError(f"port must be 0 (pick a free one) or a TCP port, got {self.port!r}")

    @property
    def approx_bytes(self) -> int:
        # ~90 bytes of dict entry, key and robj per key besides the value (measured: 2.6 GiB
        # for 6.9 M keys of 256 B)
        return self.keys * (self.value_bytes + 150)


def key(i: int) -> bytes:
    return b"key:%012d" % i


def _resp(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)


def _template(command: bytes, value: bytes | None) -> bytes:
    """One RESP command on key(i) as a %-template of i (the key's 12 digits are its only
    varying bytes): one formatting per key is ~4x faster than building each command from its
    parts, which matters for the runner's CPU on 6 M keys (~4 s instead of ~16 s)."""
    def esc(b: bytes) -> bytes:
        return b.replace(b"%", b"%%")

    parts = [b"*%d\r\n" % (2 if value is None else 3), b"$%d\r\n" % len(command), esc(command),
             b"\r\n$%d\r\n" % len(key(0)), b"key:%012d\r\n"]
    if value is not None:
        parts += [b"$%d\r\n" % len(value), esc(value), b"\r\n"]
    return b"".join(parts)


def _batches(template: bytes, ids: range | list[int]) -> Iterator[bytes]:
    for n in range(0, len(ids), LOAD_BATCH):
        yield b"".join([template % i for i in ids[n:n + LOAD_BATCH]])


def set_commands(ids: range | list[int], value: bytes) -> Iterator[bytes]:
    return _batches(_template(b"SET", value), ids)


def del_commands(ids: list[int]) -> Iterator[bytes]:
    return _batches(_template(b"DEL", None), ids)


_PCT_RE = re.compile(r"^\s*([\d.]+)% <= ([\d.]+) milliseconds")
_RPS_RE = re.compile(r"throughput summary: ([\d.]+) requests per second")


def parse_benchmark(text: str, requests: int, seconds: float) -> ClientResult:
    """redis-benchmark's throughput summary and its "Latency by percentile distribution"."""
    m = _RPS_RE.search(text)
    if not m:
        raise DamonHpError("redis-benchmark printed no throughput summary")
    section = text.split("Latency by percentile distribution:", 1)[-1]
    section = section.split("Cumulative distribution of latencies:", 1)[0]
    points = []
    for line in section.splitlines():
        pm = _PCT_RE.match(line)
        if pm:
            points.append((float(pm.group(2)), float(pm.group(1)) / 100))
    return ClientResult(requests, seconds, float(m.group(1)), quantile(points, 0.5),
                        quantile(points, 0.99), quantile(points, 0.999))


class Redis:
    name = "redis"
    server_program = "redis-server"

    def __init__(self, params: RedisParams, clients: int, rep: int) -> None:
        self.p = params
        self.clients = clients
        self.port = 0
        self.server_pid = 0

    @staticmethod
    def check_installed() -> None:
        missing = [t for t in TOOLS if not shutil.which(t)]
        if missing:
            raise EnvironmentProblem(f"the redis app needs {', '.join(missing)}; install "
                                     "redis-server and redis-tools (`make setup`)")

    def tests(self) -> list[str]:
        return list(self.p.tests)

    def seed_name(self) -> str:
        return f"redis-{self.p.keys}x{self.p.value_bytes}"

    def prepare(self, datadir: Path, shared: Path) -> dict[str, float | int | None]:
        """The run's data directory holding a hard link to the seed's snapshot (made first if
        this is the experiment's first Redis run). The server never writes it (no save
        points, and a save would replace the link by rename, not write through it)."""
        seed = shared / self.seed_name()
        seeded = self._seed(seed)
        datadir.mkdir(parents=True, exist_ok=True)
        try:
            os.link(seed / RDB, datadir / RDB)
        except OSError:  # another file system
            shutil.copyfile(seed / RDB, datadir / RDB)
        out: dict[str, float | int | None] = {"rdb_bytes": (seed / RDB).stat().st_size}
        if seeded is not None:
            out.update(seeded)
        return out

    def _seed(self, seed: Path) -> dict[str, float | int | None] | None:
        """Load the keys once through the pipe into a seed server and SAVE its snapshot
        (seconds taken; None: done before)."""
        if (seed / SEED_DONE).exists():
            return None
        t0 = time.monotonic()
        shutil.rmtree(seed, ignore_errors=True)
        seed.mkdir(parents=True)
        with contextlib.ExitStack() as own:
            server = self._start(seed, seed, False, dict(os.environ), own)
            load_s = self._pipe(set_commands(range(self.p.keys), b"v" * self.p.value_bytes),
                                seed / "load.txt", f"loading {self.p.keys} keys")
            self._check_keys("loading them")
            memory = self._memory(server.pid)
            t_save = time.monotonic()
            if self._cli("save", timeout=self.p.timeout_s).strip() != "OK":
                raise DamonHpError(f"redis SAVE of the seed snapshot failed; see {seed}")
            save_s = time.monotonic() - t_save
            server.stop()
        (seed / SEED_DONE).write_text("saved\n")
        return {"seed_s": round(time.monotonic() - t0, 3), "seed_load_s": round(load_s, 3),
                "seed_save_s": round(save_s, 3),
                **{f"seed_{k}": v for k, v in memory.items()}}

    def start(self, datadir: Path, rundir: Path, thp_disable: bool, env: dict[str, str],
              stack: contextlib.ExitStack,
              on_spawn: Callable[[int], None] | None = None) -> srv.Server:
        return self._start(datadir, rundir, thp_disable, env, stack, on_spawn)

    def _start(self, datadir: Path, rundir: Path, thp_disable: bool, env: dict[str, str],
               stack: contextlib.ExitStack,
               on_spawn: Callable[[int], None] | None = None) -> srv.Server:
        self.port = self.p.port or srv.free_port()
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(datadir), "--dbfilename", RDB, "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
                "--io-threads", "1",
                # Redis turns THP off for itself only under THP mode always; never here.
                "--disable-thp", "no", "--maxmemory", "0", "--loglevel", "notice"]
        server = srv.start("redis-server", argv, env, rundir / "server.log", self.port,
                           thp_disable, stack)
        if on_spawn is not None:
            on_spawn(server.pid)
        # it answers PING with -LOADING until the snapshot is in memory
        server.wait_ready(self._ping, max(60.0, self.p.timeout_s))
        self.server_pid = server.pid
        return server

    def _cli(self, *args: str, timeout: float = 60.0) -> str:
        r = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True,
                           text=True, timeout=timeout, check=False)
        if r.returncode != 0:
            raise DamonHpError(f"redis-cli {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout

    def _ping(self) -> bool:
        try:
            return self._cli("ping").strip() == "PONG"
        except (DamonHpError, subprocess.TimeoutExpired):
            return False

    def _pipe(self, chunks: Iterator[bytes], out: Path, what: str) -> float:
        """Feed RESP commands to `redis-cli --pipe`; seconds taken."""

        t0 = time.monotonic()
        with open(out, "wb") as f:
            with deferred_interrupts():
                proc = subprocess.Popen(["redis-cli", "-p", str(self.port), "--pipe"],
                                        stdin=subprocess.PIPE, stdout=f,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            try:
                assert proc.stdin is not None
                for chunk in chunks:
                    proc.stdin.write(chunk)
                proc.stdin.close()
                code = proc.wait(self.p.timeout_s)
            except BrokenPipeError:
                code = proc.wait(10)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        text = out.read_text(errors="replace")
        if code != 0 or "errors: 0" not in text:
            raise DamonHpError(f"{what} through redis-cli --pipe failed (exit {code}): "
                               + " / ".join(text.strip().splitlines()[-2:]))
        return time.monotonic() - t0

    def _check_keys(self, after: str) -> None:
        n = int(self._cli("dbsize").strip())
        if n != self.p.keys:
            raise DamonHpError(f"redis holds {n} keys after {after}, not {self.p.keys}")

    def _memory(self, pid: int) -> dict[str, int | None]:
        """The allocator's bytes in use (INFO memory) and the RSS: after the seed's pipe load
        and after each run's snapshot load, to show the two lay the data set out alike."""
        info = dict(line.strip().partition(":")[::2]
                    for line in self._cli("info", "memory").splitlines() if ":" in line)
        used = info.get("used_memory")
        return {"used_memory": int(used) if used and used.isdigit() else None,
                "rss_bytes": procfs.smaps_rollup(pid).get("Rss")}

    def load(self, rundir: Path) -> dict[str, int | None]:
        """The snapshot was loaded before the server answered (ready_s); check it is whole."""
        self._check_keys("loading the seed snapshot")
        return {f"loaded_{k}": v for k, v in self._memory(self.server_pid).items()}

    def _benchmark(self, test: str, requests: int, out: Path) -> ClientResult:
        argv = ["redis-benchmark", "-p", str(self.port), "-t", test, "-r", str(self.p.keys),
                "-n", str(requests), "-P", str(self.p.pipeline), "-c", str(self.clients),
                "-d", str(self.p.value_bytes)]
        t0 = time.monotonic()
        text = srv.run_client(argv, out, self.p.timeout_s, f"redis-benchmark -t {test}")
        return parse_benchmark(text, requests, time.monotonic() - t0)

    def warm_up(self, rundir: Path) -> None:
        self._benchmark("get", self.p.warmup_requests or self.p.keys, rundir / "warmup.txt")

    def drive(self, test: str, rundir: Path) -> ClientResult:
        return self._benchmark(test, self.p.requests, rundir / f"client-{test}.txt")

    def counters(self) -> dict[str, int]:
        """keyspace hits and misses so far (a GET of a key that is not there is a miss)."""
        out = {}
        for line in self._cli("info", "stats").splitlines():
            k, _, v = line.strip().partition(":")
            if k in ("keyspace_hits", "keyspace_misses"):
                out[k] = int(v)
        return out

    def churn(self, rundir: Path, rep: int) -> dict[str, float]:
        """Delete a random half of the keys, then load as many new ones (ids after the key
        space): what a cache does over time, leaving holes in the allocator's pages."""
        rng = random.Random(7000 + rep)
        gone = rng.sample(range(self.p.keys), self.p.keys // 2)
        t_del = self._pipe(del_commands(gone), rundir / "churn-del.txt",
                           f"deleting {len(gone)} keys")
        value = b"w" * self.p.value_bytes
        new = range(self.p.keys, self.p.keys + len(gone))
        t_new = self._pipe(set_commands(new, value), rundir / "churn-load.txt",
                           f"loading {len(gone)} new keys")
        return {"deleted": len(gone), "added": len(gone), "delete_s": t_del, "load_s": t_new}
