"""Redis driven by YCSB (go-ycsb's redis binding): workload C (read only) and workload A (50 %
updates) with skewed requests (zipfian by default, go-ycsb's scrambled zipfian: the hot keys are
spread over the whole key space, hence over the whole heap).

The server, its private data directory, its snapshot start and its stop are redis.py's. The
data set is laid out as go-ycsb's redis binding lays it out (`redis.datatype=string`): record
number n is the key `usertable/user<h(n)>`, h the FNV-1a 64 hash of n's 8 big-endian bytes
taken as a positive int64 (go-ycsb's default `insertorder=hashed`), holding one JSON string of
its `field_count` fields, each `field_bytes` bytes base64-encoded. It is loaded once per
experiment through `redis-cli --pipe` into a seed server, which SAVEs the snapshot every run's
server starts from, as the redis-benchmark app does with its keys: `go-ycsb load` does one
round trip per record (~22 k/s here: 222 s for 5 M records), the pipe ~10x fewer seconds. Every
record holds the same field bytes (letters, as go-ycsb's random values are); reads decode them
the same. The smoke test proves the keys are go-ycsb's: its reads find them."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from damon_hp.errors import DamonHpError
from damon_hp.experiment.apps import ycsb
from damon_hp.experiment.apps.client import ClientResult
from damon_hp.experiment.apps.redis import RDB, SEED_DONE, Redis

TABLE = b"usertable"
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_BATCH = 20_000


def key_numbers(first: int, count: int) -> np.ndarray:
    """go-ycsb's hashed key numbers of records first..first+count-1: FNV-1a 64 of the number's
    8 big-endian bytes, as a positive int64 (util.Hash64), vectorized (uint64 arithmetic wraps
    modulo 2**64 as FNV's does)."""
    n = np.arange(first, first + count, dtype=np.uint64)
    h = np.full(count, _FNV_OFFSET, dtype=np.uint64)
    prime = np.uint64(_FNV_PRIME)
    with np.errstate(over="ignore"):
        for shift in range(56, -8, -8):
            h ^= (n >> np.uint64(shift)) & np.uint64(0xFF)
            h *= prime
    signed = h.view(np.int64)
    return np.where(signed < 0, -signed, signed)  # Go: -result for a negative int64


def record_value(field_count: int, field_bytes: int) -> bytes:
    """One record as go-ycsb's string datatype stores it: json.Marshal of map[field][]byte
    (keys sorted, bytes base64)."""
    import base64
    import json

    raw = bytes(ord("a") + i % 26 for i in range(field_bytes))
    enc = base64.b64encode(raw).decode()
    return json.dumps({f"field{i}": enc for i in sorted(range(field_count), key=str)},
                      separators=(",", ":")).encode()


def record_commands(records: int, field_count: int, field_bytes: int) -> Iterator[bytes]:
    """SET commands (RESP) of every record, in batches."""
    value = record_value(field_count, field_bytes)
    tail = b"$%d\r\n%s\r\n" % (len(value), value)
    for first in range(0, records, _BATCH):
        keys = key_numbers(first, min(_BATCH, records - first))
        parts = []
        for k in keys.tolist():
            name = b"%s/user%d" % (TABLE, k)
            parts.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n" % (len(name), name))
            parts.append(tail)
        yield b"".join(parts)


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
            load_s = self._pipe(record_commands(self.p.records, self.p.field_count,
                                                self.p.field_bytes),
                                seed / "load.txt", f"loading {self.p.records} YCSB records")
            self._check_keys("loading them")
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
