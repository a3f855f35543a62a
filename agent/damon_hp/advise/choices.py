"""What each choice would give on the same process and snapshots. Pure.

- THP-always: every range THP `always` would fault huge (growth.py), in the kinds it acts on.
- everywhere-collapse: MADV_COLLAPSE over all private anonymous memory once (the apps
  experiment's `everywhere` arm): MADV_COLLAPSE ignores max_ptes_none, so one resident page
  makes a range huge, as THP `always` does at fault; shared memory only where shmem_enabled
  lets MADV_COLLAPSE build shmem huge pages (it refuses under `never`).
- damon-hp: the policy run dry on the watch's snapshots (`dry_run_policy`): every range it
  would have planned to collapse, each treated as collapsed.
Per choice: bytes made huge, memory added (absent base pages filled) and the share of the
sampled accesses that fell on ranges it makes huge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from damon_hp import policy
from damon_hp.advise.access import AccessTally
from damon_hp.advise.growth import ANON, SHMEM, Growth
from damon_hp.damon.model import Snapshot
from damon_hp.pipeline import params_for_source
from damon_hp.ranges import HUGE_PAGE_BYTES, PAGE_BYTES, PAGES_PER_HUGE, AddrRange


def dry_run_policy(snapshots: Sequence[Snapshot], mappings: Sequence[AddrRange],
                   resident: Mapping[int, int], source: str,
                   params: policy.PolicyParams | None = None) -> set[int]:
    """The 2 MiB ranges damon-hp's rule would have collapsed over `snapshots`.

    The ONE place `advise` calls the policy (its public API: decide, record_outcomes); every
    planned range is treated as collapsed. `mappings`: the private anonymous mappings;
    `resident`: range start -> resident base pages (the residency guard); `source`: the access
    source's name (physical sources ask for more evidence).
    """
    if not snapshots:
        return set()
    base = params or policy.PolicyParams()
    p = params_for_source(base, physical=source in ("paddr", "passive"), can_demote=False)
    state = policy.PolicyState()
    made: set[int] = set()
    for snap in snapshots:
        decision, state = policy.decide(snap, state, p, mappings=mappings,
                                        thp_mode="never", resident_pages=resident)
        state = policy.record_outcomes(state, dict.fromkeys(decision.promote), p,
                                       snap.taken_at_s)
        made.update(decision.promote)
    return made


@dataclass(frozen=True)
class Choice:
    name: str
    huge_bytes: int
    added_bytes: int
    access_share: float | None
    """share of the sampled accesses on the ranges made huge; None when nothing was sampled"""
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def _choice(name: str, ranges: Mapping[int, int], tally: AccessTally, note: str) -> Choice:
    added = sum(PAGES_PER_HUGE - r for r in ranges.values() if r > 0) * PAGE_BYTES
    share = tally.samples_on(ranges) if tally.total_samples > 0 else None
    return Choice(name, len(ranges) * HUGE_PAGE_BYTES, added, share, note)


def compare(growth: Growth, tally: AccessTally, resident: Mapping[int, int],
            damon_ranges: set[int], shmem_collapsible: bool) -> list[Choice]:
    always = dict(growth.always_resident)
    kinds = (ANON, SHMEM) if shmem_collapsible else (ANON,)
    everywhere = {s: r for s, r in always.items() if growth.always_kind.get(s) in kinds}
    damon = {s: resident.get(s, 0) for s in damon_ranges}
    return [
        _choice("THP-always", always, tally,
                "every 2 MiB range with a resident page, at its first fault"),
        _choice("everywhere-collapse", everywhere, tally,
                "MADV_COLLAPSE of all private anonymous memory"
                + (" and shared memory" if shmem_collapsible else "") + " once"),
        _choice("damon-hp", damon, tally,
                "its rule run dry on these snapshots (ranges hot long enough, at least "
                "half resident)"),
    ]

