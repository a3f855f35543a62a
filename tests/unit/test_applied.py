"""Applied.touched_nothing and only_collapses: whether a snapshot's actions left the target's page
tables and VMAs as they were, or changed them only by collapses that all took, which lets the
agent and damon-hpd take the frame reader's PAGEMAP_SCAN of that aggregation (with those
collapses added) as the huge-page measurement instead of walking the page tables again, and
the frame reader skip its next scan (frame_reader.FrameReader.collapsed)."""

from __future__ import annotations

import dataclasses

import pytest
from damon_hp.actuate import ActionResult, Applied, SchemeCommit

HUGE = 2 << 20


def result(action: str, error: str | None = None) -> ActionResult:
    return ActionResult(action, 0, HUGE, 0 if error else HUGE, error, 0.001)


def test_nothing_applied_touched_nothing() -> None:
    assert Applied().touched_nothing


@pytest.mark.parametrize("change", [
    {"collapses": [result("collapse")]},
    # a failed collapse may still have split or compacted: the page tables are read again
    {"collapses": [result("collapse", "EAGAIN")]},
    {"adopted": (0,)},
    {"damos_collapses": [result("collapse")]},
    {"demotions": [result("nohugepage")]},
    {"recollapses": [result("collapse")]},
    {"commit": SchemeCommit({"hugepage": HUGE}, None, 0.01)},
])
def test_any_action_counts_as_touching(change: dict) -> None:
    assert not dataclasses.replace(Applied(), **change).touched_nothing


def test_only_collapses_names_the_ranges_when_collapses_that_took_were_all() -> None:
    ok = [ActionResult("collapse", s, s + HUGE, HUGE, None, 0.001) for s in (0, 2 * HUGE)]
    assert Applied(collapses=ok).only_collapses == (0, 2 * HUGE)
    assert Applied(collapses=ok, adopted=(4 * HUGE,)).only_collapses == (0, 2 * HUGE)
    assert Applied().only_collapses == ()


@pytest.mark.parametrize("change", [
    {"collapses": [result("collapse"), result("collapse", "EAGAIN")]},
    {"damos_collapses": [result("collapse")]},
    {"demotions": [result("nohugepage")]},
    {"recollapses": [result("collapse")]},
    {"commit": SchemeCommit({"hugepage": HUGE}, None, 0.01)},
])
def test_only_collapses_is_none_beside_anything_else(change: dict) -> None:
    assert dataclasses.replace(Applied(), **change).only_collapses is None
