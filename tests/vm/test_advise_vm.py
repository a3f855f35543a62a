"""`damon-hp advise` on a real, free DAMON (vm tier): the vaddr source. advise's own kdamond only
monitors (no DAMOS scheme but `stat`, which acts on nothing) and is gone afterwards;
hotcold's hot buffer reads accessed and its cold one not.

Ground truth: hotcold's printed ranges and DAMON sysfs, not advise's report.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

from damon_hp.damon import io as damon_io
from leftovers import running_kdamonds

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = str(ROOT / ".venv/bin/damon-hp")
HOTCOLD = str(ROOT / "workloads/bin/hotcold")
INSTANCES = Path("/sys/kernel/tracing/instances")


def scheme_actions() -> list[str]:
    """The DAMOS action of every scheme of every running kdamond."""
    return [damon_io.read(s / "action") for d in running_kdamonds()
            for c in damon_io.numbered_dirs(d / "contexts")
            for s in damon_io.numbered_dirs(c / "schemes")]


def test_advise_monitors_with_a_vaddr_kdamond_of_its_own_and_leaves_nothing() -> None:
    assert running_kdamonds() == {}, "the vm tier starts with no kdamond running"
    seen_actions: list[str] = []
    seen_kdamonds: list[int] = []
    done = threading.Event()

    def watch_sysfs() -> None:  # what advise's kdamond carries while it watches
        while not done.is_set():
            try:
                seen_kdamonds.append(len(running_kdamonds()))
                seen_actions.extend(scheme_actions())
            except OSError:
                pass
            time.sleep(0.5)

    t = threading.Thread(target=watch_sysfs, daemon=True)
    t.start()
    try:
        adv = subprocess.run([DAMON_HP, "advise", "--json", "-q", "--seconds", "30", "--",
                              HOTCOLD, "--hot", "32M", "--cold", "128M", "--seconds", "0"],
                             capture_output=True, text=True, timeout=600)
    finally:
        done.set()
        t.join()
    assert adv.returncode == 0, adv.stderr
    lines = adv.stdout.splitlines()  # hotcold's lines, then the report
    first = json.loads(lines[0])
    report = json.loads("\n".join(lines[lines.index("{"):]))
    assert report["source"]["name"] == "vaddr"
    assert max(seen_kdamonds) == 1, seen_kdamonds  # its own kdamond ran ...
    # ... whose only scheme is the `stat` one every kdamond of damon-hp's carries (its
    # tried_regions are a snapshot reader): it counts, it never acts on memory
    assert set(seen_actions) <= {"stat"}, seen_actions
    assert running_kdamonds() == {}  # ... and is gone
    assert not [n for n in INSTANCES.iterdir() if n.name.startswith("damon-hp-")]
    by_start = {m["start"]: m for m in report["memory"]["mappings"]}
    hot, cold = by_start[first["hot"]["start"]], by_start[first["cold"]["start"]]
    assert hot["accessed_page_share"] >= 0.5, (hot, cold)
    assert hot["accessed_page_share"] >= cold["accessed_page_share"] + 0.3, (hot, cold)
    assert report["access"]["snapshots"] >= 3
