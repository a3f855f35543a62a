"""Redis driven by YCSB (go-ycsb's redis binding): workload C (read only) and workload A (50 %
updates) with skewed requests (zipfian by default, go-ycsb's scrambled zipfian: the hot keys are
spread over the whole key space, hence over the whole heap).

The server, its private data directory, its snapshot start and its stop are redis.py's. The
data set is YCSB's own: `go-ycsb load redis` fills a seed server once per experiment (records
of `fieldcount` fields stored as one JSON string per key, `redis.datatype=string`), which SAVEs
the snapshot every run's server starts from, as the redis-benchmark app does with its keys."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from damon_hp.errors import DamonHpError
from damon_hp.experiment.apps import ycsb
from damon_hp.experiment.apps.client import ClientResult
from damon_hp.experiment.apps.redis import RDB, SEED_DONE, Redis


@dataclass(frozen=True)
class RedisYcsbParams:
    records: int = 5_000_000
    field_count: int = 1
    field_bytes: int = 256  # stored base64-encoded in JSON: ~360 bytes per value
    distribution: str = "zipfian"
    tests: tuple[str, ...] | list[str] = ycsb.TESTS
    seconds: float = 30.0  # per measured test (SIGTERM); 0: operations alone bound it
    operations: int = 100_000_000  # per test, the bound when seconds is 0
    warmup_seconds: float = 10.0  # workload C before the tests
    settle_s: float = 5.0
    load_threads: int = 16
    port: int = 0
    timeout_s: float = 1800.0
    churn: bool = False  # the redis-benchmark app's churn names its own keys; not here

    @property
    def keys(self) -> int:  # what redis.py's checks count
        return self.records

    @property
    def value_bytes(self) -> int:
        return self.field_bytes

    def check(self) -> None:
        ycsb.check_common(self)
        if not isinstance(self.field_count, int) or self.field_count < 1:
            raise ValueError(f"field_count must be an integer >= 1, got {self.field_count!r}")
        if self.churn:
            raise ValueError("churn is not available for redis-ycsb")


class RedisYcsb(Redis):
    name = "redis-ycsb"
    p: RedisYcsbParams  # type: ignore[assignment]

    @staticmethod
    def check_installed() -> None:
        Redis.check_installed()
        ycsb.check_installed()

    def seed_name(self) -> str:
        return f"redis-ycsb-{self.p.records}x{self.p.field_count}x{self.p.field_bytes}"

    def _props(self) -> dict[str, str]:
        return {**ycsb.core_properties(self.p.records, self.p.field_count, self.p.field_bytes,
                                       self.p.distribution),
                "redis.addr": f"127.0.0.1:{self.port}", "redis.datatype": "string"}

    def _seed(self, seed: Path) -> dict[str, float | int | None] | None:
        """`go-ycsb load` into a seed server once, then its snapshot (seconds taken; None:
        done before)."""
        if (seed / SEED_DONE).exists():
            return None
        t0 = time.monotonic()
        shutil.rmtree(seed, ignore_errors=True)
        seed.mkdir(parents=True)
        with contextlib.ExitStack() as own:
            server = self._start(seed, seed, False, dict(os.environ), own)
            t_load = time.monotonic()
            ycsb.run(ycsb.argv("load", "redis", self._props(), self.p.load_threads),
                     seed / "load.json", seed / "load.txt", None, self.p.timeout_s,
                     f"go-ycsb load of {self.p.records} records")
            load_s = time.monotonic() - t_load
            self._check_keys("go-ycsb load")
            memory = self._memory(server.pid)
            t_save = time.monotonic()
            if self._cli("save", timeout=self.p.timeout_s).strip() != "OK":
                raise DamonHpError(f"redis SAVE of the seed snapshot failed; see {seed}")
            save_s = time.monotonic() - t_save
            server.stop()
        if not (seed / RDB).exists():
            raise DamonHpError(f"the seed server wrote no snapshot into {seed}")
        (seed / SEED_DONE).write_text("saved\n")
        return {"seed_s": round(time.monotonic() - t0, 3), "seed_load_s": round(load_s, 3),
                "seed_save_s": round(save_s, 3),
                **{f"seed_{k}": v for k, v in memory.items()}}

    def _ycsb(self, test: str, seconds: float, out: str, rundir: Path) -> ClientResult:
        props = {**self._props(), **ycsb.MIXES[test], "operationcount": str(self.p.operations)}
        totals = ycsb.run(ycsb.argv("run", "redis", props, self.clients),
                          rundir / f"{out}.json", rundir / f"{out}.txt", ycsb.timed(seconds),
                          self.p.timeout_s, f"go-ycsb {test} on redis")
        return totals.client_result()

    def warm_up(self, rundir: Path) -> None:
        if self.p.warmup_seconds > 0:
            self._ycsb("ycsb-c", self.p.warmup_seconds, "warmup", rundir)

    def drive(self, test: str, rundir: Path) -> ClientResult:
        return self._ycsb(test, self.p.seconds, f"client-{test}", rundir)
