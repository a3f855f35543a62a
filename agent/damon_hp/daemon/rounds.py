"""One decision round of damon-hpd over every process it manages (service.py runs the loop):

    for each managed process:  pipeline.look (its maps, status, page frames)
    physical sources:          revmap.reverse_map_many (one pass over every process's frames)
    for each managed process:  pipeline.complete -> pipeline.decide (no budget of its own)
    budget.admit               candidates of all processes, best first, under the budgets
    for each managed process:  pipeline.act(admitted), then what it did is tallied

A process found gone at any step is let go at once (Service.release).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from damon_hp import policy, procfs, stagecpu
from damon_hp.daemon import budget as budget_mod
from damon_hp.daemon import reporting
from damon_hp.daemon.managed import Managed
from damon_hp.damon import revmap
from damon_hp.damon.model import Snapshot
from damon_hp.frame_moves import shared_machine_counters
from damon_hp.pipeline import Look

if TYPE_CHECKING:
    from damon_hp.daemon.service import Service

MAX_ROUNDS_KEPT = 200  # decision rounds with candidates kept for --json


def run_round(svc: Service, phys: Snapshot | None,
              virt: dict[int, Snapshot] | None = None) -> None:
    """One decision round: `phys`, a machine-wide physical aggregation, or `virt`, the
    newest virtual snapshot of each target of our vaddr kdamond (processes without one
    this time decide nothing, and what they hold still counts against the budgets)."""
    thp = procfs.thp_mode()
    candidates: list[budget_mod.Candidate] = []
    # Every process is observed before any is acted on: one read of the machine's
    # frame-moving counters serves them all, and one reverse map.
    with shared_machine_counters():
        looks: dict[int, Look] = {}
        for pid, m in list(svc.managed.items()):
            snap = phys if virt is None else virt.get(pid)
            if snap is None:
                continue
            try:
                looks[pid] = m.pipeline.look(snap)
            except (procfs.ProcessGone, revmap.ProcessGone):
                svc.release(pid, "exited")
        mapped = _reverse_map_all(svc.cpu, phys, looks)
        for pid, look in looks.items():
            m = svc.managed[pid]
            try:
                decision = _decide(m, look, mapped.get(pid), thp)
            except (procfs.ProcessGone, revmap.ProcessGone):
                svc.release(pid, "exited")
                continue
            if decision is not None:
                candidates += [budget_mod.Candidate(pid, m.rule, s, decision.benefit[s])
                               for s in decision.promote]
    held = {pid: m.held_bytes for pid, m in svc.managed.items()}
    held_before = sum(held.values())
    adm = budget_mod.admit(
        candidates, held,
        {pid: m.rule for pid, m in svc.managed.items()}, svc.budget_bytes,
        svc.rule_budgets())
    for pid, m in list(svc.managed.items()):
        if m.pending is None:
            continue
        snap, decision = m.pending
        m.pending = None
        promote = adm.admitted.get(pid, ())
        by_budget = adm.held_by_budget.get(pid, 0)
        by_rule = adm.held_by_rule.get(pid, 0)
        m.held_by_budget, m.held_by_rule = by_budget, by_rule
        decision = dataclasses.replace(
            decision, promote=promote,
            held_by_budget=decision.held_by_budget + by_budget + by_rule)
        try:
            applied = m.pipeline.act(decision, snap.taken_at_s)
            with m.pipeline.cpu.stage(stagecpu.MEASURE):
                m.huge_bytes = m.measure_huge(applied)
        except procfs.ProcessGone:
            svc.release(pid, "exited")
            continue
        for r in applied.collapses:
            if r.error is None:
                m.collapses += 1
                m.collapsed_bytes += r.bytes_done
            else:
                m.errors[r.error] = m.errors.get(r.error, 0) + 1
        m.collapses += len(applied.adopted)
        svc.totals["collapses"] += sum(r.error is None for r in applied.collapses)
        svc.collapse_cpu_s += sum(r.cpu_seconds for r in applied.collapses)
        svc.totals["collapsed_bytes"] += sum(r.bytes_done for r in applied.collapses)
        svc.totals["errors"] += sum(r.error is not None for r in applied.collapses)
        svc.totals["held_by_budget"] += by_budget
        svc.totals["held_by_rule"] += by_rule
    svc.totals["rounds"] += 1
    if candidates:
        admitted = {(pid, s) for pid, starts in adm.admitted.items() for s in starts}
        svc.rounds.append({
            "t_s": round(time.monotonic() - svc.started, 3),
            "held_bytes_before": held_before,
            "candidates": [{"pid": c.pid, "rule": c.rule, "start": c.start,
                            "benefit": round(c.benefit, 1),
                            "admitted": (c.pid, c.start) in admitted} for c in candidates],
        })
        del svc.rounds[:-MAX_ROUNDS_KEPT]
        reporting.write_json(svc)


def _reverse_map_all(cpu: stagecpu.StageCpu, phys: Snapshot | None,
                     looks: dict[int, Look]) -> dict[int, revmap.VirtualAccess]:
    """The physical aggregation through every looked-at process's frames, in one pass
    (revmap.reverse_map_many); none for a virtual source."""
    with_frames = [(pid, look.frames) for pid, look in looks.items()
                   if look.frames is not None]
    if phys is None or not with_frames:
        return {}
    with cpu.stage(stagecpu.REVERSE_MAP):
        maps = revmap.reverse_map_many(phys, [frames for _, frames in with_frames])
    return {pid: mapped for (pid, _), mapped in zip(with_frames, maps, strict=True)}


def _decide(m: Managed, look: Look, mapped: revmap.VirtualAccess | None,
            thp: str) -> policy.Decision | None:
    """The process's decision on this aggregation (physical, or its own virtual one); None
    while it is skipped (THP disabled for itself). Its pipeline observes every aggregation,
    skipped or not, so first touch is judged against the latest look."""
    obs = m.pipeline.complete(look, mapped)
    m.mappings = obs.mappings
    if m.skip_if_thp_disabled(obs.status):
        return None
    decision = m.pipeline.decide(obs, thp)
    m.snapshots += 1
    m.hot_bytes = decision.hot_bytes
    m.pending = (look.snapshot, decision)
    return decision
