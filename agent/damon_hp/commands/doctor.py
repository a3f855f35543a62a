"""Check this system for what damon-hp needs, without changing anything.

One line per check: OK, LIMITED (damon-hp runs without that capability) or MISSING (damon-hp
cannot run), with what to do about it. Checks: kernel version and config options (from
/proc/config.gz or /boot/config-*, against kernel-config/damon-hp.config), DAMON sysfs, its
operations sets, every kdamond and whether damon-hp started it, whether a new kdamond can be
added now, THP settings, MADV_COLLAPSE and process_madvise (probed on scratch memory of its
own), tracefs, BTF, hardware PMU, root and capabilities.

Doctor only reads DAMON sysfs and THP settings; it never writes to them.

exit codes: 0 everything works; 1 damon-hp runs with limits (e.g. no PMU, only paddr DAMON,
or a foreign kdamond running, read through the passive source); 2 damon-hp cannot run here (a
check is MISSING: e.g. no DAMON sysfs, no access source that works, not root).
examples:
  damon-hp doctor
  damon-hp doctor --json | jq '.checks[] | select(.status != "OK")'
  damon-hp vm run -- damon-hp doctor       the same inside the test VM
"""

from __future__ import annotations

import argparse
import json
import sys

from damon_hp import doctor, kconfig


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (checks, verdict, exit_code, raw facts)")


def main(args: argparse.Namespace) -> int:
    try:
        wants = kconfig.load_fragment()
    except (OSError, ValueError) as e:
        print(f"damon-hp doctor: cannot read the option list {kconfig.FRAGMENT}: {e}",
              file=sys.stderr)
        wants = []
    facts = doctor.gather(wants)
    checks = doctor.evaluate(facts, wants)
    code = doctor.exit_code(checks)
    if args.json:
        print(json.dumps({
            "exit_code": code,
            "verdict": doctor.verdict(checks),
            "checks": [c.to_dict() for c in checks],
            "facts": facts.to_dict(),
        }, indent=1))
    else:
        print(f"damon-hp doctor: kernel {facts.release} ({facts.machine}); read-only checks")
        for c in checks:
            print(c.line())
        print(doctor.verdict(checks) + f" (exit {code})")
    return code
