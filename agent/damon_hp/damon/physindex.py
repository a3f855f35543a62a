"""A physical DAMON snapshot as sorted segments of page frames: what the reverse map
(revmap.py) looks each extent of a process's frames up in, pure.

    index_of(phys_snapshot, addr_unit) -> PhysicalIndex    made once per snapshot
    PhysicalIndex.pieces(extents) -> (extent, segment, pages) per piece
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter

from damon_hp.numpy_lean import np

from ..frames import Extents
from ..ranges import PAGE_BYTES
from .model import Region, Snapshot

_START = attrgetter("start")

# A segment's access level below any nr_accesses (which is >= 0): no region holds it.
UNMONITORED = -1


class PhysicalIndex:
    """The physical regions as sorted segments of page frames, for vectorized lookups.

    `points` are the segment boundaries in PFNs; a frame `pfn` lies in segment
    k = searchsorted(points, pfn, "right"), which spans [points[k-1], points[k]); `accesses[k]`
    is the nr_accesses of the region holding it (UNMONITORED for a gap, or outside every
    region: frames the kdamond does not monitor) and `ages[k]` its age.
    """

    def __init__(self, regions: Iterable[Region], addr_unit: int) -> None:
        # In numpy: a loop over the regions cost ~1.2 ms per aggregation of 2,000 of them.
        rs = sorted(regions, key=_START)
        start = np.array([r.start for r in rs], dtype=np.int64) * addr_unit // PAGE_BYTES
        end = np.array([r.end for r in rs], dtype=np.int64) * addr_unit // PAGE_BYTES
        keep = end > start
        start, end = start[keep], end[keep]
        acc = np.array([r.nr_accesses for r in rs], dtype=np.int32)[keep]
        age = np.array([r.age for r in rs], dtype=np.int32)[keep]
        if (start[1:] < end[:-1]).any():
            at = int(np.flatnonzero(start[1:] < end[:-1])[0]) + 1
            kept = [r for r, k in zip(rs, keep.tolist(), strict=True) if k]
            raise ValueError(f"overlapping physical regions at {kept[at].start:#x}")
        # A region's start is a point of its own where it does not meet the previous region's
        # end (the first always): the segment before it is a gap (UNMONITORED). Segment k ends
        # at points[k], so a region's segment is the one ending at its end.
        opens = np.concatenate(([True], start[1:] > end[:-1])) if len(start) else keep[:0]
        at_end = np.cumsum(1 + opens) - 1
        points = np.empty(len(start) + int(opens.sum()), dtype=np.int64)
        points[at_end[opens] - 1] = start[opens]
        points[at_end] = end
        self.points = points
        # k = 0: below the first region; k = len(points): above the last one (two entries
        # when there is no region)
        n_segments = max(len(points) + 1, 2)
        self.accesses = np.full(n_segments, UNMONITORED, dtype=np.int32)
        self.accesses[at_end] = acc
        self.ages = np.zeros(n_segments, dtype=np.int32)
        self.ages[at_end] = age
        # Segment k spans [_seg_lo[k], _seg_hi[k]): the outer two are unbounded.
        bound = np.iinfo(np.int64)
        self._seg_lo = np.concatenate(([bound.min], self.points))
        self._seg_hi = np.concatenate((self.points, [bound.max]))

    def pieces(self, ext: Extents) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`ext` cut at segment boundaries: (extent index, segment, pages) per piece.

        An extent's frames are consecutive, so it crosses the segments between the one of its
        first frame and the one of its last: two bisections per extent, none per page, made in
        frame order (Extents.by_frame).
        """
        end = ext.pfn + ext.n
        order = ext.by_frame
        k_first = np.empty(len(order), dtype=np.int64)
        k_last = np.empty(len(order), dtype=np.int64)
        k_first[order] = np.searchsorted(self.points, ext.pfn[order], side="right")
        k_last[order] = np.searchsorted(self.points, end[order] - 1, side="right")
        per = k_last - k_first + 1
        owner = np.repeat(np.arange(len(per)), per)
        seg = k_first[owner] + np.arange(len(owner)) - np.repeat(np.cumsum(per) - per, per)
        lo = np.maximum(ext.pfn[owner], self._seg_lo[seg])
        hi = np.minimum(end[owner], self._seg_hi[seg])
        return owner, seg, hi - lo


# The index of the last snapshot mapped: damon-hpd maps one physical aggregation onto every
# managed process in turn, and building the index walks its thousands of regions in Python
# (4 ms a time under cProfile for 1,716 regions here). Holding the snapshot keeps its id from
# being reused.
_last_index: tuple[Snapshot, int, PhysicalIndex] | None = None


def index_of(phys: Snapshot, addr_unit: int) -> PhysicalIndex:
    """The index of `phys`, made once however many processes it is mapped onto."""
    global _last_index
    if _last_index is not None and _last_index[0] is phys and _last_index[1] == addr_unit:
        return _last_index[2]
    index = PhysicalIndex(phys.regions, addr_unit)
    _last_index = (phys, addr_unit, index)
    return index
