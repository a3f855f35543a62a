"""One figure per app workload: the server's RSS and AnonHugePages over time, one line per arm
(first repetition), with the end of the warm-up marked."""

from __future__ import annotations

from pathlib import Path

from damon_hp.experiment.plots import colour, slug
from damon_hp.experiment.results import OK, RunResult
from damon_hp.experiment.spec import Experiment


def memory_over_time(exp: Experiment, runs: list[RunResult], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    made = []
    for w in exp.workloads:
        first = {}
        for r in sorted(runs, key=lambda r: r.rep):
            if r.workload == w.name and r.status == OK and r.samples:
                first.setdefault(r.arm, r)
        if not first:
            continue
        fig, (ax_rss, ax_huge) = plt.subplots(1, 2, figsize=(10, 3.5))
        for arm, r in first.items():
            t = [s["t"] for s in r.samples]
            ax_rss.plot(t, [(s.get("rss") or 0) / 2**20 for s in r.samples], label=arm,
                        color=colour(arm), linewidth=1)
            ax_huge.plot(t, [(s.get("anon_huge") or 0) / 2**20 for s in r.samples], label=arm,
                         color=colour(arm), linewidth=1)
            warm = r.app.get("marks", {}).get("warmed_up")
            if warm is not None:
                for ax in (ax_rss, ax_huge):
                    ax.axvline(warm, color=colour(arm), linestyle=":", linewidth=0.7)
        ax_rss.set_title("server RSS (MiB)")
        ax_huge.set_title("server AnonHugePages (MiB)")
        for ax in (ax_rss, ax_huge):
            ax.set_xlabel("s since the server started (dotted: warm-up done)")
        ax_huge.legend(fontsize=7)
        fig.suptitle(f"{w.name}: memory over time, repetition {min(r.rep for r in first.values())}")
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.16, top=0.85, wspace=0.25)
        path = out / f"memory-{slug(w.name)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made
