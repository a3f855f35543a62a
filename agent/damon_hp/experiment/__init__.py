"""Experiments: a declarative matrix (arms x workloads x threads x memory x repetitions),
a resumable runner, per-run metrics, analysis, plots and a Markdown report.

Data flows one way: spec (TOML) -> cells -> runner -> one JSON result per run -> analysis ->
plots + report.md (writeup.py; damon_hp/report.py is the agent's own run summary). An arm
(arms.py) is one way of backing memory that the experiment compares: thp-never, damos-ethp,
damon-hp, oracle, ... ("policy" in damon_hp means the agent's decision rule, policy.py). Only the
runner and its helpers touch the system; spec, analysis and writeup are pure and unit-tested on
constructed records. matplotlib is imported lazily by plots.py only.
"""
