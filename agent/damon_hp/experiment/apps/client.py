"""What one measured phase of an app run returns, and the latency quantiles both clients'
output formats reduce to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ClientResult:
    """One client run: requests the server answered, and the client's own figures."""

    requests: int
    seconds: float
    throughput: float  # per second, as the client counts it (requests or transactions)
    p50_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    extra: dict[str, Any] = field(default_factory=dict)  # the client's own counts, per phase


def quantile(points: list[tuple[float, float]], q: float) -> float | None:
    """The smallest latency whose cumulative share is >= q, from (latency, cumulative share)
    points; None without points."""
    for value, share in sorted(points):
        if share >= q - 1e-12:
            return value
    return None


def from_histogram(buckets: list[tuple[float, int]], q: float) -> float | None:
    """The q-quantile of a histogram given as (bucket value, count)."""
    total = sum(c for _, c in buckets)
    if total <= 0:
        return None
    seen = 0
    for value, count in sorted(buckets):
        seen += count
        if seen >= q * total:
            return value
    return sorted(buckets)[-1][0]
