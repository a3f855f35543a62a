"""`source = "auto"` (the daemon's default, and `--source auto`): which access source is chosen
from a DAMON status, why, and what refused the better ones (`sources.choose_kind`, pure).

The refusals are kept one per source: `open_source` lists them one per line when no source
works, and 53333e4 once broke that by splitting a joined reason at '; ', which the refusals
themselves contain (fixed in 875f1d5). The host's real status is the recorded fixture.
"""

from __future__ import annotations

import json
from pathlib import Path

from damon_hp.daemon.config import load_config
from damon_hp.damon import OWNER_FOREIGN, DamonStatus, KdamondInfo
from damon_hp.damon.sources import SourceRequest, choose_kind, parse_source

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
AUTO = SourceRequest()


def status(*kdamonds: KdamondInfo, ops: tuple[str, ...]) -> DamonStatus:
    return DamonStatus(True, True, None, ops, "avail_operations", kdamonds)


def foreign(index: int = 0, pid: int = 77, ops: tuple[str, ...] = ("paddr",)) -> KdamondInfo:
    return KdamondInfo(index, "on", pid, ops, (0,), OWNER_FOREIGN, None)


def test_the_daemons_default_source_is_auto(tmp_path) -> None:
    cfg = tmp_path / "d.toml"
    cfg.write_text('[[rule]]\nname = "x"\nexe = "/bin/true"\n')
    assert load_config(str(cfg)).source == parse_source("auto") == AUTO


def test_auto_takes_vaddr_where_damon_is_free_with_vaddr() -> None:
    kind, why, refusals = choose_kind(AUTO, status(ops=("vaddr", "fvaddr", "paddr")), "asked")
    assert (kind, refusals) == ("vaddr", [])
    assert why == "auto: the best source, DAMON is free"


def test_auto_takes_its_own_paddr_where_damon_is_free_without_vaddr() -> None:
    kind, why, refusals = choose_kind(AUTO, status(ops=("paddr",)), "asked")
    assert kind == "paddr"
    assert len(refusals) == 1 and refusals[0].startswith("vaddr: "), refusals
    assert why.startswith("auto: no vaddr here (vaddr: ")


def test_auto_falls_back_to_passive_with_one_refusal_per_better_source() -> None:
    kind, why, refusals = choose_kind(AUTO, status(foreign(), ops=("paddr",)), "asked")
    assert kind == "passive"
    assert [r.split(":")[0] for r in refusals] == ["vaddr", "paddr"]
    assert all("\n" not in r for r in refusals)
    assert "pid 77" in refusals[1]  # the foreign kdamond that makes DAMON busy is named
    assert why == "auto: " + "; ".join(refusals)


def test_the_recorded_host_status_chooses_passive_naming_its_foreign_kdamond() -> None:
    facts = json.loads((FIXTURES / "doctor-host-6.18.44.json").read_text())["facts"]
    st = DamonStatus.from_dict(facts["damon"])
    kind, why, refusals = choose_kind(AUTO, st, "asked")
    [kd] = st.foreign_running
    assert kind == "passive" and len(refusals) == 2
    assert f"pid {kd.pid}" in why


def test_a_source_asked_for_is_taken_as_asked_with_no_refusals() -> None:
    busy = status(foreign(), ops=("paddr",))
    for text in ("vaddr", "paddr", "passive", "passive=77"):
        req = parse_source(text)
        assert choose_kind(req, busy, "asked for with --source") == (
            req.kind, "asked for with --source", [])
