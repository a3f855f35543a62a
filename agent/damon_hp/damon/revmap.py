"""The paddr reverse map: a physical DAMON snapshot seen through one process's page frames.

A paddr kdamond (the only kind some machines offer, or one that something else already runs)
reports regions of PHYSICAL memory. /proc/PID/pagemap gives the frame (PFN) behind each of the
target's virtual pages (frames.py reads them), so each of its pages inherits the access count of
the physical region holding its frame; summed per 2 MiB-aligned virtual range, that is the
access picture the policy needs, returned as an ordinary virtual-address `Snapshot`.

    reverse_map(phys_snapshot, frames) -> VirtualAccess                 pure
    reverse_map_many(phys_snapshot, [frames, ...]) -> [VirtualAccess]    pure, one pass

Cost, measured on the CI host: ~8-10 ms per 4 GiB target on the frames' extents (20-40 Ki
pieces), down from 30-35 ms with per-page numpy arrays and 100-115 ms with the pure-Python tally
before; 1.4 ms for a 164 MiB process of 8 mappings (2.0 ms when each mapping was mapped alone).

How well the result shows a hot set depends on physical fragmentation, not on this code: with
hotcold's hot frames in long runs, 96-99 % of hot 2 MiB ranges read hot from 8 s on; with them
spread over 7x more physical 2 MiB blocks than needed, only 15-50 % did per aggregation (cold
ranges 0-10 % either way). DAMON regions (here ~5 MiB each) then mix hot and cold frames.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from damon_hp.numpy_lean import np

from ..frames import Extents, PageFrames
from ..procfs import ProcessGone
from ..ranges import HUGE_PAGE_BYTES, PAGE_BYTES
from .model import PHYSICAL, WINDOWS, Region, Snapshot
from .physindex import PhysicalIndex, index_of

__all__ = ["ProcessGone", "RangeAccess", "VirtualAccess", "reverse_map", "reverse_map_many"]


@dataclass(frozen=True)
class RangeAccess:
    """What the physical snapshot says about one 2 MiB-aligned virtual range of the target.

    Page counts are of base pages. `monitored_pages` are the resident pages whose frame lies in
    a region the kdamond monitors (a paddr kdamond may watch only part of RAM); `accessed_pages`
    those in a region with nr_accesses > 0. `nr_accesses` and `age` are what the range's Region
    in the virtual snapshot carries (see `reverse_map`).
    """

    start: int
    end: int
    resident_pages: int
    monitored_pages: int
    accessed_pages: int
    mean_nr_accesses: float  # page-weighted over the monitored pages
    max_nr_accesses: int
    nr_accesses: int
    age: int

    @property
    def pages(self) -> int:
        return (self.end - self.start) // PAGE_BYTES

    @property
    def accessed_share(self) -> float:
        """Share of the resident pages that sit in accessed regions, 0..1."""
        return self.accessed_pages / self.resident_pages if self.resident_pages else 0.0


@dataclass(frozen=True)
class VirtualAccess:
    """The reverse map's result: per-range detail and the snapshot the policy consumes.

    The detail is kept as columns, one tuple per RangeAccess field, and `ranges` made from them
    only when asked for (reports, `damon-hp advise`): a 4 GiB target has ~2,000 ranges, and
    making their objects at every aggregation cost ~5 ms, half the reverse map's CPU, for
    nothing the pipeline reads. The pipeline takes the sums and per-window counts below.
    """

    columns: tuple[tuple[int | float, ...], ...]
    """RangeAccess's fields in its order, each a tuple over the ranges (address order)"""
    snapshot: Snapshot
    accessed_pieces: tuple[np.ndarray, np.ndarray] = field(
        default=(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)), compare=False)
    """(2 MiB window start, physical segment) of each piece of the target's pages in an
    accessed physical region: which windows read hot through the same region"""

    @cached_property
    def ranges(self) -> tuple[RangeAccess, ...]:
        return tuple(map(RangeAccess, *self.columns))

    @property
    def resident_pages(self) -> int:
        return sum(self.columns[2])

    @property
    def monitored_pages(self) -> int:
        return sum(self.columns[3])

    def window_counts(self) -> dict[int, int]:
        """Resident pages per 2 MiB window (start -> pages; two mappings sharing a window add
        up), for windows holding any."""
        windows = [start - start % HUGE_PAGE_BYTES for start in self.columns[0]]
        if len(set(windows)) == len(windows):
            # The usual case, no window shared, made in C: the loop below cost ~1 ms per
            # aggregation of a 4 GiB target (2,048 windows).
            return dict(zip(windows, self.columns[2], strict=True))
        counts: dict[int, int] = {}
        for window, pages in zip(windows, self.columns[2], strict=True):
            counts[window] = counts.get(window, 0) + pages
        return counts

    def sharing_accessed_regions(self, windows: Iterable[int]) -> set[int]:
        """The 2 MiB windows with a page in an accessed physical region that also holds a page
        of one of `windows` (2 MiB starts), those included.

        A physical region reads as one (DAMON samples one random frame of it), so while a
        window is being faulted in, its accessed new frames heat every window whose frames
        share their regions: the kernel hands out the frames of a buffer being filled in
        physical runs, so those are mostly the windows filled just before it. Seen in the
        test VM (DAMON_STAT, 7.3): half of a 256 MiB buffer written once was collapsed while
        the windows beside it in physical memory were being written."""
        starts, segs = self.accessed_pieces
        wanted = np.fromiter(windows, dtype=np.int64)
        touched = np.unique(segs[np.isin(starts, wanted)])
        return set(np.unique(starts[np.isin(segs, touched)]).tolist())

    def hot_windows(self) -> list[int]:
        """Starts of the 2 MiB windows of ranges that read a nonzero access level."""
        return [start - start % HUGE_PAGE_BYTES
                for start, level in zip(self.columns[0], self.columns[7], strict=True) if level]


_N_FIELDS = 9  # RangeAccess's
_WINDOW_PAGES = HUGE_PAGE_BYTES // PAGE_BYTES


def reverse_map(
    phys: Snapshot,
    frames: PageFrames,
    *,
    hot_page_share_pct: float = 50.0,
    addr_unit: int = 1,
) -> VirtualAccess:
    """Turn a paddr snapshot into the target's per-2 MiB virtual access picture.

    Each 2 MiB-aligned range of `frames.ranges` (clipped to the range) that has a resident page
    becomes one Region of the virtual snapshot, with
        nr_accesses = the highest access count that at least `hot_page_share_pct` % of the
                      range's pages reach (non-resident and unmonitored pages count as 0);
        age = the smallest age among the physical regions at or above that count holding its
              pages (how long the range has certainly held that level).
    Why this and not the max or the mean: a physical region mixes frames of many virtual pages
    (and processes), and its nr_accesses estimates the share of its frames that are busy (DAMON
    samples one random frame per region), so a cold range often has many frames in somewhat
    accessed regions. The policy calls a region hot from `hot_access_pct` (5 %) of
    max_nr_accesses and collapses whole 2 MiB ranges: the max lets any stray frame heat a whole
    range, and a page-weighted mean crosses 5 % as soon as one page in ten sits in a busy
    region. Measured here (hotcold 256M/512M, loaded host): cold ranges had 10-45 % of their
    pages in accessed regions, so both misfire. The quantile says "this share of the range is
    at least this hot", which is what a collapse pays off for; it also refuses ranges that are
    mostly not resident (a collapse would bloat them).
    The default share, 50 % (the median page), favours finding the hot set: in one run it
    flagged all 128 hot ranges from 16 s on and 11-41 of the 256 cold ones (5-25 of them in two
    snapshots running, which is what the policy acts on); 90 % flagged 121-125 hot and 3-17
    cold ones. In a second run, under heavier load (tests/fixtures/revmap-hotcold-*.json), hot
    ranges had only 26-88 % of their pages in accessed regions: 50 % still flagged 4-8 of 8
    sampled hot ranges and 0-1 of 8 cold ones, 90 % flagged none. A cold range collapsed by
    mistake was resident anyway (no bloat) and the policy demotes it once it reads cold.
    The mean and the max stay in `RangeAccess` for reports.

    addr_unit: the kdamond's DAMON `addr_unit` (Linux 6.18+; physical address = start *
    addr_unit). The result's snapshot keeps `phys`'s time and intervals and carries
    `frames.pid`.
    """
    return reverse_map_many(phys, [frames], hot_page_share_pct=hot_page_share_pct,
                            addr_unit=addr_unit)[0]


def reverse_map_many(
    phys: Snapshot,
    frames: Sequence[PageFrames],
    *,
    hot_page_share_pct: float = 50.0,
    addr_unit: int = 1,
) -> list[VirtualAccess]:
    """`reverse_map` of one physical snapshot onto several processes' frames at once, in the
    order given: damon-hpd maps each aggregation onto every process it manages, and the ~40
    numpy calls of one reverse map cost the same for a 160 MiB process as for a 4 GiB one
    (~0.5 ms each; 0.5 % of a core at 50 processes, docs/cost.md). Made together, they are
    paid once a round."""
    if not 0 < hot_page_share_pct <= 100:
        raise ValueError(f"hot_page_share_pct must be within (0, 100], not {hot_page_share_pct}")
    if phys.space != PHYSICAL:
        raise ValueError(f"reverse_map reads a physical snapshot, not {phys.space} regions")
    index = index_of(phys, addr_unit)
    out = []
    for f, (columns, accessed_pieces) in zip(frames, _range_accesses(
            [f.extents for f in frames], index, hot_page_share_pct), strict=True):
        start, end, level, age = (columns[k] for k in (0, 1, 7, 8))
        snapshot = Snapshot(
            taken_at_s=phys.taken_at_s,
            pid=f.pid,
            sample_us=phys.sample_us,
            aggr_us=phys.aggr_us,
            regions=tuple(map(Region, start, end, level, age)),
            space=WINDOWS,
        )
        out.append(VirtualAccess(columns, snapshot, accessed_pieces))
    return out


def _per_window_extreme(ufunc: np.ufunc, win: np.ndarray, values: np.ndarray, n_windows: int,
                        empty: int) -> np.ndarray:
    """ufunc (np.maximum, np.minimum) of `values` per window, `empty` where a window has none.
    Extents come in address order, so each window's values are one slice: reduceat, where
    ufunc.at cost ~10x more per piece."""
    out = np.full(n_windows, empty, dtype=np.int64)
    if len(win) and (np.diff(win) < 0).any():  # runs given out of order
        order = np.argsort(win, kind="stable")
        win, values = win[order], values[order]
    if len(win):
        opens = np.flatnonzero(np.concatenate(([True], win[1:] != win[:-1])))
        out[win[opens]] = ufunc.reduceat(values, opens)
    return out


# Ranges with at most this many extents are looked up together, their frame order sorted anew
# (cheap at this size); larger ones alone, with the frame order their Extents keep. Each lookup
# costs ~15 numpy calls whatever its size, and a process has many small mappings (stack, heap,
# libraries' data): damon-hpd mapped 50 processes of 8 mappings each every aggregation.
_BATCH_EXTENTS = 4096


_Columns = tuple[tuple[int | float, ...], ...]


def _range_accesses(groups: Sequence[dict[tuple[int, int], Extents]], index: PhysicalIndex,
                    share_pct: float
                    ) -> list[tuple[_Columns, tuple[np.ndarray, np.ndarray]]]:
    """For each group (one process's extents by virtual range [lo, hi)): RangeAccess of every
    2 MiB window of its ranges that holds a resident page, in address order, as columns
    (VirtualAccess), and VirtualAccess.accessed_pieces.

    Works on pieces (an extent's pages within one physical segment: one access count, one
    age), not on pages: a 4 GiB target is ~1 Mi pages but 20-40 Ki pieces, and ~2 Ki once its
    ranges are collapsed. Pages outside every piece are not resident. Each range of each group
    gets window ids of its own (a window two mappings share is one window of each); large
    ranges come first, so the ids of the pieces rise in the order they are made and every
    per-window reduction below is over contiguous slices. Groups are told apart only at the
    end.
    """
    items = sorted(((g, key, ext) for g, extents in enumerate(groups)
                    for key, ext in extents.items()),
                   key=lambda it: (len(it[2].pfn) <= _BATCH_EXTENTS, it[0], it[1]))
    n_groups, n_ranges = len(groups), len(items)
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    if not n_ranges:
        return [(((),) * _N_FIELDS, empty)] * n_groups
    group_r = np.array([g for g, _, _ in items], dtype=np.int64)
    lo_r = np.array([lo for _, (lo, _), _ in items], dtype=np.int64)
    hi_r = np.array([hi for _, (_, hi), _ in items], dtype=np.int64)
    first_r = lo_r - lo_r % HUGE_PAGE_BYTES
    n_win_r = -(-(hi_r - first_r) // HUGE_PAGE_BYTES)
    offset_r = np.cumsum(n_win_r) - n_win_r
    # window id = base[range] + the virtual window number of the page
    base_r = offset_r - first_r // HUGE_PAGE_BYTES
    n_windows = int(n_win_r.sum())

    wins, segs, counts = [], [], []
    batch = [k for k, (_, _, ext) in enumerate(items) if len(ext.pfn) <= _BATCH_EXTENTS]
    for k, (_, _, ext) in enumerate(items[:batch[0]] if batch else items):
        owner, seg, count = index.pieces(ext)
        wins.append(base_r[k] + ext.vpage[owner] * PAGE_BYTES // HUGE_PAGE_BYTES)
        segs.append(seg)
        counts.append(count)
    if batch:
        parts = [items[k][2] for k in batch]
        ext = Extents(*(np.concatenate([getattr(e, f) for e in parts])
                        for f in ("vpage", "pfn", "n")))
        base = np.repeat(base_r[batch], [len(e.pfn) for e in parts])
        owner, seg, count = index.pieces(ext)
        wins.append(base[owner] + ext.vpage[owner] * PAGE_BYTES // HUGE_PAGE_BYTES)
        segs.append(seg)
        counts.append(count)
    win, seg, count = (np.concatenate(x) for x in (wins, segs, counts))
    acc = index.accesses[seg]
    age = index.ages[seg]

    def per_window(mask: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return np.bincount(win[mask], weights[mask], minlength=n_windows).astype(np.int64)

    everywhere = np.ones(len(win), dtype=bool)
    monitored = acc >= 0
    accessed = acc > 0
    resident = per_window(everywhere, count)
    n_monitored = per_window(monitored, count)
    n_accessed = per_window(accessed, count)
    weighted = per_window(accessed, count * acc)
    peak = _per_window_extreme(np.maximum, win[accessed], acc[accessed], n_windows, 0)
    # The share quantile: the k-th highest count of the window's pages, pages not resident or
    # not monitored reading 0; k is the share of the window's (clipped) length, rounded up as
    # "at least". Only accessed pieces can lift it above 0: sort them per window by count,
    # highest first, and take the count of the piece where the running page total reaches k.
    range_of = np.repeat(np.arange(n_ranges), n_win_r)
    starts = first_r[range_of] + (np.arange(n_windows) - offset_r[range_of]) * HUGE_PAGE_BYTES
    w_lo = np.maximum(starts, lo_r[range_of])
    w_hi = np.minimum(starts + HUGE_PAGE_BYTES, hi_r[range_of])
    need = np.ceil(share_pct / 100 * ((w_hi - w_lo) // PAGE_BYTES) - 1e-9).astype(np.int64)
    need = need.clip(1, _WINDOW_PAGES)
    level = np.zeros(n_windows, dtype=np.int64)
    a_win, a_acc, a_count = win[accessed], acc[accessed], count[accessed]
    order = np.lexsort((-a_acc, a_win))
    a_win, a_acc, total = a_win[order], a_acc[order], np.cumsum(a_count[order])
    if len(a_win):
        opens = np.flatnonzero(np.concatenate(([True], a_win[1:] != a_win[:-1])))
        before = np.concatenate(([0], total[opens[1:] - 1]))
        so_far = total - np.repeat(before, np.diff(np.append(opens, len(a_win))))
        reached = so_far >= need[a_win]
        r_win, r_acc = a_win[reached], a_acc[reached]
        first_reached = np.concatenate((np.ones(min(1, len(r_win)), dtype=bool),
                                        r_win[1:] != r_win[:-1]))
        level[r_win[first_reached]] = r_acc[first_reached]
    # The age: the youngest monitored piece at or above that level.
    at_level = monitored & (acc >= level[win])
    youngest = _per_window_extreme(np.minimum, win[at_level], age[at_level], n_windows, 0)
    # Group, then address order (then end: two ranges may share a window). Plain ints through
    # tolist(), once for every group: a numpy scalar per field per window cost more than the
    # arithmetic above.
    group_w = group_r[range_of]
    keep = np.flatnonzero(resident)
    keep = keep[np.lexsort((w_hi[keep], w_lo[keep], group_w[keep]))]
    mon = n_monitored[keep]
    mean = np.divide(weighted[keep], mon, out=np.zeros(len(keep)), where=mon > 0)
    lists = [x.tolist() for x in (
        w_lo[keep], w_hi[keep], resident[keep], mon, n_accessed[keep], mean, peak[keep],
        level[keep], youngest[keep])]
    cuts = np.searchsorted(group_w[keep], np.arange(n_groups + 1)).tolist()
    # The accessed pieces, by group (stable: each group's stay in the order made)
    p_win = win[accessed]
    p_group = group_w[p_win]
    p_order = np.argsort(p_group, kind="stable")
    p_start, p_seg = starts[p_win][p_order], seg[accessed][p_order]
    p_cuts = np.searchsorted(p_group[p_order], np.arange(n_groups + 1)).tolist()
    return [(tuple(tuple(col[cuts[g]:cuts[g + 1]]) for col in lists),
             (p_start[p_cuts[g]:p_cuts[g + 1]], p_seg[p_cuts[g]:p_cuts[g + 1]]))
            for g in range(n_groups)]
