"""When damon-hpd writes a managed process's status record again, pure.

    due(written, record, now) -> bool    written: the last write's (stable part, figures, time)
    split(record) -> (stable part, figures)
"""

from __future__ import annotations

from typing import Any

# How stale a status record's figures (FIGURES) may grow when nothing else in it changes.
STATUS_FIGURES_EVERY_S = 15.0
# The fields of a status record that move with the rounds: counts, and bytes held or hot.
FIGURES = ("snapshots", "promotions", "promoted_bytes", "collapsed_bytes", "anon_huge_bytes",
           "hot_bytes", "held_by_budget")


def due(written: tuple[dict[str, Any], dict[str, Any], float] | None, record: dict[str, Any],
        now: float) -> bool:
    """Whether a managed process's status record must be written again: never written, or
    something in it but its time and FIGURES changed, or a figure left 0 (the first snapshot,
    the first promotion show at once), or the figures moved and the last write is
    STATUS_FIGURES_EVERY_S old. At 50 processes the figures moved in almost every record at
    every round: 34 files written and renamed per 5-s round, 0.2-0.3 % of a core
    (docs/cost.md)."""
    if written is None:
        return True
    stable, figures = split(record)
    last_stable, last_figures, last_t = written
    if stable != last_stable:
        return True
    if figures == last_figures:
        return False
    return (any(figures[k] and not last_figures.get(k) for k in figures)
            or now - last_t >= STATUS_FIGURES_EVERY_S)


def split(record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the record less its time and FIGURES, its FIGURES)."""
    stable = {k: v for k, v in record.items() if k != "updated" and k not in FIGURES}
    return stable, {k: record[k] for k in FIGURES if k in record}
