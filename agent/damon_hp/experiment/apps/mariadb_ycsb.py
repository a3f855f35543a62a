"""MariaDB driven by YCSB (go-ycsb's mysql binding): workload C (read only) and workload A (50 %
updates) with skewed requests (zipfian by default) on its own table, `ycsb.usertable` (a
VARCHAR(64) primary key and `field_count` VARCHAR(`field_bytes`) fields).

The server, its private data directory, the THP shim and its stop are mariadb.py's. The table is
made once per experiment into a seed data directory that every run copies, as the sysbench app
does with its tables: created as go-ycsb's mysql binding creates it, and filled in primary-key
order by LOAD DATA from a stream of go-ycsb's records (keys `user<h(n)>` as redis_ycsb.py names
them, every field `field_bytes` letters, as go-ycsb's random values are). `go-ycsb load mysql`
inserts in hash order: 2 M records took 308 s here and, its pages split at random, filled the
whole 4 GiB buffer pool where the same rows in key order take ~2.3 GB, the sysbench tables'
size class. go-ycsb's mysql binding speaks TCP only: it connects to the server's port on
127.0.0.1 as a user made for it in the seed."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from damon_hp.errors import DamonHpError
from damon_hp.experiment.apps import server as srv
from damon_hp.experiment.apps import ycsb
from damon_hp.experiment.apps.client import ClientResult
from damon_hp.experiment.apps.mariadb import SEED_DONE, MariaDB
from damon_hp.experiment.apps.redis_ycsb import key_numbers

DATABASE = "ycsb"
TABLE = "usertable"
USER = "ycsb"  # 'ycsb'@'127.0.0.1', no password: the server listens on 127.0.0.1 only


@dataclass(frozen=True)
class MariaDBYcsbParams:
    records: int = 2_000_000
    field_count: int = 10  # YCSB's default record: 10 fields of 100 bytes
    field_bytes: int = 100
    buffer_pool: str = "4G"
    distribution: str = "zipfian"
    tests: tuple[str, ...] | list[str] = ycsb.TESTS
    seconds: float = 30.0  # per measured test (SIGTERM); 0: operations alone bound it
    operations: int = 100_000_000
    warmup_seconds: float = 5.0  # workload C after every row was read once
    settle_s: float = 5.0
    port: int = 0
    timeout_s: float = 1800.0

    # what mariadb.py's seed naming and checks read
    @property
    def tables(self) -> int:
        return 1

    @property
    def table_size(self) -> int:
        return self.records

    def check(self) -> None:
        ycsb.check_common(self)
        if not isinstance(self.buffer_pool, str) or not re.fullmatch(r"\d+[KMG]?",
                                                                     self.buffer_pool):
            raise ValueError(f"buffer_pool must be a size such as 4G, got {self.buffer_pool!r}")
        for name in ("field_count",):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


class MariaDBYcsb(MariaDB):
    name = "mariadb-ycsb"
    p: MariaDBYcsbParams  # type: ignore[assignment]
    port = 0  # the server's, for the client's TCP connection

    @staticmethod
    def check_installed() -> None:
        MariaDB.check_installed()
        ycsb.check_installed()

    def seed_name(self) -> str:
        return f"mariadb-ycsb-{self.p.records}x{self.p.field_count}x{self.p.field_bytes}"

    def _start(self, datadir: Path, rundir: Path, thp_disable: bool, env: dict[str, str],
               stack: contextlib.ExitStack,
               on_spawn: Callable[[int], None] | None = None) -> srv.Server:
        server = super()._start(datadir, rundir, thp_disable, env, stack, on_spawn)
        self.port = server.port
        return server

    def _props(self) -> dict[str, str]:
        return {**ycsb.core_properties(self.p.records, self.p.field_count, self.p.field_bytes,
                                       self.p.distribution),
                "mysql.host": "127.0.0.1", "mysql.port": str(self.port), "mysql.user": USER,
                "mysql.db": DATABASE, "table": TABLE}

    def _seed(self, seed: Path) -> float | None:
        """Install, make the database and its user, `go-ycsb load` the table once (seconds
        taken; None: done before); runs copy it."""
        if (seed / SEED_DONE).exists():
            return None
        t0 = time.monotonic()
        shutil.rmtree(seed, ignore_errors=True)
        seed.mkdir(parents=True)
        data = seed / "data"
        self._install(data, seed / "install.txt")
        with contextlib.ExitStack() as own:
            server = self._start(data, seed, False, self.env(dict(os.environ)), own)
            fields = ", ".join(f"FIELD{i} VARCHAR({self.p.field_bytes})"
                               for i in range(self.p.field_count))
            self._sql(f"create database {DATABASE}; create user '{USER}'@'127.0.0.1'; "
                      f"grant all on {DATABASE}.* to '{USER}'@'127.0.0.1'; "
                      f"create table {DATABASE}.{TABLE} (YCSB_KEY VARCHAR(64) PRIMARY KEY, "
                      f"{fields})")
            self._load_rows(seed / "load.txt")
            server.stop()
        (seed / SEED_DONE).write_text("loaded\n")
        return time.monotonic() - t0

    def _load_rows(self, out: Path) -> None:
        """Every record, in primary-key order, through `LOAD DATA LOCAL INFILE '/dev/stdin'`."""
        keys = sorted(f"user{k}" for k in key_numbers(0, self.p.records).tolist())
        row_tail = ("\t" + "a" * self.p.field_bytes) * self.p.field_count + "\n"
        sql = (f"load data local infile '/dev/stdin' into table {DATABASE}.{TABLE} "
               "fields terminated by '\\t' lines terminated by '\\n'")
        with open(out, "wb") as f:
            proc = srv.spawn(["mariadb", "--no-defaults", "--local-infile=1", "-S",
                              str(self.socket), "-uroot", "-e", sql], subprocess.PIPE, f)
            try:
                assert proc.stdin is not None
                for i in range(0, len(keys), 20_000):
                    proc.stdin.write("".join(k + row_tail
                                             for k in keys[i:i + 20_000]).encode())
                proc.stdin.close()
                code = proc.wait(self.p.timeout_s)
            except BrokenPipeError:
                code = proc.wait(10)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if code != 0:
            raise DamonHpError(f"loading {self.p.records} YCSB records by LOAD DATA failed "
                               f"(exit {code}): {out.read_text(errors='replace').strip()[-300:]}")

    def load(self, rundir: Path) -> dict[str, float]:
        t0 = time.monotonic()
        n = int(self._sql(f"select count(*) from {DATABASE}.{TABLE}").strip())
        if n != self.p.records:
            raise DamonHpError(f"the copied data directory holds {n} YCSB records, not "
                               f"{self.p.records}")
        return {"load_s": time.monotonic() - t0}

    def warm_up(self, rundir: Path) -> None:
        # Every row once into the buffer pool (the primary key is the clustered index), then
        # workload C itself.
        fields = " + ".join(f"length(FIELD{i})" for i in range(self.p.field_count))
        self._sql(f"select count(*), sum({fields}) from {DATABASE}.{TABLE}")
        if self.p.warmup_seconds > 0:
            self._ycsb("ycsb-c", self.p.warmup_seconds, "warmup", rundir)

    def _ycsb(self, test: str, seconds: float, out: str, rundir: Path) -> ClientResult:
        props = {**self._props(), **ycsb.MIXES[test], "operationcount": str(self.p.operations)}
        totals = ycsb.run(ycsb.argv("run", "mysql", props, self.clients),
                          rundir / f"{out}.json", rundir / f"{out}.txt", ycsb.timed(seconds),
                          self.p.timeout_s, f"go-ycsb {test} on mariadb")
        return totals.client_result()

    def counters(self) -> dict[str, int]:
        """Rows the server read so far: go-ycsb counts a read of a missing row as a success, so
        this is what shows that its reads found the loaded records."""
        out = {}
        for line in self._sql("show global status like 'Rows_read'").splitlines():
            name, _, value = line.partition("\t")
            if value.strip().isdigit():
                out[name.strip().lower()] = int(value)
        return out

    def drive(self, test: str, rundir: Path) -> ClientResult:
        return self._ycsb(test, self.p.seconds, f"client-{test}", rundir)
