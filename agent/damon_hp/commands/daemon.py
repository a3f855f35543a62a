"""Manage every process the config's rules select, under one machine-wide huge-page budget.

A long-running service (also installed as `damon-hpd`; systemd unit in packaging/). It scans
/proc every few seconds for processes its rules select (executable, command-line pattern,
cgroup v2 path or systemd unit, user; exclude rules win), watches them through one access
stream for all (config `source`; `auto` tries, in order, one vaddr kdamond of ours with a target
per process, one paddr kdamond of ours mapped back onto each process, a foreign kdamond's
events read passively) and runs the same policy on each. Ranges of all processes compete for
the budget by expected benefit (access frequency x hot span size).

Signals: SIGHUP reloads the config (a bad one is refused with its line; the old one keeps
running); SIGTERM or SIGINT stop it, leaving no tracefs instance, no kdamond and no status
record. A summary line goes to stderr every summary_every_s (the journal under systemd);
`damon-hp status` lists every managed process. Exit 0 after a stop signal, 1 when monitoring
was lost, 2 for a bad config or an unusable system. Example config: experiments/daemon-example.toml

examples:
  damon-hp daemon --config experiments/daemon-example.toml
  damon-hp daemon --config /etc/damon-hp/daemon.toml --json /run/damon-hp/daemon.json
  damon-hp daemon --config FILE --check      only check the config and exit
"""

from __future__ import annotations

import argparse
import sys
import traceback

from damon_hp import lifecycle
from damon_hp.errors import EXIT_FAILURE, DamonHpError


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="the TOML rules and budget (see experiments/daemon-example.toml)")
    parser.add_argument("--json", metavar="FILE", dest="json_path",
                        help="keep a JSON file of the managed processes, totals and the recent "
                        "budget rounds (rewritten after every round with candidates)")
    parser.add_argument("--check", action="store_true",
                        help="check the config (and print what it selects now), then exit")


def main(args: argparse.Namespace) -> int:
    from damon_hp.daemon import reporting, selection
    from damon_hp.daemon.config import load_config
    from damon_hp.daemon.service import Service

    try:
        config = load_config(args.config)
    except DamonHpError as e:
        print(e, file=sys.stderr)
        return e.exit_code
    if args.check:
        chosen = selection.select(selection.scan(), config)
        print(f"damon-hp daemon: {args.config} is valid; it selects {len(chosen)} processes now"
              + "".join(f"\n  pid {pid}: rule {rule.name}" for pid, rule in chosen.items()))
        return 0
    try:
        lifecycle.require_root("daemon")
        lifecycle.check_outputs("daemon", {"--json": args.json_path})
    except DamonHpError as e:
        print(e, file=sys.stderr)
        return e.exit_code
    svc = Service(config, args.json_path)
    svc.install_signals()
    code = 0
    try:
        svc.start()
        why = svc.run()
        code = EXIT_FAILURE if why in lifecycle.LOST_MONITORING else 0
        print(f"damon-hpd: stopping ({why}): {reporting.summary(svc)}", file=sys.stderr, flush=True)
    except DamonHpError as e:
        print(e, file=sys.stderr)
        code = e.exit_code
    except Exception as e:  # our own bug: clean up, then say so
        traceback.print_exc()
        print(lifecycle.failure_message("daemon", e), file=sys.stderr)
        code = EXIT_FAILURE
    finally:
        try:
            svc.close()
            reporting.write_json(svc)
        finally:
            svc.restore_signals()
    return code


def hpd_main() -> int:
    """The `damon-hpd` entry point: `damon-hp daemon ARGS`."""
    from damon_hp.cli import main as cli_main

    return cli_main(["daemon", *sys.argv[1:]])
