"""The advice: one verdict line a person can act on, the text report, and the JSON. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from damon_hp.advise.access import AccessSummary, MappingAccess
from damon_hp.advise.choices import Choice
from damon_hp.advise.growth import KIND_LABELS, Growth
from damon_hp.advise.hazards import Facts, Hazard

MIB = 1 << 20
# THP-always is "cheap" below this growth: within what a process's RSS moves by anyway.
CHEAP_PCT = 5.0
# damon-hp "keeps" THP-always's benefit when its huge ranges take this share of the accesses
# THP-always's do.
KEEPS = 0.8
# ... and gains little where fewer of the sampled accesses than this land on its huge pages.
LITTLE = 0.1


@dataclass
class Advice:
    pid: int
    command: list[str]
    seconds: float
    source: dict[str, Any]
    growth: Growth
    access: AccessSummary
    choices: list[Choice]
    facts: Facts
    hazards: list[Hazard]
    notes: list[str] = field(default_factory=list)
    stopped_by: str = "time"
    mappings_access: dict[int, MappingAccess] = field(default_factory=dict)
    """mapping start -> what the source saw of it over the watch"""

    @property
    def verdict(self) -> str:
        return verdict(self)

    def to_dict(self) -> dict[str, Any]:
        g = self.growth.to_dict()
        for m in g["mappings"]:  # type: ignore[union-attr]
            seen = self.mappings_access.get(m["start"])  # type: ignore[index]
            m.update(seen.__dict__ if seen else  # type: ignore[union-attr]
                     {"monitored_bytes": 0, "accessed_bytes": 0, "samples_share": None,
                      "accessed_page_share": None})
        return {"pid": self.pid, "command": self.command, "seconds": self.seconds,
                "stopped_by": self.stopped_by,
                "source": self.source, "verdict": self.verdict, "memory": g,
                "access": self.access.to_dict(),
                "choices": [c.to_dict() for c in self.choices],
                "facts": self.facts.to_dict(),
                "hazards": [h.to_dict() for h in self.hazards], "notes": self.notes}


def _mib(n: float) -> str:
    return f"{n / MIB:,.0f} MiB"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def verdict(a: Advice) -> str:
    g = a.growth
    by = {c.name: c for c in a.choices}
    always, damon = by["THP-always"], by["damon-hp"]
    if a.facts.thp_disabled_by_process:
        return (f"THP is off for this process (prctl): nothing gives it huge pages until it "
                f"allows them; if it did, THP-always would add {_mib(g.added_bytes)} "
                f"(+{g.added_pct:.1f} % of RSS).")
    cost = f"{_mib(g.added_bytes)} (+{g.added_pct:.1f} % of RSS)" + _where(a)
    if always.huge_bytes == 0:
        return ("THP would change nothing for this process: none of its memory lies in a "
                "2 MiB-aligned range inside one mapping, where a huge page could go.")
    if always.access_share is None:
        return (f"THP-always would add {cost}; the access source saw no access of this process "
                "in the watch, so which memory would pay off is unknown: watch longer "
                "(--seconds) while it works.")
    if g.added_pct <= CHEAP_PCT and always.access_share < LITTLE:
        return (f"THP-always changes little here: it would add {cost} but only "
                f"{_pct(always.access_share)} of the sampled accesses fell where it puts huge "
                "pages; no reason to turn it on for this process.")
    if g.added_pct <= CHEAP_PCT:
        return (f"THP-always is cheap here: it would add {cost} and put "
                f"{_pct(always.access_share)} of the sampled accesses on huge pages; let the "
                "process have huge pages (THP madvise + MADV_HUGEPAGE, or enabled=always).")
    if damon.access_share is not None and always.access_share > 0 \
            and damon.access_share >= KEEPS * always.access_share:
        return (f"Do not turn THP always on for it: it would add {cost}; damon-hp's rule puts "
                f"{_pct(damon.access_share)} of the sampled accesses on huge pages (THP-always "
                f"{_pct(always.access_share)}) for {_mib(damon.added_bytes)} more memory: "
                f"damon-hp attach {a.pid}.")
    return (f"THP-always would put {_pct(always.access_share)} of the sampled accesses on huge "
            f"pages but add {cost}; damon-hp's rule reached {_pct(damon.access_share)} in this "
            f"{a.seconds:.0f}-s watch for {_mib(damon.added_bytes)} more. Keep THP-always off "
            f"for it (THP madvise, or damon-hp attach {a.pid}) unless {_mib(g.added_bytes)} "
            "cost less than its TLB misses; a longer watch finds more hot ranges.")


def _where(a: Advice) -> str:
    """", most of it in NAME at ADDR (which took N % of the accesses)" when one mapping holds
    most of the growth: the place to act on."""
    g = a.growth
    if g.added_bytes <= 0 or not g.mappings:
        return ""
    worst = max(g.mappings, key=lambda m: m.always_added_bytes if a.growth.kinds[m.kind].counted
                else 0)
    if 2 * worst.always_added_bytes < g.added_bytes:
        return ""
    seen = a.mappings_access.get(worst.start)
    took = (f", {_pct(seen.samples_share)} of the accesses"
            if seen and seen.samples_share is not None else "")
    return (f", {_mib(worst.always_added_bytes)} of it in {worst.name} at {worst.start:#x} "
            f"({_mib(worst.rss_bytes)} resident{took})")


def format_text(a: Advice, top: int = 8) -> str:
    g, s = a.growth, a.access
    cmd = " ".join(a.command)[:60]
    lines = [f"damon-hp advise: pid {a.pid} ({cmd}), watched {a.seconds:.0f} s through "
             f"{a.source.get('name', '?')} ({a.source.get('kdamond', '')}), nothing changed",
             "", "Memory THP would add (THP-always: every 2 MiB range with a resident page; "
             f"khugepaged: at most {g.max_ptes_none} of 512 pages absent)"]
    lines.append(f"  {'kind':<18} {'RSS':>10} {'THP-always adds':>16} {'khugepaged adds':>16}"
                 "  counted")
    for k in g.kinds.values():
        if not k.mappings:
            continue
        lines.append(f"  {KIND_LABELS[k.kind]:<18} {_mib(k.rss_bytes):>10} "
                     f"{_mib(k.always_added_bytes):>16} {_mib(k.khugepaged_added_bytes):>16}"
                     f"  {'yes' if k.counted else 'no: ' + k.why}")
    lines.append("  largest mappings:")
    for m in g.largest(top):
        if m.rss_bytes < MIB and m.always_added_bytes < MIB:
            continue
        seen = a.mappings_access.get(m.start)
        saw = (f"; accessed {_mib(seen.accessed_bytes)} of {_mib(seen.monitored_bytes)} seen, "
               f"{_pct(seen.samples_share)} of the accesses"
               if seen and seen.monitored_bytes else "")
        lines.append(f"    {m.name[:28]:<28} {m.start:#x} {_mib(m.rss_bytes):>10} RSS, "
                     f"+{_mib(m.always_added_bytes)} always{saw}")
    lines.append(f"  RSS today {_mib(g.rss_bytes)}, under THP-always {_mib(g.rss_always_bytes)}:"
                 f" +{_mib(g.added_bytes)} (+{g.added_pct:.1f} %)")
    lines += ["", f"What the access source saw ({s.snapshots} aggregations)"]
    if s.snapshots:
        lines.append(f"  accessed: {_mib(s.accessed_bytes)} of {_mib(s.monitored_bytes)} seen "
                     f"({_pct(s.accessed_share)}) in at least half the aggregations, "
                     f"{_mib(s.accessed_any_bytes)} in any (a 2 MiB range reads accessed when "
                     "half its pages sit in regions DAMON saw accessed)")
        lines.append(f"  skew at 2 MiB: the hottest 10 % of ranges took {_pct(s.top10_share)} "
                     f"of the sampled accesses, the hottest 50 % {_pct(s.top50_share)}")
        if s.monitored_share is not None:
            lines.append(f"  monitored: at least {_pct(s.monitored_share)} of its private "
                         "anonymous resident memory lay in the kdamond's regions")
    else:
        lines.append("  nothing usable: no aggregation came within the watch")
    lines += ["", "What each choice would give"]
    lines.append(f"  {'choice':<20} {'made huge':>12} {'adds':>10} {'accesses on huge':>17}")
    for c in a.choices:
        lines.append(f"  {c.name:<20} {_mib(c.huge_bytes):>12} {_mib(c.added_bytes):>10} "
                     f"{_pct(c.access_share):>17}")
    lines += ["", "Hazards" + ("" if a.hazards else ": none found")]
    for h in a.hazards:
        lines += [f"  - {h.what}", f"    fix: {h.fix}"]
    for n in a.notes:
        lines.append(f"note: {n}")
    lines += ["", f"Verdict: {a.verdict}"]
    return "\n".join(lines)
