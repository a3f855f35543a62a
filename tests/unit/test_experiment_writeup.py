"""report.md and the figures, from constructed run records."""

from __future__ import annotations

from damon_hp.experiment import spec
from damon_hp.experiment.analysis import analyse
from damon_hp.experiment.results import OOM, RunResult
from damon_hp.experiment.writeup import ReportInput, render

MiB = 2**20


def exp():
    return spec.parse({
        "experiment": {"name": "r", "repetitions": 2,
                       "arms": ["thp-never", "thp-always", "oracle"],
                       "memory": ["sufficient", "insufficient"]},
        "workloads": [{"program": "hotcold", "args": []}],
    })


def run(arm, rep, ns, memory="sufficient", status="ok", hwm=200 * MiB):
    samples = [{"t": 0.0, "rss": hwm, "anon_huge": 0, "hwm": hwm},
               {"t": 1.0, "rss": hwm, "anon_huge": 64 * MiB if arm != "thp-never" else 0,
                "hwm": hwm}]
    return RunResult(
        cell_id=f"hotcold_t1_{arm}_{memory}_r{rep}", workload="hotcold", program="hotcold",
        input=None, threads=1, arm=arm, memory=memory, rep=rep, status=status,
        wall_s=2.0, ns_per_op=ns, peak_rss_bytes=hwm, samples=samples,
        mechanism=f"how {arm} was applied",
    )


def runs():
    # thp-always is slower than thp-never here: speedup preserved must be undefined
    rs = [run("thp-never", r, 50.0 + r) for r in range(2)]
    rs += [run("thp-always", r, 60.0 + r) for r in range(2)]
    rs += [run("oracle", r, 40.0 + r) for r in range(2)]
    rs += [run("thp-always", 0, 90.0, memory="insufficient"),
           run("oracle", 0, 45.0, memory="insufficient"),
           run("thp-never", 0, 55.0, memory="insufficient", status=OOM)]
    return rs


def report(where="vm"):
    e = exp()
    cells, skipped = spec.expand(e)
    rs = runs()
    return render(ReportInput(
        experiment=e, environment={"where": where, "kernel": "6.12.95+deb12-amd64"},
        analysis=analyse(rs, list(e.arms)), runs=rs, planned=len(cells),
        command="damon-hp experiment run x.toml", skipped=skipped,
    ))


def test_undefined_speedup_is_explained_once_under_the_table():
    text = report()
    assert "undefined (1)" in text
    assert "(1) thp-always was not faster than thp-never" in text
    assert text.count("thp-always was not faster than thp-never") == 1
    # with insufficient memory thp-never only OOMed: no baseline, said so in the cell
    assert "missing runs of this arm, thp-never or thp-always" in text


def test_vm_report_says_timings_are_emulated():
    assert "emulated CPU" in report("vm")
    assert "emulated CPU" not in report("host")


def test_missing_pmu_is_stated_not_shown_as_zero():
    text = report()
    assert "TLB misses are n/a (not zero)" in text
    assert "n/a (no PMU)" in text


def test_runs_that_were_not_ok_are_listed():
    text = report()
    assert "hotcold_t1_thp-never_insufficient_r0 | oom" in text


def test_report_names_how_each_arm_was_applied():
    assert "| oracle | collapse exactly" in report()
    assert "how oracle was applied" in report()


def test_memory_pressure_section_compares_each_arm_with_itself():
    text = report()
    # thp-always: 90 / median(60, 61) ns
    assert f"| hotcold | 1 | thp-always | {90 / 60.5:.2f} |" in text


def test_figures_are_written_and_readable(tmp_path):
    from damon_hp.experiment.plots import make_plots

    rs = runs()
    figs = make_plots(analyse(rs), rs, tmp_path / "plots")
    from matplotlib import image

    paths = [p for _, p in figs["hotcold"]]
    assert len(paths) >= 4
    for p in paths:
        img = image.imread(tmp_path / p)
        assert img.shape[0] > 100 and img.shape[1] > 100


def test_time_to_hot_set_huge_says_how_many_runs_never_got_there():
    rs = runs()
    for r in rs:
        if r.arm == "oracle" and r.memory == "sufficient":
            r.hot_huge_fraction_final = 1.0 if r.rep == 0 else 0.5
            r.time_to_hot_huge_s = 0.75 if r.rep == 0 else None
        elif r.memory == "sufficient":
            r.hot_huge_fraction_final = 0.0
    e = exp()
    text = render(ReportInput(experiment=e, environment={"where": "vm"},
                              analysis=analyse(rs, list(e.arms)), runs=rs, planned=12,
                              command="x"))
    assert "| 0.75 s (1 of 2 runs; the others never) |" in text
    assert "| never (0 of 2 runs) |" in text


def test_shares_print_as_percent_without_an_exponent():
    from damon_hp.experiment.writeup import fmt_value

    assert [fmt_value(x, "%") for x in (1.0, 0.999, 0.25, 0.042, 0.0041)] == [
        "100%", "100%", "25%", "4.2%", "0.41%"]
