"""PNG figures in the thesis's style, from an Analysis (and the raw runs for timelines).

matplotlib is imported inside `make_plots` only: the agent never needs it, and a missing
matplotlib costs the figures, not the results (the caller reports that).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from damon_hp.experiment.analysis import Analysis, GroupSummary, Ratio
from damon_hp.experiment.results import OK, RunResult

# One colour per arm, stable across figures (colour-blind-safe Okabe-Ito palette).
COLOURS = {
    "thp-never": "#000000",
    "thp-always": "#E69F00",
    "thp-madvise": "#56B4E9",
    "damos-ethp": "#009E73",
    "damos-collapse": "#F0E442",
    "damon-hp": "#0072B2",
    "damon-hp-compact": "#CC79A7",
    "oracle": "#D55E00",
}
NORMALISED_PANELS = [
    ("runtime_s", "runtime"),
    ("minflt", "minor faults"),
    ("dtlb_load_misses", "dTLB load misses"),
]


def colour(arm: str) -> str:
    return COLOURS.get(arm, "#999999")


def _bar_with_range(ax: Any, x: float, r: Ratio | None, width: float, colour: str) -> None:
    if r is None or r.value is None:
        ax.text(x, 0.02, "n/a", ha="center", va="bottom", fontsize=7, rotation=90,
                transform=ax.get_xaxis_transform())
        return
    ax.bar(x, r.value, width, color=colour)
    if r.lo is not None and r.hi is not None:
        ax.errorbar(x, r.value, yerr=[[max(0.0, r.value - r.lo)], [max(0.0, r.hi - r.value)]],
                    color="#444444", capsize=2, linewidth=0.8)


def _layout(fig: Any, top: float, bottom: float = 0.10) -> None:
    # Fixed margins: tight_layout measures every text twice, which costs most of the drawing
    # time, and drawing runs under the VM's emulation in the smoke test.
    fig.subplots_adjust(left=0.1, right=0.97, bottom=bottom, top=top, wspace=0.3)


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def _normalised(plt: Any, groups: list[GroupSummary], path: Path, title: str) -> None:
    """Bars of runtime, faults and TLB misses / thp-never, one cluster per thread count."""
    fig, axes = plt.subplots(1, len(NORMALISED_PANELS), figsize=(4.2 * len(NORMALISED_PANELS), 3.6))
    arms = _arms(groups)
    for ax, (metric, label) in zip(axes, NORMALISED_PANELS, strict=True):
        width = 0.8 / max(1, len(arms))
        ax.set_xlim(-0.5, len(groups) - 0.5)
        ax.set_xticks(range(len(groups)), [f"{g.threads} thr" for g in groups])
        ax.set_title(f"{label} / thp-never", fontsize=10)
        ratios = {(gi, p): (g.arms[p].vs_never.get(metric) if p in g.arms else None)
                  for gi, g in enumerate(groups) for p in arms}
        if all(r is None or r.value is None for r in ratios.values()):
            reason = "n/a (no PMU)" if "tlb" in metric else "no data"
            ax.text(0.5, 0.5, reason, ha="center", va="center", transform=ax.transAxes)
            ax.set_yticks([])
            continue
        for (gi, p), r in ratios.items():
            pi = arms.index(p)
            _bar_with_range(ax, gi + (pi - (len(arms) - 1) / 2) * width, r, width,
                            colour(p))
        ax.axhline(1.0, color="#888888", linewidth=0.8, linestyle="--")
    _legend(fig, arms)
    fig.suptitle(title, fontsize=11)
    _layout(fig, top=0.78)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _arms(groups: list[GroupSummary]) -> list[str]:
    out: list[str] = []
    for g in groups:
        for p in g.arms:
            if p not in out:
                out.append(p)
    return out


def _legend(fig: Any, arms: list[str]) -> None:
    import matplotlib.patches as mpatches

    handles = [mpatches.Patch(color=colour(p), label=p) for p in arms]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(arms), 7), fontsize=8,
               bbox_to_anchor=(0.5, 0.93), frameon=False)


def _memory(plt: Any, groups: list[GroupSummary], path: Path, title: str) -> None:
    """Peak RSS and mean AnonHugePages per arm (MiB), median with min..max."""
    panels = [("peak_rss_bytes", "peak RSS (MiB)"), ("anon_huge_mean_bytes",
                                                     "AnonHugePages, time-weighted mean (MiB)")]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    arms = _arms(groups)
    width = 0.8 / max(1, len(arms))
    for ax, (metric, label) in zip(axes, panels, strict=True):
        for gi, g in enumerate(groups):
            for pi, p in enumerate(arms):
                s = g.arms.get(p)
                sp = s.metrics.get(metric) if s else None
                x = gi + (pi - (len(arms) - 1) / 2) * width
                if sp is None or sp.median is None:
                    continue
                mib = 2**20
                ax.bar(x, sp.median / mib, width, color=colour(p))
                if sp.lo is not None and sp.hi is not None:
                    ax.errorbar(x, sp.median / mib,
                                yerr=[[(sp.median - sp.lo) / mib], [(sp.hi - sp.median) / mib]],
                                color="#444444", capsize=2, linewidth=0.8)
        ax.set_xlim(-0.5, len(groups) - 0.5)
        ax.set_xticks(range(len(groups)), [f"{g.threads} thr" for g in groups])
        ax.set_title(label, fontsize=10)
    _legend(fig, arms)
    fig.suptitle(title, fontsize=11)
    _layout(fig, top=0.78)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pareto(plt: Any, groups: list[GroupSummary], path: Path, title: str) -> None:
    """Runtime against peak RSS, one point per arm (medians, whiskers = min..max)."""
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(groups), figsize=(max(6.5, 4.5 * len(groups)), 4.0),
                             squeeze=False)
    for ax, g in zip(axes[0], groups, strict=True):
        per_op = g.runtime_basis == "ns per operation"
        scale, unit = (1e9, "ns per operation") if per_op else (1.0, "s")
        pts = []
        for p, s in g.arms.items():
            t, m = s.metrics.get("runtime_s"), s.metrics.get("peak_rss_bytes")
            if not t or not m or t.median is None or m.median is None:
                continue
            mib = 2**20
            x, y = m.median / mib, t.median * scale
            ax.errorbar(x, y,
                        xerr=[[(m.median - m.lo) / mib], [(m.hi - m.median) / mib]],
                        yerr=[[(t.median - t.lo) * scale], [(t.hi - t.median) * scale]],
                        fmt="o", color=colour(p), capsize=2, linewidth=0.8, label=p)
            ax.annotate(p, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            pts.append((x, y))
        front = _pareto_front(pts)
        if len(front) > 1:
            ax.plot(*zip(*front, strict=True), color="#888888", linestyle=":", linewidth=1)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.set_xlabel("peak RSS (MiB)")
        ax.set_ylabel(f"runtime ({unit})")
        ax.set_title(f"{g.threads} thr, {g.memory} memory", fontsize=10)
    fig.suptitle(f"{title}\nlower left is better; dotted line: Pareto front", fontsize=10)
    _layout(fig, top=0.80, bottom=0.13)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated in (memory, runtime), sorted by memory."""
    front = []
    for x, y in sorted(points):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return front


def _pressure(plt: Any, analysis: Analysis, workload: str, path: Path, title: str) -> bool:
    effects = [e for e in analysis.pressure if e.workload == workload]
    if not effects:
        return False
    threads = sorted({e.threads for e in effects})
    arms: list[str] = []
    for e in effects:
        if e.arm not in arms:
            arms.append(e.arm)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    width = 0.8 / max(1, len(arms))
    for ti, th in enumerate(threads):
        for pi, p in enumerate(arms):
            e = next((e for e in effects if e.threads == th and e.arm == p), None)
            _bar_with_range(ax, ti + (pi - (len(arms) - 1) / 2) * width,
                            e.slowdown if e else None, width, colour(p))
    ax.axhline(1.0, color="#888888", linewidth=0.8, linestyle="--")
    ax.set_xlim(-0.5, len(threads) - 0.5)
    ax.set_xticks(range(len(threads)), [f"{t} thr" for t in threads])
    ax.set_ylabel("runtime insufficient / sufficient")
    _legend(fig, arms)
    fig.suptitle(title, fontsize=11)
    _layout(fig, top=0.76)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _timeline(plt: Any, runs: list[RunResult], workload: str, path: Path, title: str) -> bool:
    """AnonHugePages over time in repetition 0, sufficient memory, fewest threads."""
    chosen = [r for r in runs if r.workload == workload and r.memory == "sufficient"
              and r.rep == 0 and r.status == OK and r.samples]
    if not chosen:
        return False
    th = min(r.threads for r in chosen)
    chosen = [r for r in chosen if r.threads == th]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for r in chosen:
        t = [s["t"] for s in r.samples if s.get("anon_huge") is not None]
        y = [s["anon_huge"] / 2**20 for s in r.samples if s.get("anon_huge") is not None]
        if t:
            ax.step(t, y, where="post", color=colour(r.arm), label=r.arm, linewidth=1.2)
    ax.set_xlabel("seconds since the workload started")
    ax.set_ylabel("AnonHugePages (MiB)")
    ax.legend(fontsize=7, ncol=2)
    # two lines: one line with a long workload name ran past the figure's right edge
    ax.set_title(f"{title}\n({th} thread(s), sufficient memory, repetition 0)", fontsize=10)
    _layout(fig, top=0.85, bottom=0.14)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


PROJECT_ROOT = Path(__file__).resolve().parents[3]
SHARED_MPL_DIR = PROJECT_ROOT / ".cache" / "matplotlib"


def _matplotlib_config_dir() -> None:
    """Point matplotlib at a font cache that survives VM runs.

    matplotlib builds a font list on first use, which under the VM's emulation (fresh HOME per
    boot, files over 9p) takes a minute or more. On the host the list is kept in the project's
    .cache/; inside the VM, where the tree is read-only, a private copy of that list is used.
    """
    if os.environ.get("MPLCONFIGDIR"):
        return
    try:
        SHARED_MPL_DIR.mkdir(parents=True, exist_ok=True)
        writable = os.access(SHARED_MPL_DIR, os.W_OK)
    except OSError:
        writable = False
    if writable:
        os.environ["MPLCONFIGDIR"] = str(SHARED_MPL_DIR)
        return
    private = Path(tempfile.gettempdir()) / "damon-hp-matplotlib"
    private.mkdir(exist_ok=True)
    for f in SHARED_MPL_DIR.glob("fontlist-*.json"):
        shutil.copyfile(f, private / f.name)
    os.environ["MPLCONFIGDIR"] = str(private)


def make_plots(analysis: Analysis, runs: list[RunResult], outdir: Path) -> dict[str, list[
        tuple[str, str]]]:
    """Write PNGs under outdir; return {workload: [(caption, path relative to outdir.parent)]}."""
    _matplotlib_config_dir()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    figures: dict[str, list[tuple[str, str]]] = {}
    workloads: list[str] = []
    for g in analysis.groups:
        if g.workload not in workloads:
            workloads.append(g.workload)
    for wl in workloads:
        figs: list[tuple[str, str]] = []
        name = slug(wl)
        for mem in ("sufficient", "insufficient"):
            groups = [g for g in analysis.groups if g.workload == wl and g.memory == mem]
            if not groups:
                continue
            p = outdir / f"{name}_{mem}_normalised.png"
            _normalised(plt, groups, p, f"{wl}, {mem} memory: normalised to thp-never")
            figs.append((f"{mem} memory: runtime, faults and TLB misses relative to thp-never "
                         "(bars: median ratio; whiskers: per-repetition range; threads side by "
                         "side)", f"{outdir.name}/{p.name}"))
            p = outdir / f"{name}_{mem}_memory.png"
            _memory(plt, groups, p, f"{wl}, {mem} memory: memory use per arm")
            figs.append((f"{mem} memory: peak RSS and mean AnonHugePages per arm",
                         f"{outdir.name}/{p.name}"))
            p = outdir / f"{name}_{mem}_pareto.png"
            _pareto(plt, groups, p, f"{wl}, {mem} memory: runtime vs memory")
            figs.append((f"{mem} memory: runtime against peak RSS (Pareto plot)",
                         f"{outdir.name}/{p.name}"))
        p = outdir / f"{name}_pressure.png"
        if _pressure(plt, analysis, wl, p, f"{wl}: slowdown under memory pressure"):
            figs.append(("runtime with insufficient memory relative to sufficient memory, per "
                         "arm", f"{outdir.name}/{p.name}"))
        p = outdir / f"{name}_timeline.png"
        if _timeline(plt, runs, wl, p, f"{wl}: AnonHugePages over time"):
            figs.append(("AnonHugePages over time, one line per arm",
                         f"{outdir.name}/{p.name}"))
        figures[wl] = figs
    return figures
