"""The 3-minute soak of damon-hpd (issue 26; the 30-minute one is experiments/soak-daemon.py,
figures in docs/daemon.md): 10 long-lived hotcold processes and 30 short-lived ones a minute
(3-9 s each) under one rule and a 64 MiB budget (the long-lived hot sets together: 160 MiB),
through the passive source. How it runs and what it looks at: daemon_soak.py.

Asserted (thresholds beside each):
- between the quiet point after a 40 s warm-up and the last quiet point (only the long-lived
  processes managed at both): open fds, tracefs instances and status records unchanged, VmRSS
  grown <= 5 MiB;
- every exited process's status record was gone within 3 s of the process's exit (one
  aggregation is 5 s here; daemon_soak.RECORD_LAG_MAX_S says why 3), and some short-lived
  processes were managed at all;
- the managed processes' huge pages together never exceeded the budget (smaps, twice a second).
  Whether the foreign kdamond reads any hot set is its own view (on a fragmented machine it
  reads everything idle): the check holds either way, and the test prints which it was;
- SIGTERM: exit 0, no tracefs instance, no status record, the kdamonds as they were.
"""

from __future__ import annotations

import pytest
from daemon_host import MIB
from daemon_soak import RECORD_LAG_MAX_S, RSS_GROWTH_MAX, Plan, Soak
from thp_settings import require_thp_mode

pytestmark = pytest.mark.usefixtures("foreign_kdamond")  # never a skip: conftest.py

# 40 s of warm-up: the daemon's first rounds over short-lived processes (imports, caches,
# its round history) happen there; 100 s of soak after it; with the start and three quiet
# points (<= 9 s each) the test takes about 3 minutes.
WARMUP_S = 40.0
SOAK_S = 100.0


def test_daemon_soak_leaks_nothing_and_lets_go_of_exited_processes_at_once(tmp_path) -> None:
    require_thp_mode("madvise", "never", why="under 'always' hotcold gets huge pages without "
                     "the daemon, so the budget check would not be about the daemon")
    lines: list[str] = []
    res = Soak(Plan(tmp_path, WARMUP_S, SOAK_S, short_per_minute=30, sample_s=2,
                    progress_s=20), say=lines.append).run()
    print("\n".join(lines))
    j = res.to_json()
    print({k: v for k, v in j.items() if k not in ("samples", "plan")})
    assert res.warm is not None and res.end is not None, j["problems"]
    # One passive source: exactly one tracefs instance of the daemon's; every managed process
    # has one record, so at a quiet point exactly the long-lived ones.
    assert res.warm.instances == res.end.instances == 1
    assert res.warm.records == res.end.records == len(res.long_pids) == 10
    # A leak of one fd per managed process would be ~20 here (the short-lived ones managed
    # over 100 s): any change at all fails.
    assert res.end.fds == res.warm.fds, (res.warm, res.end)
    # The bound. Measured 2026-11-25 (commits 95a7c23, 87756cf; load average 13-18 from
    # other sessions): +0.42, +0.89 (a busy loop on one core beside it) and +0.85 MiB; the
    # 30-minute soak grew 2.27 MiB (docs/daemon.md).
    assert res.end.rss - res.warm.rss <= RSS_GROWTH_MAX, (res.warm, res.end)
    # Precondition of the lag check: 52-57 of ~70 were managed in the runs above (the others
    # ended before a rescan, every 8 s, found them).
    assert res.short_managed >= 10, f"only {res.short_managed} short-lived processes managed"
    # Within one aggregation (the issue), and within RECORD_LAG_MAX_S (3 s; why: daemon_soak),
    # which a daemon that noticed exits only at its rounds or rescans would exceed.
    assert RECORD_LAG_MAX_S <= res.aggr_s
    late = [x for x in res.lags if x > RECORD_LAG_MAX_S]
    assert not late, f"records outlived their process by {sorted(late)[-5:]} s"
    assert res.budget_looks >= (WARMUP_S + SOAK_S) // 4
    assert not res.budget_broken, res.budget_broken[:5]
    print(f"most huge at once {res.huge_max / MIB:.0f} MiB of {res.budget_bytes / MIB:.0f}"
          + (" (the foreign kdamond read no hot set: the budget was not tested by one)"
             if res.huge_max == 0 else ""))
    assert res.daemon_exit == 0
    assert not res.left, res.left
    assert not j["problems"], j["problems"]
