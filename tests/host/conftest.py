"""Host tier: tracefs mounted before any test looks at it.

damon-hp mounts tracefs itself when it opens an event stream (events.mount_tracefs), but
several host tests read /sys/kernel/tracing before and after running it (to prove nothing was
left there); on a machine that boots without tracefs (this project's CI host does) the first
such look would fail. test_damon_events_host.py proves the product's own mounting in a mount
namespace without tracefs.
"""

from __future__ import annotations

from collections.abc import Iterator

import foreign_kdamond as fk
import pytest
from damon_hp.damon.events import mount_tracefs


@pytest.fixture(scope="session", autouse=True)
def _tracefs_mounted() -> None:
    mount_tracefs()


@pytest.fixture(scope="session")
def foreign_kdamond() -> Iterator[fk.ForeignKdamond]:
    """The kdamond not started by damon-hp that the passive-source tests read: the running one,
    else one the tier starts where DAMON is free, else a failure with the reason (never a
    skip; see foreign_kdamond.py)."""
    yield from fk.provide()
