"""Host tier: tracefs mounted before any test looks at it.

damon-hp mounts tracefs itself when it opens an event stream (events.mount_tracefs), but
several host tests read /sys/kernel/tracing before and after running it (to prove nothing was
left there); on a machine that boots without tracefs (this project's CI host does) the first
such look would fail. test_damon_events_host.py proves the product's own mounting in a mount
namespace without tracefs.
"""

from __future__ import annotations

import pytest
from damon_hp.damon.events import mount_tracefs


@pytest.fixture(scope="session", autouse=True)
def _tracefs_mounted() -> None:
    mount_tracefs()
