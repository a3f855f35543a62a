"""Command line: argument parsing and dispatch only; each subcommand lives in commands/."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module under damon_hp.commands, one-line help). Modules are imported lazily so
# one broken or slow import never stops `damon-hp doctor` from running.
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("doctor", "check this system for what damon-hp needs (read-only)"),
    "run": ("run", "start a command and back its hot memory with huge pages until it exits"),
    "attach": ("attach", "manage a running process's hot memory until it exits or you stop"),
    "advise": ("advise", "what huge pages would cost and gain for a process (read-only)"),
    "status": ("status", "list running damon-hp agents, their targets and what they did"),
    "trace": ("trace", "count huge-page, fault, compaction and TLB events with BPF (hpstat)"),
    "vm": ("vm", "boot the pinned test kernel with virtme-ng and run a command inside"),
    "daemon": ("daemon", "manage every process the config's rules select, under one budget"),
    "experiment": ("experiment", "run an experiment matrix (arms x workloads) and report it"),
}

EPILOG = """\
exit codes: 0 ok, 1 runtime failure, 2 usage or environment error.
examples:
  damon-hp doctor                       what works here, and what to do about what doesn't
  damon-hp run -- ./workloads/bin/gups --size 1G
  damon-hp attach 1234                  manage PID 1234 until it exits or Ctrl-C
  damon-hp vm run -- damon-hp doctor    the same check inside the test VM
"""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, just that subcommand's module is imported (the others
    are listed by name and help), which saves seconds of imports in the emulated test VM."""
    parser = argparse.ArgumentParser(
        prog="damon-hp",
        description="Watch a process's memory with DAMON and back only its hot ranges "
        "(>= 2 MiB) with transparent huge pages.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_text)
            continue
        mod = importlib.import_module(f"damon_hp.commands.{module}")
        p = sub.add_parser(
            name,
            help=help_text,
            description=(mod.__doc__ or help_text).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.set_argparser(p)
        p.set_defaults(_main=mod.main, _parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in args_in if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the subcommand's parser, with its usage (exits 2)
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "_main", None):
        parser.print_help(sys.stderr)
        print(f"\ndamon-hp: no command given; choose one of {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    try:
        return int(args._main(args) or 0)
    except KeyboardInterrupt:
        print("damon-hp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
