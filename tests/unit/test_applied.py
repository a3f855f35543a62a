"""Applied.touched_nothing: whether a snapshot's actions left the target's page tables and VMAs
as they were, which lets the agent and damon-hpd take the frame reader's PAGEMAP_SCAN of that
aggregation as the huge-page measurement instead of walking the page tables again."""

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
