"""DAMOS schemes in a context of ours: how a `Scheme` becomes sysfs writes.

Every write goes through io.py, and only kdamond.py calls these (on a kdamond it started,
before `on` or before a `commit`). Kept apart from kdamond.py because the scheme layout is
what changes most between kernels: address filters moved to `core_filters` in 6.15, the
per-scheme apply interval came in 6.7, the `allow` flag in 6.14.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import EnvironmentProblem
from . import io
from .model import ULONG_MAX, AccessPattern, AddrRange, Scheme

# The scheme damon-hp puts first in every context it owns: action `stat` (count only, change
# nothing) over every region, so that its tried_regions are a full snapshot of the target.
SNAPSHOT_SCHEME = Scheme(action="stat", pattern=AccessPattern())



def allow_ranges_as_reject_gaps(ranges: tuple[AddrRange, ...]) -> list[AddrRange]:
    """The complement of the union of `ranges` within [0, ULONG_MAX).

    DAMOS address filters before Linux 6.14 can only reject (and, after 6.14, memory that
    matches no filter is allowed when the last filter rejects). Rejecting every gap between the
    wanted ranges therefore limits a scheme to their union on every kernel.
    """
    gaps, pos = [], 0
    for r in sorted(ranges, key=lambda r: r.start):
        if r.start > pos:
            gaps.append(AddrRange(pos, r.start))
        pos = max(pos, r.end)
    if pos < ULONG_MAX:
        gaps.append(AddrRange(pos, ULONG_MAX))
    return gaps


def write_scheme(sdir: Path, s: Scheme, sample_us: int) -> None:
    io.write(sdir / "action", s.action)
    p = s.pattern
    # Every bound, min and max: a new scheme starts at [0, 0] and would match nothing.
    for name, lo, hi in (("sz", p.min_size_bytes, p.max_size_bytes),
                         ("nr_accesses", p.min_nr_accesses, p.max_nr_accesses),
                         ("age", p.min_age, p.max_age)):
        io.write(sdir / f"access_pattern/{name}/min", lo)
        io.write(sdir / f"access_pattern/{name}/max", hi)
    io.write(sdir / "quotas/bytes", s.quota_bytes)
    io.write(sdir / "quotas/ms", s.quota_ms)
    io.write(sdir / "quotas/reset_interval_ms", s.quota_reset_interval_ms)
    apply_us = s.apply_interval_us
    if s.addr_filters and apply_us == 0:
        # DAMON splits a region at an address-filter boundary while applying a scheme, and
        # the part after the split is skipped for the rest of that pass; the next aggregation
        # merges the parts again. Applied once per aggregation, a filter range that starts
        # inside a uniformly accessed region is therefore never reached (seen on 6.12: 0 bytes
        # tried, every pass). Applied every sampling interval, the split survives until the
        # next pass, which then reaches the range.
        apply_us = sample_us
    if (sdir / "apply_interval_us").exists():
        io.write(sdir / "apply_interval_us", apply_us)
    elif s.apply_interval_us:
        raise EnvironmentProblem(
            "damon-hp: this kernel has no per-scheme apply interval (Linux 6.7+); "
            "leave apply_interval_us at 0")
    if s.addr_filters:
        # Address filters are handled by DAMON's core; since 6.15 they live in core_filters.
        fdir = sdir / ("core_filters" if (sdir / "core_filters").is_dir() else "filters")
        gaps = allow_ranges_as_reject_gaps(s.addr_filters)
        io.write(fdir / "nr_filters", len(gaps))
        for i, g in enumerate(gaps):
            f = fdir / str(i)
            io.write(f / "type", "addr")
            io.write(f / "addr_start", g.start)
            io.write(f / "addr_end", g.end)
            io.write(f / "matching", "Y")
            if (f / "allow").exists():
                io.write(f / "allow", "N")


def write_schemes(ctx: Path, schemes: tuple[Scheme, ...], sample_us: int) -> None:
    """The snapshot scheme, then the caller's: `scheme_stats()[i]` is the caller's `schemes[i]`."""
    sdir = ctx / "schemes"
    io.write(sdir / "nr_schemes", 1 + len(schemes))
    for i, s in enumerate((SNAPSHOT_SCHEME, *schemes)):
        write_scheme(sdir / str(i), s, sample_us)
