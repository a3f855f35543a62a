"""Independent numpy reference for water_nsquared (workloads-spec.md Part B), for tests only.

Same physics and time stepping as the C program, written a different way so that a shared
mistake is unlikely: whole-array numpy operations instead of per-molecule loops, and every
unordered molecule pair i < j (pruned exactly by O-O distance) instead of the program's
wrap-around enumeration (so agreement also shows the C enumeration visits each pair exactly once).
One "thread": no per-thread force arrays, no locks.

    ref = run(nmol=512, nstep=3, raw_numbers=[...])   # -> Result with one Energy per step
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# Constants, spec B.4.
TEMP, RHO = 298.0, 0.9980
ROH, ANGLE = 0.9572, 1.824218
OMAS, HMAS = 15.99945, 1.007825
WTMOL = OMAS + 2 * HMAS
UNITT, UNITL, UNITM = 1.0e-15, 1.0e-8, 1.6605655e-24
BOLTZ = 1.380662e-16
FC = dict(
    c11=0.512596, c33=0.048098, c12=-0.005823, c13=0.016452,
    c111=-0.57191, c333=-0.007636, c112=-0.001867, c113=-0.002047, c123=-0.03083,
    c133=-0.0094245,
    c1111=0.8431, c3333=-0.00193, c1112=-0.0030, c1122=0.0036, c1113=-0.012, c1123=0.0060,
    c1133=-0.0048, c1233=0.0211, c1333=0.006263,
)
QQ = 0.07152158
A1, B1 = 455.313100, 5.15271070
A2, B2 = 0.27879839, 2.76084370
A3, B3 = 0.60895706, 2.96189550
A4, B4 = 0.11447336, 2.23326410
CM = 0.45682590
C1, C2 = 1 - CM, CM / 2
NORDER = 6
PCC = np.array([863 / 6048, 665 / 1008, 1.0, 25 / 36, 35 / 144, 1 / 24, 1 / 360])

# State array axes: [molecule, slot, direction, atom]; atoms H1, O (OX), H2 = 0, 1, 2.
DISP, VEL, ACC, FORCES = 0, 1, 2, 7
MASS = np.array([HMAS, OMAS, HMAS])

# Interaction sites of a molecule as rows of `sites()`: H1, O, H2, M.
H1, OX, H2, M = 0, 1, 2, 3
SITE_PAIRS = [  # (site on A, site on B) for K = 0..13, spec B.13
    (M, M), (M, H1), (M, H2), (H1, M), (H2, M), (H1, H1), (H1, H2), (H2, H1), (H2, H2),
    (OX, OX), (OX, H1), (OX, H2), (H1, OX), (H2, OX),
]
PAIR_A = np.array([a for a, _ in SITE_PAIRS])
PAIR_B = np.array([b for _, b in SITE_PAIRS])


@dataclass(frozen=True)
class Box:
    nmol: int
    tstep: float  # scaled (units of 1e-15 s)
    boxl: float
    cutoff: float

    @property
    def boxh(self) -> float:
        return self.boxl / 2

    @property
    def cut2(self) -> float:
        return self.cutoff**2

    @property
    def ref1(self) -> float:
        return -QQ / self.cutoff**3

    @property
    def fpot(self) -> float:
        return UNITM * (UNITL / UNITT) ** 2 / (BOLTZ * TEMP * 3 * self.nmol)

    @property
    def fkin(self) -> float:
        return self.fpot * 0.5 / self.tstep**2


def make_box(nmol: int, tstep_s: float = 1.5e-16, cutoff: float = 6.212752) -> Box:
    boxl = (nmol * WTMOL * UNITM / RHO) ** (1 / 3) / UNITL
    if cutoff == 0:
        cutoff = boxl / 2
    return Box(nmol, tstep_s / UNITT, boxl, min(cutoff, 11.0))


def lattice_side(nmol: int) -> int:
    n = round(nmol ** (1 / 3))
    if n**3 != nmol:
        raise ValueError(f"nmol = {nmol} is not a perfect cube")
    return n


def initial_state(box: Box, raw_numbers: Sequence[float]) -> np.ndarray:
    """Lattice positions and normalised velocities (spec B.8), as a (nmol, 9, 3, 3) array."""
    nmol, n = box.nmol, lattice_side(box.nmol)
    xs = box.boxl / (nmol ** (1 / 3) - 1e-5)
    zero = xs / 2
    wcos, wsin = ROH * np.cos(ANGLE / 2), ROH * np.sin(ANGLE / 2)
    i, j, k = np.meshgrid(np.arange(n), np.arange(n), np.arange(n), indexing="ij")
    oxy = zero + xs * np.stack([i.ravel(), j.ravel(), k.ravel()], axis=1)  # (nmol, dir)
    state = np.zeros((nmol, 9, 3, 3))
    state[:, DISP, :, OX] = oxy
    state[:, DISP, :, H1] = oxy + [wcos, wsin, 0.0]
    state[:, DISP, :, H2] = oxy + [wcos, -wsin, 0.0]

    raw = np.zeros(9 * nmol)
    given = np.asarray(raw_numbers[1 : 1 + 9 * nmol], dtype=float)  # first number is skipped
    raw[: len(given)] = given
    v = raw.reshape(nmol, 3, 3).transpose(0, 2, 1)  # file order is (atom, dir) -> (dir, atom)
    mean = v.mean(axis=(0, 2))  # per direction, over all atoms
    dv = v - mean[None, :, None]
    q = (dv**2 / MASS[None, None, :]).sum(axis=(0, 2))
    fac = BOLTZ * TEMP * 3 * nmol / UNITM * (UNITT * box.tstep / UNITL) ** 2
    scale = np.sqrt(fac / q)
    state[:, VEL] = dv * scale[None, :, None] / MASS[None, None, :]
    return state


def m_site(disp: np.ndarray) -> np.ndarray:
    """M site positions (..., dir) from DISP (..., dir, atom)."""
    return C1 * disp[..., OX] + C2 * (disp[..., H1] + disp[..., H2])


def intra_geometry(disp: np.ndarray):
    u1 = disp[:, :, OX] - disp[:, :, H1]
    u2 = disp[:, :, OX] - disp[:, :, H2]
    r1 = np.linalg.norm(u1, axis=1)
    r2 = np.linalg.norm(u2, axis=1)
    cos = (u1 * u2).sum(axis=1) / (r1 * r2)
    a, b = r1 - ROH, r2 - ROH
    t = (np.arccos(cos) - ANGLE) * ROH
    return u1, u2, r1, r2, cos, a, b, t


def intra_potential(a, b, t):
    """The quartic intramolecular potential V(a, b, t), spec B.15 step 1 (per molecule)."""
    f, rho = FC, ROH
    s = a + b
    return (
        0.5 * (f["c11"] * (a**2 + b**2) + f["c33"] * t**2) + f["c12"] * a * b + f["c13"] * s * t
        + (f["c111"] * (a**3 + b**3) + f["c333"] * t**3 + f["c112"] * s * a * b
           + f["c113"] * (a**2 + b**2) * t + f["c123"] * a * b * t + f["c133"] * s * t**2) / rho
        + (f["c1111"] * (a**4 + b**4) + f["c3333"] * t**4 + f["c1112"] * (a**2 + b**2) * a * b
           + f["c1122"] * a**2 * b**2 + f["c1113"] * (a**3 + b**3) * t
           + f["c1123"] * s * a * b * t + f["c1133"] * (a**2 + b**2) * t**2
           + f["c1233"] * a * b * t**2 + f["c1333"] * s * t**3) / rho**2
    )


def intra_forces(disp: np.ndarray) -> np.ndarray:
    """Intramolecular forces (nmol, dir, atom) as minus the gradient of intra_potential.

    The spec gives the derivatives dV/da, dV/db, dV/dt in closed form; here they are taken
    numerically (central differences of the potential polynomial), which checks the C
    program's closed-form derivatives against the energy expression at the same time.
    """
    u1, u2, r1, r2, cos, a, b, t = intra_geometry(disp)
    h = 1e-6
    dva = (intra_potential(a + h, b, t) - intra_potential(a - h, b, t)) / (2 * h)
    dvb = (intra_potential(a, b + h, t) - intra_potential(a, b - h, t)) / (2 * h)
    dvt = (intra_potential(a, b, t + h) - intra_potential(a, b, t - h)) / (2 * h)
    e1, e2 = u1 / r1[:, None], u2 / r2[:, None]
    sin = np.sqrt(1 - cos**2)
    # d(theta)/d(r_H1) = (e2 - e1 cos) / (r1 sin); t = (theta - ANGLE) * ROH; da/d(r_H1) = -e1.
    dth1 = (e2 - e1 * cos[:, None]) / (r1 * sin)[:, None]
    dth2 = (e1 - e2 * cos[:, None]) / (r2 * sin)[:, None]
    fh1 = dva[:, None] * e1 - dvt[:, None] * ROH * dth1
    fh2 = dvb[:, None] * e2 - dvt[:, None] * ROH * dth2
    out = np.empty_like(disp)
    out[:, :, H1], out[:, :, H2], out[:, :, OX] = fh1, fh2, -(fh1 + fh2)
    return out


def sites(disp: np.ndarray) -> np.ndarray:
    """(nmol, 4 sites, dir): H1, O, H2 from DISP, and the M site."""
    return np.concatenate([disp.transpose(0, 2, 1), m_site(disp)[:, None, :]], axis=1)


def separations(box: Box, st: np.ndarray, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
    """Minimum-image site separations (pairs, 14, dir), A minus B."""
    d = st[ia][:, PAIR_A, :] - st[ib][:, PAIR_B, :]
    return np.where(np.abs(d) > box.boxh, d - np.sign(d) * box.boxl, d)


PAIR_CHUNK = 200_000


def pair_chunks(box: Box, disp: np.ndarray):
    """Every unordered pair i < j that can have a site pair within the cutoff, in chunks.

    Exact pruning, not an approximation: if the O-O distance exceeds CUTOFF plus twice the
    largest O-to-site distance present, the triangle inequality puts all nine charge-site
    distances beyond the cutoff (KC == 9), and such a pair contributes nothing.
    """
    n = box.nmol
    o = disp[:, :, OX]
    reach = float(np.linalg.norm(sites(disp) - o[:, None, :], axis=2).max())
    limit2 = (box.cutoff + 2 * reach) ** 2
    rows = max(1, 2_000_000 // n)
    found_a, found_b, count = [], [], 0
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        d = o[i0:i1, None, :] - o[None, i0:, :]  # only j >= i0 can satisfy j > i
        d -= box.boxl * np.rint(d / box.boxl)
        close = ((d**2).sum(axis=2) <= limit2) & (
            np.arange(i0, n)[None, :] > np.arange(i0, i1)[:, None])
        ia, ib = np.nonzero(close)
        found_a.append(ia + i0)
        found_b.append(ib + i0)
        count += len(ia)
        if count >= PAIR_CHUNK:
            yield np.concatenate(found_a), np.concatenate(found_b)
            found_a, found_b, count = [], [], 0
    if count:
        yield np.concatenate(found_a), np.concatenate(found_b)


def inter_forces(box: Box, disp: np.ndarray) -> tuple[np.ndarray, float, int]:
    """Pair forces (nmol, dir, atom), their virial, and the number of interacting pairs."""
    st = sites(disp)
    forces = np.zeros((box.nmol, 3, 3))
    vir, interacting = 0.0, 0
    for ia, ib in pair_chunks(box, disp):
        d = separations(box, st, ia, ib)
        rs = (d**2).sum(axis=2)
        kc = (rs[:, :9] > box.cut2).sum(axis=1)
        keep = kc < 9
        ia, ib, d, rs, kc = ia[keep], ib[keep], d[keep], rs[keep], kc[keep]
        interacting += len(ia)
        rl = np.sqrt(rs)
        ff = np.zeros_like(rs)
        c2, r1 = box.cut2, box.ref1
        ff[:, 0] = np.where(rs[:, 0] < c2, 4 * QQ / (rs[:, 0] * rl[:, 0]) + 4 * r1, 0.0)
        ff[:, 1:5] = np.where(rs[:, 1:5] < c2, -2 * QQ / (rs[:, 1:5] * rl[:, 1:5]) - 2 * r1, 0.0)
        ff[:, 5:9] = np.where(rs[:, 5:9] <= c2, QQ / (rs[:, 5:9] * rl[:, 5:9]) + r1, 0.0)
        near = (kc == 0)[:, None]
        ff[:, 9:10] = np.where(near, A1 * B1 * np.exp(-B1 * rl[:, 9:10]) / rl[:, 9:10], 0.0)
        ff[:, 5:9] += np.where(near, A2 * B2 * np.exp(-B2 * rl[:, 5:9]) / rl[:, 5:9], 0.0)
        ff[:, 10:14] = np.where(
            near,
            (A3 * B3 * np.exp(-B3 * rl[:, 10:14]) - A4 * B4 * np.exp(-B4 * rl[:, 10:14]))
            / rl[:, 10:14],
            0.0,
        )
        vir += float((ff * rs).sum())
        g = ff[:, :, None] * d  # force on A's site of pair K, (pairs, 14, dir)
        # Each site pair's force acts on the two sites; an M-site force is shared out as
        # C1 to O and C2 to each H. Sum per (molecule, site), then spread M.
        site_f = np.zeros((box.nmol, 4, 3))
        for k in range(14):
            np.add.at(site_f, (ia, PAIR_A[k]), g[:, k])
            np.add.at(site_f, (ib, PAIR_B[k]), -g[:, k])
        forces[:, :, H1] += (site_f[:, H1] + C2 * site_f[:, M])
        forces[:, :, OX] += (site_f[:, OX] + C1 * site_f[:, M])
        forces[:, :, H2] += (site_f[:, H2] + C2 * site_f[:, M])
    return forces, vir, interacting


def inter_potential(box: Box, disp: np.ndarray) -> tuple[float, float]:
    """Pair potential and reaction-field term (spec B.15 step 3), unscaled."""
    st = sites(disp)
    potr = potrf = 0.0
    charge = np.array([4.0, -2, -2, -2, -2, 1, 1, 1, 1]) * QQ  # q_i q_j of pairs 0..8
    for ia, ib in pair_chunks(box, disp):
        d = separations(box, st, ia, ib)
        rs = (d**2).sum(axis=2)
        kc = (rs[:, :9] > box.cut2).sum(axis=1)
        keep = kc < 9
        d, rs, kc = d[keep], rs[keep], kc[keep]
        rs9 = np.minimum(rs[:, :9], box.cut2)  # beyond the cutoff counts as at the cutoff
        potr += float((charge / np.sqrt(rs9)).sum())
        # Reaction field: -(q_i q_j / QQ) * REF1 * rs / 2 per charge pair.
        potrf += float((-(charge / QQ) * box.ref1 * rs9 / 2).sum())
        near = kc == 0
        rl = np.sqrt(rs[near])
        potr += float(
            (A1 * np.exp(-B1 * rl[:, 9])).sum()
            + (A2 * np.exp(-B2 * rl[:, 5:9])).sum()
            + (A3 * np.exp(-B3 * rl[:, 10:14])).sum()
            - (A4 * np.exp(-B4 * rl[:, 10:14])).sum()
        )
    return potr, potrf


PASCAL = np.array([[float(np.prod(range(m - k + 1, m + 1)) / np.prod(range(1, k + 1)))
                    if k <= m else 0.0 for k in range(7)] for m in range(7)])  # binom(m, k)


def predict(state: np.ndarray) -> None:
    """Taylor predictor on slots 0..5 from the old slots (a simultaneous update)."""
    old = state[:, : NORDER + 1].copy()
    for k in range(NORDER):
        state[:, k] = np.einsum("m,nmda->nda", PASCAL[k:, k], old[:, k:])


def forces_scaled(box: Box, disp: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float, int]:
    """(intra, inter) forces in scaled-acceleration units a*dt^2/2, with the two virials."""
    scale = 0.5 * box.tstep**2 / MASS[None, None, :]
    fi = intra_forces(disp)
    vir_intra = float((disp * fi).sum())
    fe, vir_inter, pairs = inter_forces(box, disp)
    return fi * scale, fe * scale, vir_intra, vir_inter, pairs


@dataclass
class Energy:
    step: int
    ten: float
    pota: float
    potr: float
    potrf: float
    xtt: float
    avgt: float
    xvir: float


@dataclass
class Result:
    energies: list[Energy] = field(default_factory=list)
    interacting_pairs: int = 0
    checksum_disp: float = 0.0
    checksum_vel: float = 0.0


def checksums(state: np.ndarray) -> tuple[float, float]:
    """Same weights as the C program's Checksum line: 1 + (flat index mod 7)."""
    w = (np.arange(9 * state.shape[0]) % 7 + 1).astype(float)
    return (float((state[:, DISP].reshape(-1) * w).sum()),
            float((state[:, VEL].reshape(-1) * w).sum()))


def run(nmol: int, nstep: int, raw_numbers: Sequence[float], energy_steps: set[int] | None = None,
        tstep_s: float = 1.5e-16, cutoff: float = 6.212752) -> Result:
    """Simulate nstep steps; energies at the steps in energy_steps (default: every step)."""
    box = make_box(nmol, tstep_s, cutoff)
    state = initial_state(box, raw_numbers)
    res = Result()
    energy_steps = set(range(1, nstep + 1)) if energy_steps is None else energy_steps

    # Initial acceleration holds the intermolecular part only (spec B.10, reproduced quirk).
    _, fe, _, _, pairs = forces_scaled(box, state[:, DISP])
    state[:, ACC] = fe
    res.interacting_pairs += pairs
    tkin = tvir = 0.0
    for step in range(1, nstep + 1):
        predict(state)
        fi, fe, vir_i, vir_e, pairs = forces_scaled(box, state[:, DISP])
        res.interacting_pairs += pairs
        y = (fi + fe) - state[:, ACC]
        state[:, : NORDER + 1] += PCC[None, :, None, None] * y[:, None]
        # Periodic boundary: move a whole molecule when its O leaves the box.
        o = state[:, DISP, :, OX]
        shift = np.where(o > box.boxl, -box.boxl, np.where(o < 0, box.boxl, 0.0))
        state[:, DISP] += shift[:, :, None]
        kin = float((state[:, VEL] ** 2 * MASS[None, None, :]).sum())
        tkin += kin
        tvir -= vir_i + vir_e
        if step in energy_steps:
            u1, u2, r1, r2, cos, a, b, t = intra_geometry(state[:, DISP])
            pota = float(intra_potential(a, b, t).sum()) * box.fpot
            potr, potrf = inter_potential(box, state[:, DISP])
            ten = kin * box.fkin
            e = Energy(step=step, ten=ten, pota=pota, potr=potr * box.fpot,
                       potrf=potrf * box.fpot, xtt=0.0,
                       avgt=tkin * box.fkin * TEMP * 2 / (3 * step),
                       xvir=tvir * box.fpot * 0.5 / step)
            e.xtt = e.pota + e.potr + e.potrf + e.ten
            res.energies.append(e)
    res.checksum_disp, res.checksum_vel = checksums(state)
    return res
