"""Experiments: a declarative matrix (policies x workloads x threads x memory x repetitions),
a resumable runner, per-run metrics, analysis, plots and a Markdown report.

Data flows one way: spec (TOML) -> cells -> runner -> one JSON result per run -> analysis ->
plots + report. Only the runner and its helpers touch the system; spec, analysis and report are
pure and unit-tested on constructed records. matplotlib is imported lazily by plots.py only.
"""
