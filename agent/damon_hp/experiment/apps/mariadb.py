"""MariaDB: mariadbd with a private data directory, loaded once per experiment with `sysbench
oltp_* prepare` into a seed directory that every run copies (preparing 2 GB takes minutes),
warmed up by reading every table and index into the buffer pool, driven by sysbench
oltp_point_select and oltp_read_only.

MariaDB turns THP off for itself at start-up (prctl(PR_SET_THP_DISABLE), no server option
changes it; then the kernel refuses every collapse with EINVAL). Every arm runs it with the
opt-in shim workloads/bin/libthp-allow.so (LD_PRELOAD), which makes that one call a no-op: the
server then keeps the THP setting it inherited, so thp-never's prctl before exec still holds."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.experiment.apps import server as srv
from damon_hp.experiment.apps.client import ClientResult, from_histogram

TOOLS = ("mariadbd", "mariadb-install-db", "mariadb", "sysbench")
TESTS = ("oltp_point_select", "oltp_read_only")
THP_ALLOW_SHIM = Path(__file__).resolve().parents[4] / "workloads" / "bin" / "libthp-allow.so"
SEED_DONE = "seed-complete"


@dataclass(frozen=True)
class MariaDBParams:
    tables: int = 8
    table_size: int = 1_250_000
    buffer_pool: str = "4G"
    seconds: float = 60.0  # per measured test
    tests: tuple[str, ...] | list[str] = TESTS
    warmup_seconds: float = 20.0  # oltp_read_only after the tables were read once
    settle_s: float = 30.0
    port: int = 0
    timeout_s: float = 1800.0

    def check(self) -> None:
        for name in ("tables", "table_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.buffer_pool, str) or not re.fullmatch(r"\d+[KMG]?",
                                                                     self.buffer_pool):
            raise ValueError(f"buffer_pool must be a size such as 4G, got {self.buffer_pool!r}")
        if not self.tests or any(t not in TESTS for t in self.tests):
            raise ValueError(f"tests must be a non-empty list of {', '.join(TESTS)}, "
                             f"got {self.tests!r}")
        for name in ("seconds", "warmup_seconds", "settle_s", "timeout_s"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or v < 0:
                raise ValueError(f"{name} must be seconds >= 0, got {v!r}")
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ValueError(f"port must be 0 (pick a free one) or a TCP port, got {self.port!r}")


_TX_RE = re.compile(r"transactions:\s+(\d+)\s+\(([\d.]+) per sec")
_Q_RE = re.compile(r"queries:\s+(\d+)\s+\(([\d.]+) per sec")
_TIME_RE = re.compile(r"total time:\s+([\d.]+)s")
_HIST_RE = re.compile(r"^\s*([\d.]+)\s+\|\**\s+(\d+)\s*$")


def parse_sysbench(text: str) -> ClientResult:
    """sysbench's totals; latency quantiles from its --histogram (transaction latency, ms).
    Requests are queries: each one is a round trip the server answers."""
    tx, q, t = _TX_RE.search(text), _Q_RE.search(text), _TIME_RE.search(text)
    if not tx or not q:
        raise DamonHpError("sysbench printed no transaction and query totals")
    buckets = [(float(m.group(1)), int(m.group(2)))
               for m in map(_HIST_RE.match, text.splitlines()) if m]
    return ClientResult(int(q.group(1)), float(t.group(1)) if t else 0.0, float(tx.group(2)),
                        from_histogram(buckets, 0.5), from_histogram(buckets, 0.99),
                        from_histogram(buckets, 0.999))


class MariaDB:
    name = "mariadb"
    server_program = "mariadbd"

    def __init__(self, params: MariaDBParams, clients: int, rep: int) -> None:
        self.p = params
        self.clients = clients
        self.rep = rep
        self.socket: Path | None = None
        self.socket_dir: Path | None = None

    @staticmethod
    def check_installed() -> None:
        missing = [t for t in TOOLS if not shutil.which(t)]
        if missing:
            raise EnvironmentProblem(f"the mariadb app needs {', '.join(missing)}; install "
                                     "mariadb-server and sysbench (`make setup`)")
        if not THP_ALLOW_SHIM.exists():
            raise EnvironmentProblem(f"the mariadb app needs {THP_ALLOW_SHIM} (MariaDB turns "
                                     "THP off for itself; the shim keeps it on); run "
                                     "`make -C workloads`")

    def tests(self) -> list[str]:
        return list(self.p.tests)

    def seed_name(self) -> str:
        return f"mariadb-{self.p.tables}x{self.p.table_size}"

    def env(self, base: dict[str, str]) -> dict[str, str]:
        preload = " ".join(x for x in (str(THP_ALLOW_SHIM), base.get("LD_PRELOAD", "")) if x)
        return {**base, "LD_PRELOAD": preload}

    def _argv(self, datadir: Path, sock: Path, port: int) -> list[str]:
        return ["mariadbd", "--no-defaults", f"--datadir={datadir}", f"--socket={sock}",
                f"--port={port}", "--bind-address=127.0.0.1", "--user=root",
                f"--pid-file={datadir}/mariadbd.pid", f"--log-error={datadir}/error.log",
                f"--innodb-buffer-pool-size={self.p.buffer_pool}",
                "--innodb-buffer-pool-load-at-startup=0", "--innodb-buffer-pool-dump-at-shutdown=0",
                "--innodb-flush-log-at-trx-commit=2", "--innodb-doublewrite=0",
                "--innodb-read-io-threads=2", "--innodb-write-io-threads=2",
                "--max-connections=200", "--performance-schema=0", "--skip-log-bin"]

    def _sysbench(self, test: str, *extra: str) -> list[str]:
        return ["sysbench", test, "--db-driver=mysql", f"--mysql-socket={self.socket}",
                "--mysql-user=root", "--mysql-db=sbtest", f"--tables={self.p.tables}",
                f"--table-size={self.p.table_size}", *extra]

    def _sql(self, query: str) -> str:
        r = subprocess.run(["mariadb", "--no-defaults", "-S", str(self.socket), "-uroot",
                            "-N", "-e", query], capture_output=True, text=True,
                           timeout=self.p.timeout_s, check=False)
        if r.returncode != 0:
            raise DamonHpError(f"mariadb -e {query!r} failed: {r.stderr.strip()}")
        return r.stdout

    def _ready(self) -> bool:
        if self.socket is None or not self.socket.exists():
            return False
        try:
            return self._sql("select 1").strip() == "1"
        except (DamonHpError, subprocess.TimeoutExpired):
            return False

    def _install(self, datadir: Path, log: Path) -> None:
        srv.run_client(["mariadb-install-db", "--no-defaults", f"--datadir={datadir}",
                        "--auth-root-authentication-method=normal", "--skip-test-db",
                        "--user=root"], log, 300, "mariadb-install-db")

    def _seed(self, seed: Path) -> float | None:
        """Install and prepare the tables once (seconds taken; None: done before); runs copy
        it."""
        if (seed / SEED_DONE).exists():
            return None
        t0 = time.monotonic()
        shutil.rmtree(seed, ignore_errors=True)
        seed.mkdir(parents=True)
        data = seed / "data"
        self._install(data, seed / "install.txt")
        with contextlib.ExitStack() as own:
            server = self._start(data, seed, False, self.env(dict(os.environ)),
                                 own)
            self._sql("create database sbtest")
            srv.run_client(self._sysbench("oltp_read_only", f"--threads={min(self.p.tables, 2)}",
                                          "prepare"),
                           seed / "prepare.txt", self.p.timeout_s, "sysbench prepare")
            server.stop()
        (seed / SEED_DONE).write_text("prepared\n")
        return time.monotonic() - t0

    def prepare(self, datadir: Path, shared: Path) -> dict[str, float]:
        seed = shared / self.seed_name()
        seeded = self._seed(seed)
        t0 = time.monotonic()
        subprocess.run(["cp", "-a", "--reflink=auto", str(seed / "data"), str(datadir)],
                       check=True, timeout=self.p.timeout_s)
        for stale in ("mariadbd.pid", "error.log"):
            (datadir / stale).unlink(missing_ok=True)
        out = {"copy_s": round(time.monotonic() - t0, 3)}
        if seeded is not None:
            out["seed_s"] = round(seeded, 3)
        return out

    def _start(self, datadir: Path, rundir: Path, thp_disable: bool, env: dict[str, str],
               stack: contextlib.ExitStack,
               on_spawn: Callable[[int], None] | None = None) -> srv.Server:
        port = self.p.port or srv.free_port()
        # A Unix socket's path must fit in 107 bytes, which a run directory under pytest's or a
        # user's deep tmp does not: the socket lives in a short private directory instead,
        # removed after the server has stopped (callbacks run last-in, first-out).
        sockdir = Path(tempfile.mkdtemp(prefix="damon-hp-mariadb-"))
        stack.callback(shutil.rmtree, sockdir, True)
        self.socket = sockdir / "mysqld.sock"
        server = srv.start("mariadbd", self._argv(datadir, self.socket, port), env,
                           rundir / "server.log", port, thp_disable, stack)
        server.log = datadir / "error.log"
        if on_spawn is not None:
            on_spawn(server.pid)
        server.wait_ready(self._ready, 300.0)
        self.socket_dir = sockdir
        return server

    def start(self, datadir: Path, rundir: Path, thp_disable: bool, env: dict[str, str],
              stack: contextlib.ExitStack,
              on_spawn: Callable[[int], None] | None = None) -> srv.Server:
        return self._start(datadir, rundir, thp_disable, self.env(env), stack, on_spawn)

    def load(self, rundir: Path) -> dict[str, float]:
        t0 = time.monotonic()
        n = int(self._sql("select count(*) from information_schema.tables "
                          "where table_schema='sbtest'").strip())
        if n != self.p.tables:
            raise DamonHpError(f"the copied data directory has {n} sbtest tables, not "
                               f"{self.p.tables}")
        return {"load_s": time.monotonic() - t0}

    def warm_up(self, rundir: Path) -> None:
        # Every row and every secondary index once into the buffer pool, then the mix itself.
        for i in range(1, self.p.tables + 1):
            self._sql(f"select count(*), sum(length(c)) from sbtest.sbtest{i}; "
                      f"select count(k) from sbtest.sbtest{i} force index (k_{i})")
        if self.p.warmup_seconds > 0:
            srv.run_client(self._sysbench("oltp_read_only", f"--threads={self.clients}",
                                          f"--time={self.p.warmup_seconds:g}", "run"),
                           rundir / "warmup.txt", self.p.timeout_s, "sysbench warm-up")

    def drive(self, test: str, rundir: Path) -> ClientResult:
        argv = self._sysbench(test, f"--threads={self.clients}", f"--time={self.p.seconds:g}",
                              "--histogram=on", "--percentile=99", "--rand-seed="
                              f"{1000 + self.rep}", "run")
        text = srv.run_client(argv, rundir / f"client-{test}.txt",
                              self.p.seconds + self.p.timeout_s, f"sysbench {test}")
        return parse_sysbench(text)

    def counters(self) -> dict[str, int]:
        return {}
