"""Independent reference implementation of streamcluster (workloads-spec.md Part A) in numpy.

Written from the specification alone, separately from workloads/src/streamcluster.c, to check
it. It reproduces the POSIX drand48 generator (so the random sequence is the same as the C
library's), the float32/float64 split of A.14 and the order of every sum, including the per-thread
partial sums of a given thread count: the result should equal the C program's bit for bit.

Vectorised where the order of operations allows it: a squared distance is accumulated over the
coordinates one column at a time for all points at once (float32, in coordinate order), and
double sums over points use cumulative sums (sequential), never np.sum (pairwise).

    python tests/reference/streamcluster_ref.py simsmall [--nproc 2] [--out output.txt]
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

F32 = np.float32
F64 = np.float64

SP = 1  # extra pspeedy attempts before z is lowered (A.8)
ITER = 3  # iteration factor (A.8, A.10)
INT_MAX_F32 = F32(2147483647)  # rounds to 2**31 (A.4)

# A.3: k1, k2, d, n, chunksize, clustersize
SETS: dict[str, tuple[int, int, int, int, int, int]] = {
    "test": (2, 5, 1, 10, 10, 5),
    "simdev": (3, 10, 3, 16, 16, 10),
    "simsmall": (10, 20, 32, 4096, 4096, 1000),
    "simmedium": (10, 20, 64, 8192, 8192, 1000),
    "simlarge": (10, 20, 128, 16384, 16384, 1000),
    "native": (10, 20, 128, 1_000_000, 200_000, 5000),
}


class Drand48:
    """POSIX drand48 family: X' = (a X + c) mod 2^48, lrand48 = X >> 17."""

    A = 0x5DEECE66D
    C = 0xB
    MASK = (1 << 48) - 1
    _BATCH = 1 << 16

    def __init__(self, seed: int = 1) -> None:
        self.srand48(seed)
        # Jump-ahead coefficients: X_{n+i} = (A_i X_n + C_i) mod 2^48, i = 1.._BATCH.
        a_i, c_i = [], []
        a, c = 1, 0
        for _ in range(self._BATCH):
            a, c = (self.A * a) & self.MASK, (self.A * c + self.C) & self.MASK
            a_i.append(a)
            c_i.append(c)
        self._a = np.array(a_i, dtype=np.uint64)
        self._c = np.array(c_i, dtype=np.uint64)

    def srand48(self, seed: int) -> None:
        self.x = ((seed & 0xFFFFFFFF) << 16) | 0x330E

    def lrand48(self) -> int:
        self.x = (self.A * self.x + self.C) & self.MASK
        return self.x >> 17

    def lrand48_many(self, n: int) -> np.ndarray:
        """The next n lrand48() values, as int64."""
        out = np.empty(n, dtype=np.uint64)
        mask = np.uint64(self.MASK)
        start = 0
        while start < n:
            m = min(self._BATCH, n - start)
            # uint64 products wrap modulo 2^64, a multiple of 2^48, so masking is exact.
            xs = (self._a[:m] * np.uint64(self.x) + self._c[:m]) & mask
            out[start : start + m] = xs
            self.x = int(xs[-1])
            start += m
        return (out >> np.uint64(17)).astype(np.int64)

    def unit(self) -> np.float32:
        """A.4: (float)lrand48() / (float)INT_MAX, in float."""
        return F32(self.lrand48()) / INT_MAX_F32

    def units(self, n: int) -> np.ndarray:
        return self.lrand48_many(n).astype(F32) / INT_MAX_F32


def seqsum(values: np.ndarray) -> float:
    """Double sum in index order starting from 0.0, as a C loop does."""
    if len(values) == 0:
        return 0.0
    return float(np.cumsum(values.astype(F64))[-1])


def blocks(num: int, nproc: int) -> list[tuple[int, int]]:
    """A.7 partition: equal blocks, the last one extended to num."""
    bsize = num // nproc
    return [(t * bsize, num if t == nproc - 1 else (t + 1) * bsize) for t in range(nproc)]


@dataclass
class PointSet:
    """A Points object (A.5): per-point arrays plus rows of a coordinate block."""

    coords: np.ndarray  # (rows, d) float32: the block this set's coord pointers point into
    row: np.ndarray  # int64, the coord pointer of each point as a row of `coords`
    weight: np.ndarray  # float32
    assign: np.ndarray  # int64
    cost: np.ndarray  # float32
    num: int = 0

    @classmethod
    def new(cls, rows: int, d: int) -> PointSet:
        return cls(
            coords=np.zeros((rows, d), dtype=F32),
            row=np.arange(rows, dtype=np.int64),
            weight=np.ones(rows, dtype=F32),
            assign=np.zeros(rows, dtype=np.int64),
            cost=np.zeros(rows, dtype=F32),
        )


@dataclass
class Counters:
    """A.18's per-run counts."""

    pgain: int = 0
    pgain_accepted: int = 0
    pspeedy: int = 0
    speedy_opened: int = 0
    pfl_iterations: int = 0
    bisection_steps: int = 0
    intermediate_centres: int = 0


@dataclass
class Result:
    output: str  # the output file's text (A.13)
    centres: int
    weight: float
    chunk_cost: float  # sum over chunks of the assignment cost after localSearch
    final_cost: float  # the same for the final pass
    counters: Counters = field(default_factory=Counters)


class StreamCluster:
    def __init__(self, kmin: int, kmax: int, d: int, nproc: int = 1) -> None:
        self.kmin, self.kmax, self.d, self.nproc = kmin, kmax, d, nproc
        self.rng = Drand48(1)
        self.k = 0  # shared centre count; survives between localSearch calls (A.5)
        self.counters = Counters()

    # -- distances ----------------------------------------------------------------------

    def _dist_rows(self, ps: PointSet, xrow: int) -> np.ndarray:
        """Squared distance (float32) from every row of ps.coords to row xrow."""
        key = int(xrow)
        cached = self._dcache.get(key)
        if cached is not None:
            return cached
        diff = self._coords_t - self._coords_t[:, key : key + 1]
        acc = diff[0] * diff[0]
        for c in range(1, diff.shape[0]):
            acc = acc + diff[c] * diff[c]
        self._dcache[key] = acc
        return acc

    def dist_to(self, ps: PointSet, x: int) -> np.ndarray:
        """dist(p[j], p[x]) for j = 0..num-1."""
        return self._dist_rows(ps, ps.row[x])[ps.row[: ps.num]]

    # -- A.4 shuffles --------------------------------------------------------------------

    def shuffle(self, ps: PointSet) -> None:
        num = ps.num
        draws = self.rng.lrand48_many(max(num - 1, 0))
        perm = list(range(num))
        for i in range(num - 1):
            j = i + int(draws[i]) % (num - i)
            perm[i], perm[j] = perm[j], perm[i]
        idx = np.array(perm, dtype=np.int64)
        for name in ("row", "weight", "assign", "cost"):
            arr = getattr(ps, name)
            arr[:num] = arr[:num][idx]

    def intshuffle(self, a: list[int]) -> None:
        n = len(a)
        draws = self.rng.lrand48_many(n)
        for i in range(n):
            j = i + int(draws[i]) % (n - i)
            a[i], a[j] = a[j], a[i]

    # -- A.9 ---------------------------------------------------------------------------

    def pspeedy(self, ps: PointSet, z: np.float32) -> float:
        num = ps.num
        self.counters.pspeedy += 1
        w = ps.weight[:num]
        cost = self.dist_to(ps, 0) * w
        assign = np.zeros(num, dtype=np.int64)
        self.k = 1
        u = self.rng.units(num - 1)  # one draw per candidate 1..num-1, always
        i = 1
        while i < num:
            hits = np.flatnonzero(u[i - 1 :] < cost[i:] / z)
            if len(hits) == 0:
                break
            i += int(hits[0])
            self.k += 1
            self.counters.speedy_opened += 1
            dcand = self.dist_to(ps, i) * w
            closer = dcand < cost
            cost[closer] = dcand[closer]
            assign[closer] = i
            i += 1
        ps.cost[:num] = cost
        ps.assign[:num] = assign
        total = float(F32(z * F32(self.k)))
        for lo, hi in blocks(num, self.nproc):
            total += seqsum(cost[lo:hi])
        return float(F32(total))

    # -- A.10 --------------------------------------------------------------------------

    def selectfeasible_fast(self, ps: PointSet) -> list[int]:
        num = ps.num
        limit = float(ITER * self.kmin) * math.log(self.kmin)
        numfeasible = int(limit) if num > limit else num
        if numfeasible == num:
            return list(range(num))
        accum = np.cumsum(ps.weight[:num], dtype=F32)
        total = accum[-1]
        feasible = []
        for _ in range(numfeasible):
            w = self.rng.unit() * total
            if accum[0] > w:
                feasible.append(0)
                continue
            lo, hi = 0, num - 1
            while lo + 1 < hi:
                mid = (lo + hi) // 2
                if accum[mid] > w:
                    hi = mid
                else:
                    lo = mid
            feasible.append(hi)
        return feasible

    # -- A.12 --------------------------------------------------------------------------

    def pgain(self, x: int, ps: PointSet, z: float) -> float:
        self.counters.pgain += 1
        num = ps.num
        w = ps.weight[:num]
        cur = ps.cost[:num]
        assign = ps.assign[:num]
        centres = np.flatnonzero(self.is_center[:num])
        table = np.full(num, -1, dtype=np.int64)
        table[centres] = np.arange(len(centres))
        k_dense = max(len(centres), 1)

        x_cost = self.dist_to(ps, x) * w
        switch = x_cost < cur
        gain_terms = (x_cost - cur).astype(F64)  # float subtraction, then widened
        lower_terms = (cur - x_cost).astype(F64)
        owner = table[assign]
        # Both facts the C program's work_mem layout relies on (A.12 notes).
        if np.any(owner < 0):
            raise AssertionError("a point is assigned to a non-centre")
        if len(centres) != self.k:
            raise AssertionError(f"k={self.k} but {len(centres)} centres are marked")

        parts = blocks(num, self.nproc)
        opening = []  # per thread: cost_of_opening_x
        lowers = []  # per thread: "lower" accumulators per dense centre number
        for lo, hi in parts:
            sw = switch[lo:hi]
            opening.append(seqsum(gain_terms[lo:hi][sw]))
            keep = ~sw
            # bincount adds the weights one by one in index order: a sequential sum per bin.
            lowers.append(
                np.bincount(owner[lo:hi][keep], weights=lower_terms[lo:hi][keep], minlength=k_dense)
            )

        gl_lower = np.zeros(k_dense, dtype=F64)
        closing = 0
        for t, (lo, hi) in enumerate(parts):
            for j in centres[(centres >= lo) & (centres < hi)]:
                c = table[j]
                low = z
                for part in lowers:
                    low += float(part[c])
                gl_lower[c] = low
                if low > 0:
                    closing += 1
                    opening[t] -= low
        total = z
        for part in opening:
            total += part

        if total < 0:
            self.counters.pgain_accepted += 1
            move = switch | (gl_lower[owner] > 0)
            ps.cost[:num][move] = x_cost[move]
            ps.assign[:num][move] = x
            closed = centres[gl_lower[table[centres]] > 0]
            self.is_center[closed] = False
            self.is_center[x] = True
            self.k = self.k + 1 - closing
            return -total
        return -0.0

    # -- A.11 --------------------------------------------------------------------------

    def pfl(self, ps, feasible, z: np.float32, cost: float, iters: int, e: np.float32) -> float:
        change = cost
        while _ratio(change, cost) > float(e):
            change = 0.0
            self.counters.pfl_iterations += 1
            self.intshuffle(feasible)
            for t in range(iters):
                change += self.pgain(feasible[t % len(feasible)], ps, float(z))
            cost -= change
        return float(F32(cost))

    # -- A.8 ---------------------------------------------------------------------------

    def pkmedian(self, ps: PointSet) -> int:
        num, kmin, kmax = ps.num, self.kmin, self.kmax
        self._coords_t = np.ascontiguousarray(ps.coords.T)
        self._dcache: dict[int, np.ndarray] = {}
        self.is_center = np.zeros(num, dtype=bool)
        hiz = 0.0
        if num > 0:
            d0 = self.dist_to(ps, 0) * ps.weight[:num]
            for lo, hi in blocks(num, self.nproc):
                hiz += seqsum(d0[lo:hi])
        loz = 0.0
        z = (hiz + loz) / 2.0
        if num <= kmax:
            ps.assign[:num] = np.arange(num)
            ps.cost[:num] = 0
            return self.k
        self.shuffle(ps)
        cost = self.pspeedy(ps, F32(z))
        i = 0
        while self.k < kmin and i < SP:
            cost = self.pspeedy(ps, F32(z))
            i += 1
        while self.k < kmin:
            if i >= SP:
                hiz = z
                z = (hiz + loz) / 2.0
                i = 0
            self.shuffle(ps)
            cost = self.pspeedy(ps, F32(z))
            i += 1
        feasible = self.selectfeasible_fast(ps)
        self.is_center[ps.assign[:num]] = True
        iters = int(float(ITER * kmax) * math.log(kmax))
        while True:
            self.counters.bisection_steps += 1
            cost = self.pfl(ps, feasible, F32(z), cost, iters, F32(0.1))
            k = self.k
            if (k <= 1.1 * kmax and k >= 0.9 * kmin) or (k <= kmax + 2 and k >= kmin - 2):
                cost = self.pfl(ps, feasible, F32(z), cost, iters, F32(0.001))
            k = self.k
            if k > kmax:
                loz = z
                z = (hiz + loz) / 2.0
                cost += (z - loz) * k
            if k < kmin:
                hiz = z
                z = (hiz + loz) / 2.0
                cost += (z - hiz) * k
            if (kmin <= k <= kmax) or loz >= 0.999 * hiz:
                break
        return self.k

    # -- A.13 --------------------------------------------------------------------------

    @staticmethod
    def assignment_cost(ps: PointSet) -> float:
        """Sum of weight x dist(point, its centre), recomputed from the coordinates."""
        num = ps.num
        if num == 0:
            return 0.0
        mine = ps.coords[ps.row[:num]]
        theirs = ps.coords[ps.row[ps.assign[:num]]]
        diff = mine - theirs
        acc = diff[:, 0] * diff[:, 0]
        for c in range(1, diff.shape[1]):
            acc = acc + diff[:, c] * diff[:, c]
        return seqsum(acc * ps.weight[:num])

    @staticmethod
    def contcenters(ps: PointSet) -> None:
        for j in range(ps.num):
            a = int(ps.assign[j])
            if a == j:
                continue
            wa, wj = ps.weight[a], ps.weight[j]
            rel = wj / (wa + wj)
            ra, rj = ps.row[a], ps.row[j]
            kept = (ps.coords[ra].astype(F64) * (1.0 - F64(rel))).astype(F32)
            ps.coords[ra] = kept + ps.coords[rj] * rel
            ps.weight[a] = wa + wj

    @staticmethod
    def copycenters(ps: PointSet, centers: PointSet, ids: list[int], offset: int) -> None:
        medians = np.zeros(ps.num, dtype=bool)
        medians[ps.assign[: ps.num]] = True
        m = centers.num
        for j in np.flatnonzero(medians):
            centers.coords[centers.row[m]] = ps.coords[ps.row[j]]
            centers.weight[m] = ps.weight[j]
            ids[m] = int(j) + offset
            m += 1
        centers.num = m

    @staticmethod
    def outcenterids(centers: PointSet, ids: list[int]) -> tuple[str, int, float]:
        marked = np.zeros(centers.num, dtype=bool)
        marked[centers.assign[: centers.num]] = True
        lines, count, weight = [], 0, 0.0
        for i in np.flatnonzero(marked):
            lines.append(f"{ids[i] & 0xFFFFFFFF}\n")
            lines.append(f"{float(centers.weight[i]):f}\n")  # C's %lf
            lines.append("".join(f"{float(v):f} " for v in centers.coords[centers.row[i]]))
            lines.append("\n\n")
            count += 1
            weight += float(centers.weight[i])
        return "".join(lines), count, weight

    # -- A.6 ---------------------------------------------------------------------------

    def run(self, n: int, chunksize: int, clustersize: int, infile: Path | None = None) -> Result:
        d = self.d
        points = PointSet.new(chunksize, d)
        centers = PointSet.new(clustersize, d)
        ids = [0] * clustersize
        data = None
        if n <= 0:
            raw = np.fromfile(infile, dtype="<f4")
            data = raw[: len(raw) // d * d].reshape(-1, d)
        remaining = n if n > 0 else len(data)
        offset = 0
        chunk_cost = 0.0
        pos = 0
        while True:
            count = min(chunksize, remaining)
            if data is None:
                points.coords[:count] = self.rng.units(count * d).reshape(count, d)
            else:
                points.coords[:count] = data[pos : pos + count]
                pos += count
            remaining -= count
            # A file stream reaches end of file only after a read comes up short.
            at_end = remaining <= 0 if data is None else (count < chunksize)
            points.num = count
            points.weight[:count] = 1.0
            kfinal = self.pkmedian(points)
            chunk_cost += self.assignment_cost(points)
            self.contcenters(points)
            if kfinal + centers.num > clustersize:
                raise RuntimeError("oops! no more space for centers")
            self.copycenters(points, centers, ids, offset)
            offset += count
            if at_end:
                break
        self.counters.intermediate_centres = centers.num
        self.pkmedian(centers)
        final_cost = self.assignment_cost(centers)
        self.contcenters(centers)
        text, count, weight = self.outcenterids(centers, ids)
        return Result(text, count, weight, chunk_cost, final_cost, self.counters)


def _ratio(a: float, b: float) -> float:
    """a / b with C's IEEE semantics for b == 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(F64(a) / F64(b))


def run_set(name: str, nproc: int = 1) -> Result:
    k1, k2, d, n, chunk, cluster = SETS[name]
    return StreamCluster(k1, k2, d, nproc).run(n, chunk, cluster)


def run_args(k1, k2, d, n, chunk, cluster, nproc=1, infile=None) -> Result:
    return StreamCluster(k1, k2, d, nproc).run(n, chunk, cluster, infile)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set", choices=sorted(SETS))
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the output file here")
    args = parser.parse_args(argv)
    res = run_set(args.set, args.nproc)
    if args.out:
        args.out.write_text(res.output)
    c = res.counters
    print(
        f"centres={res.centres} weight={res.weight:.0f} chunk_cost={res.chunk_cost:.9e} "
        f"final_cost={res.final_cost:.9e} pgain={c.pgain} accepted={c.pgain_accepted} "
        f"pspeedy={c.pspeedy} speedy_opened={c.speedy_opened} pfl={c.pfl_iterations} "
        f"bisection={c.bisection_steps} intermediate={c.intermediate_centres}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
