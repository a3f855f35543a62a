"""The kdamond the host tier's passive tests read: one that damon-hp did not start.

The project's rule for these tests (issue 27): where a kdamond already runs (this CI host:
kdamond 0, paddr, 500 ms samples, 5 s aggregations), it is used and never written; where none
runs and DAMON is free, the tier starts one of its own by raw sysfs writes, as another tool
would, and damon-hp treats it as foreign (no ownership record of damon-hp's proves it ours);
where neither is possible, every test that needs one fails with the reason. Never a skip: a
machine prepared by `make setup` either has the kdamond or says why not.

The kdamond started here copies the CI host's intervals (the tests' deadlines were set for
them), watches every System RAM range (so every process's frames lie inside) and carries no
scheme (a pageout scheme would change the tests' memory).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from leftovers import damon_read

ADMIN = Path("/sys/kernel/mm/damon/admin")
KDAMONDS = ADMIN / "kdamonds"
SAMPLE_US, AGGR_US = 500_000, 5_000_000  # as the CI host's foreign kdamond
MIN_REGIONS, MAX_REGIONS = 10, 1000


@dataclass(frozen=True)
class ForeignKdamond:
    dir: Path
    pid: int
    started_here: bool


def running() -> list[ForeignKdamond]:
    """The kdamonds sysfs shows running, in index order (read only)."""
    out = []
    if not KDAMONDS.is_dir():
        return out
    for d in sorted(KDAMONDS.glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            if damon_read(d / "state") == "on":
                out.append(ForeignKdamond(d, int(damon_read(d / "pid")), False))
        except OSError:
            continue
    return out


def why_none_can_start() -> str | None:
    """Why the tier cannot start a paddr kdamond of its own here, or None when it can: DAMON
    sysfs present, paddr offered, and no kdamond dir at all (an idle dir is someone's
    configuration, not ours to overwrite)."""
    if not KDAMONDS.is_dir():
        return (f"{KDAMONDS} is missing: this kernel has no DAMON sysfs (CONFIG_DAMON_SYSFS), "
                "so no kdamond can run for the passive source")
    nr = int(damon_read(KDAMONDS / "nr_kdamonds"))
    if nr != 0:
        return (f"no kdamond runs, but DAMON sysfs holds {nr} idle kdamond dir(s) that are not "
                "the tests' to reconfigure; start that kdamond (or clear it: echo 0 > "
                f"{KDAMONDS}/nr_kdamonds) and run the tests again")
    return None


def system_ram() -> list[tuple[int, int]]:
    """Top-level System RAM ranges of /proc/iomem, [start, end) page-aligned."""
    out = []
    for line in Path("/proc/iomem").read_text().splitlines():
        if line.startswith(" ") or not line.endswith(": System RAM"):
            continue
        lo, hi = (int(x, 16) for x in line.split(" : ")[0].split("-"))
        start, end = -(-lo // 4096) * 4096, (hi + 1) // 4096 * 4096
        if end > start:
            out.append((start, end))
    return out


def _write(path: Path, value: object) -> None:
    path.write_text(str(value))


def start_own() -> ForeignKdamond:
    """A paddr kdamond over all System RAM by raw sysfs writes (only where DAMON is free)."""
    _write(KDAMONDS / "nr_kdamonds", 1)
    kd = KDAMONDS / "0"
    try:
        _write(kd / "contexts/nr_contexts", 1)
        ctx = kd / "contexts/0"
        _write(ctx / "operations", "paddr")
        _write(ctx / "monitoring_attrs/intervals/sample_us", SAMPLE_US)
        _write(ctx / "monitoring_attrs/intervals/aggr_us", AGGR_US)
        _write(ctx / "monitoring_attrs/nr_regions/min", MIN_REGIONS)
        _write(ctx / "monitoring_attrs/nr_regions/max", MAX_REGIONS)
        _write(ctx / "targets/nr_targets", 1)
        ram = system_ram()
        regions = ctx / "targets/0/regions"
        _write(regions / "nr_regions", len(ram))
        for i, (start, end) in enumerate(ram):
            _write(regions / f"{i}/start", start)
            _write(regions / f"{i}/end", end)
        _write(kd / "state", "on")
        return ForeignKdamond(kd, int(damon_read(kd / "pid")), True)
    except BaseException:
        stop_own(kd)
        raise


def stop_own(kd: Path) -> None:
    """Stop and remove the kdamond start_own made (never any other)."""
    try:
        if damon_read(kd / "state") == "on":
            _write(kd / "state", "off")
        deadline = time.monotonic() + 30
        while damon_read(kd / "state") != "off" and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        _write(KDAMONDS / "nr_kdamonds", 0)


def provide() -> Iterator[ForeignKdamond]:
    """The session fixture's body (conftest.py): the running kdamond, else one of the tier's
    own for the session, else a failure naming why."""
    found = running()
    if found:
        yield found[0]
        return
    why = why_none_can_start()
    if why is not None:
        pytest.fail(f"the passive-source tests need a running kdamond and none runs here: "
                    f"{why}", pytrace=False)
    kd = start_own()
    try:
        yield kd
    finally:
        stop_own(kd.dir)
