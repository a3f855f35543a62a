"""One managed process: observe -> decide -> act, the same for `run`, `attach` and damon-hpd.

    observe()  DAMON's snapshot (physical: reverse-mapped here through the target's pagemap)
               -> the target's virtual snapshot, with the 2 MiB ranges whose resident pages
               grew since the last look marked unsteady (first touch); in two steps, look()
               and complete(), for damon-hpd, which reverse-maps all its processes at once
    decide()   policy.decide on it (pure), with the residency guard's page counts
    act()      actuator.apply, then policy.record_outcomes

Each stage's CPU (this thread's) is added to `cpu` (stagecpu.py): where monitoring costs.

The agent runs one pipeline; the daemon runs one per managed process and puts its shared
budget between decide and act (it may replace the decision's promotions before `act`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass

from damon_hp import actuate, policy, procfs, stagecpu
from damon_hp.damon import revmap
from damon_hp.damon.model import Snapshot
from damon_hp.frame_moves import own_collapses
from damon_hp.frame_reader import FrameReader
from damon_hp.frames import PageFrames
from damon_hp.ranges import (
    HUGE_PAGE_BYTES,
    AddrRange,
    huge_range,
    intersect,
    merge_adjacent,
    subtract,
)

# A physical (reverse-mapped) source's regions mix frames of many virtual ranges and of every
# process, so a cold range reads somewhat accessed whenever its frames share a region with busy
# ones. Replayed on three recorded passive runs here (hotcold 1G/3G, the host's kdamond at
# 500 ms / 5 s; tests/unit/test_policy_physical.py has the noisiest): cold readings were mostly
# 1-2 of 10 samples and hot ones 5-10 once DAMON had split the hot frames' regions. Asking the
# latest readings for 8 sampled accesses at 30 % (one reading of 8, two of 4, three of 3) let
# 6.0 % of the cold buffer through on the run recorded beside VM tests (the earlier relative
# rule: 7.0 %), 1.4 % and 0 % on two runs beside less load, and promoted half the hot set in
# the aggregation after the first that showed it on the quiet one; 6 accesses let 10 % through.
PHYSICAL_MIN_ACCESSES = 8.0
PHYSICAL_MIN_ACCESS_PCT = 30.0


def params_for_source(params: policy.PolicyParams, *, physical: bool,
                      can_demote: bool) -> policy.PolicyParams:
    """The rule's parameters for a source: physical ones ask for more evidence and take no
    age seed (a physical region's age is the region's, not the target's frames'); a source
    without a DAMOS scheme of ours cannot demote."""
    if physical:
        params = dataclasses.replace(
            params,
            promote_min_accesses=max(params.promote_min_accesses, PHYSICAL_MIN_ACCESSES),
            promote_access_pct=max(params.promote_rate_pct, PHYSICAL_MIN_ACCESS_PCT),
            seed_streak_from_age=False)
    return params if can_demote else dataclasses.replace(params, can_demote=False)


class FirstTouch:
    """Which 2 MiB ranges may have gained resident pages during an aggregation.

    A page being faulted in reads as accessed if DAMON samples it in the interval of its fault
    (DAMON clears the sampled page's accessed bit, then reads it one sample later, so older
    bits never count; the fault sets it), so a buffer written once reads hot once. We count
    resident pages at each look, after its aggregation has closed: growth seen at the previous
    look may have happened between that aggregation's close and the look, inside the
    aggregation read now. Those ranges are withheld once more when that lag held at least one
    sample interval (a fault in it could have been sampled) and the look came after this
    aggregation began (it did unless the agent skipped aggregations). In the 7.3 test VM the
    looks come 0.1-0.5 s late, 5 to 25 of a vaddr kdamond's 20 ms samples, so growth there is
    carried; a passive source's 500 ms samples make it rare on the host (two interleaved pairs
    showed no aggregation lost, docs/results.md). The idle memory read hot right after
    hotcold's fill in the VM was not this but NewCoverage's case.
    The first look is at the pipeline's start (before the first aggregation arrives), so a
    process that is not growing is judged from its first aggregation.
    """

    def __init__(self, baseline: Mapping[int, int]) -> None:
        self._last = dict(baseline)
        self._grown: frozenset[int] = frozenset()
        self._looked_at_s = float("-inf")
        self._lag_s = 0.0

    def update(self, counts: Mapping[int, int], snap: Snapshot | None = None,
               looked_at_s: float | None = None) -> frozenset[int]:
        """The ranges to withhold from `snap`'s reading, given resident `counts` read at
        `looked_at_s` (the clock of snapshot times); without times, growth since the last look
        only."""
        # Equal counts (a steady process: the dict comparison runs in C) grew nowhere.
        grown = (frozenset() if counts == self._last
                 else frozenset(s for s, n in counts.items() if n > self._last.get(s, 0)))
        carried: frozenset[int] = frozenset()
        if snap is not None and looked_at_s is not None:
            if (self._lag_s >= snap.sample_us / 1e6
                    and self._looked_at_s > aggregation_start_s(snap)):
                carried = self._grown
            self._looked_at_s, self._lag_s = looked_at_s, looked_at_s - snap.taken_at_s
        self._last, self._grown = dict(counts), grown
        return grown | carried


class NewCoverage:
    """The 2 MiB windows of the target's mappings that the kdamond's regions cover now and did
    not cover at the previous snapshot (vaddr sources).

    DAMON vaddr regions cover the address space as it was at the last regions update
    (update_us); memory mapped beyond it joins them at the next update, inside an aggregation
    whose reading of it is unreliable: in the 7.3 test VM, hotcold's 96 MiB cold buffer,
    written once and idle for a second, read 10-25 % (and once all of it hot) in the first
    aggregation that covered it, then 0 %. The first snapshot counts as covering nothing new:
    a kdamond sets its regions before its first sample.
    """

    def __init__(self) -> None:
        self._covered: list[AddrRange] | None = None

    def update(self, snap: Snapshot, mappings: list[AddrRange]) -> frozenset[int]:
        covered = merge_adjacent(AddrRange(r.start, r.end) for r in snap.regions)
        before, self._covered = self._covered, covered
        if before is None:
            return frozenset()
        out: set[int] = set()
        for piece in intersect(subtract(covered, before), mappings):
            out.update(range(piece.start - piece.start % HUGE_PAGE_BYTES, piece.end,
                             HUGE_PAGE_BYTES))
        return frozenset(out)


def aggregation_start_s(snap: Snapshot) -> float:
    """When the snapshot's aggregation began, at the latest: its time is the aggregation's end
    (events) or a little after it (a tried-regions read), so half an aggregation more is
    taken off, which errs towards withholding."""
    return snap.taken_at_s - 1.5 * snap.aggr_us / 1e6


@dataclass(frozen=True)
class Look:
    """What one look at the process read, before the reverse map (Observer.look)."""

    snapshot: Snapshot
    maps: list[procfs.Vma]
    status: procfs.Status
    mappings: list[AddrRange]
    frames: PageFrames | None
    """physical sources: its page frames as of this look"""
    at_s: float
    """when the frames were read (time.monotonic): what first touch dates its counts by"""


@dataclass(frozen=True)
class Observation:
    """What one aggregation showed of the process."""

    snapshot: Snapshot
    """the target's virtual snapshot, unsteady ranges marked"""
    status: procfs.Status
    maps: list[procfs.Vma]
    mappings: list[AddrRange]
    """its private anonymous mappings: where a collapse is possible"""
    monitored_share: float | None
    """physical sources: share of its resident pages in memory the kdamond watches"""
    resident: Mapping[int, int]
    """resident base pages per 2 MiB range (start -> 0..512), as of this observation: what
    the residency guard counts (a range missing has none)"""

    @property
    def thp_disabled(self) -> bool:
        return procfs.thp_disabled_by_process(self.status)


class Observer:
    """Observe one process: its virtual picture of each aggregation, first touch marked.
    Read-only (`damon-hp advise` watches through it alone)."""

    def __init__(self, files: procfs.ProcessFiles, *, physical: bool, can_demote: bool = False,
                 cpu: stagecpu.StageCpu | None = None) -> None:
        self.files = files
        self.cpu = cpu if cpu is not None else stagecpu.StageCpu()
        # A source that can demote reads every frame again after any move: an idle reading
        # through stale frames could demote a hot range (frame_reader.py).
        self.frames = FrameReader(files.pid, eager=can_demote) if physical else None
        self.last_mapped: revmap.VirtualAccess | None = None
        """physical sources: the last reverse map, with its per-range page counts"""
        self._faults: int | None = None
        self._counted: tuple[list[AddrRange], dict[int, int]] | None = None
        try:
            baseline = self._resident_counts(mappings_of(files.maps()))
        except (procfs.ProcessGone, procfs.PagemapScanUnsupported, OSError):
            baseline = {}
        self.first_touch = FirstTouch(baseline)
        self.new_coverage = None if physical else NewCoverage()

    def observe(self, snap: Snapshot) -> Observation:
        """The process's picture of this aggregation. Raises procfs.ProcessGone (or
        revmap.ProcessGone) once it has exited."""
        return self.complete(self.look(snap))

    def look(self, snap: Snapshot) -> Look:
        """What `observe` reads of the process before the reverse map: damon-hpd looks at
        every process, maps them all in one pass (revmap.reverse_map_many), then completes
        each."""
        with self.cpu.stage(stagecpu.PROCFS):
            maps = self.files.maps()
            status = self.files.status()
            mappings = mappings_of(maps)
            frames = (None if self.frames is None
                      else self.frames.read([(m.start, m.end) for m in mappings]))
        return Look(snap, maps, status, mappings, frames, time.monotonic())

    def complete(self, look: Look, mapped: revmap.VirtualAccess | None = None) -> Observation:
        """The observation from `look`; `mapped`: the reverse map of its frames, if made."""
        snap, mappings, share, counted_at_s = look.snapshot, look.mappings, None, look.at_s
        if look.frames is None:
            with self.cpu.stage(stagecpu.PROCFS):
                virt, counts = snap, self._resident_counts(mappings)
            counted_at_s = time.monotonic()
        else:
            if mapped is None:
                with self.cpu.stage(stagecpu.REVERSE_MAP):
                    mapped = revmap.reverse_map(snap, look.frames)
            mapped = self.last_mapped = self._verified(snap, mapped)
            if mapped.resident_pages:
                share = mapped.monitored_pages / mapped.resident_pages
            virt, counts = mapped.snapshot, mapped.window_counts()
        # Snapshot times are CLOCK_MONOTONIC (events.py), the clock of time.monotonic().
        unsteady = self.first_touch.update(counts, snap, looked_at_s=counted_at_s)
        if mapped is not None and unsteady:
            # Windows reading hot through the physical regions of frames being faulted in
            # carry no evidence either (revmap.VirtualAccess.sharing_accessed_regions).
            with self.cpu.stage(stagecpu.REVERSE_MAP):
                unsteady = frozenset(unsteady) | mapped.sharing_accessed_regions(unsteady)
        if self.new_coverage is not None:
            unsteady |= self.new_coverage.update(snap, mappings)
        virt = dataclasses.replace(virt, unsteady=unsteady)
        return Observation(virt, look.status, look.maps, mappings, share, counts)

    def _verified(self, snap: Snapshot, mapped: revmap.VirtualAccess) -> revmap.VirtualAccess:
        """`mapped`, or the map made anew if windows that read hot in it (a nonzero access
        level: what the policy can act on) had frames that may have moved since they were
        read (FrameReader.unverified) and had: a cold range must not read hot through frames
        that compaction gave to a hot huge page. The others wait for the next full read (they
        can only be late, never collapsed by mistake)."""
        assert self.frames is not None
        if not self.frames.unverified:
            return mapped
        hot = mapped.hot_windows()
        with self.cpu.stage(stagecpu.PROCFS):
            checked = self.frames.verify(hot)
        if checked is None:
            return mapped
        with self.cpu.stage(stagecpu.REVERSE_MAP):
            return revmap.reverse_map(snap, checked)

    def _resident_counts(self, mappings: list[AddrRange]) -> dict[int, int]:
        """Resident pages per 2 MiB range of a vaddr target. Read again only when the target
        faulted since the last read or its mappings changed: only a fault of its own maps a new
        page (our collapses fill ranges too, but those are promoted and give no evidence), and
        the page-table walk costs ~3 ms per GiB natively, ~25 times that in the test VM."""
        faults = self.files.stat()
        total = faults.minflt + faults.majflt
        if (self._counted is not None and total == self._faults
                and self._counted[0] == mappings):
            return self._counted[1]
        counts = self.files.resident_by_window(mappings)
        self._faults, self._counted = total, (mappings, counts)
        return counts


def huge_after(read: list[AddrRange] | None, applied: actuate.Applied,
               mappings: list[AddrRange]) -> list[AddrRange] | None:
    """The PMD-mapped parts of `mappings` once `applied` is done, from those a frame read
    before it found (`read`: FrameReader.huge_parts, None when unknown), when `applied` did
    nothing to the target, or nothing but collapses that all succeeded: MADV_COLLAPSE returns
    0 only once its range is PMD-mapped (madvise_collapse, mm/khugepaged.c), so those ranges
    are added, as are the adopted ones (found PMD-mapped at the act). None when anything else
    was done (walk the page tables). Saves that walk, ~3-5 ms per 4 GiB target, after every
    aggregation that promoted too."""
    if read is None:
        return None
    if applied.touched_nothing:
        return read
    ours = applied.only_collapses
    if ours is None:
        return None
    made = [huge_range(s) for s in (*ours, *applied.adopted)]
    return merge_adjacent([*read, *intersect(made, sorted(mappings))])


def mappings_of(maps: list[procfs.Vma]) -> list[AddrRange]:
    """The private anonymous mappings: where a collapse is possible."""
    return [m.range for m in maps if m.anonymous_private]


class ProcessPipeline:
    """Observe, decide and act for one process, with its policy state."""

    def __init__(self, target: actuate.Target, files: procfs.ProcessFiles,
                 params: policy.PolicyParams, actuator: actuate.Actuator, *,
                 physical: bool) -> None:
        self.target = target
        self.files = files
        self.params = params
        self.actuator = actuator
        self.state = policy.PolicyState()
        self.cpu = stagecpu.StageCpu()
        self.observer = Observer(files, physical=physical, can_demote=params.can_demote,
                                 cpu=self.cpu)
        self.unsteady_readings = 0
        """hot range readings withheld because the range was being faulted in"""

    @property
    def frames(self) -> FrameReader | None:
        return self.observer.frames

    def observe(self, snap: Snapshot) -> Observation:
        return self.observer.observe(snap)

    def look(self, snap: Snapshot) -> Look:
        return self.observer.look(snap)

    def complete(self, look: Look, mapped: revmap.VirtualAccess | None = None) -> Observation:
        return self.observer.complete(look, mapped)

    def decide(self, obs: Observation, thp_mode: str) -> policy.Decision:
        """The policy's decision on the observation; the state moves on with it."""
        with self.cpu.stage(stagecpu.DECIDE):
            # The observation counted every range's resident pages already (the reverse map's
            # frames, or the vaddr count): no second page-table walk for the guard.
            decision, self.state = policy.decide(
                obs.snapshot, self.state, self.params, rss_bytes=obs.status.vm_rss,
                mappings=obs.mappings, thp_mode=thp_mode, resident_pages=obs.resident,
                thp_disabled=obs.thp_disabled)
        self.unsteady_readings += decision.unsteady
        return decision

    def huge_as_read(self, applied: actuate.Applied,
                     mappings: list[AddrRange]) -> list[AddrRange] | None:
        """The PMD-mapped parts of `mappings` after `applied`, from this aggregation's frame
        read (`huge_after`); None: walk the page tables."""
        if self.frames is None:
            return None
        return huge_after(self.frames.huge_parts(mappings), applied, mappings)

    def settle(self) -> actuate.Applied:
        """After the kdamond stopped: the DAMOS collapses that landed since the last snapshot
        (actuate.Actuator.settle_damos_collapses), learnt like any other outcome."""
        applied = actuate.Applied(damos_collapses=self.actuator.settle_damos_collapses())
        if applied.damos_collapses:
            self.state = policy.record_outcomes(self.state, applied.outcomes, self.params,
                                                time.monotonic())
        return applied

    def act(self, decision: policy.Decision, taken_at_s: float) -> actuate.Applied:
        """Apply the decision and let the policy learn what took."""
        t0 = time.thread_time()
        # Collapses allocate inside the call: counted as this process's, they make no other
        # process's frame reader walk its page tables again (frame_moves.page_counters).
        with own_collapses(self.target.pid) if decision.promote else contextlib.nullcontext():
            applied = self.actuator.apply(decision, taken_at_s)
        if self.frames is not None and (ours := applied.only_collapses):
            self.frames.collapsed(ours)
        self.state = policy.record_outcomes(self.state, applied.outcomes, self.params,
                                            time.monotonic())
        copies = sum(r.cpu_seconds for r in (*applied.collapses, *applied.recollapses))
        self.cpu.add(stagecpu.ACT, max(0.0, time.thread_time() - t0 - copies))
        return applied
