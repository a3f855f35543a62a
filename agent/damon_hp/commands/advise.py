"""What transparent huge pages would cost and gain for a process, before anything changes.

Watches the process for a while through the access source `run` and `attach` use (see
--source) and changes nothing: no collapse, no madvise, no DAMOS scheme, no THP setting, no
write under /sys/kernel/mm/damon by a passive source (a vaddr or paddr kdamond of damon-hp's,
where DAMON is free, only monitors and is removed after). Reports the memory THP-always and
khugepaged would add (per kind of mapping and for the largest mappings), what the access source
saw (memory accessed, skew at 2 MiB), what THP-always, collapsing everything and damon-hp's own
rule (run dry on the same snapshots) would make huge and for how much memory, the hazards with
their fixes, and a verdict. `-- CMD` starts the command, watches it and stops it (SIGTERM)
after the watch. Exit 0 with the report, 2 for a bad input (as `attach`), 1 when the watch
failed, 130 after Ctrl-C or SIGTERM (the report of what was seen is still printed).

examples:
  damon-hp advise $(pidof redis-server)
  damon-hp advise --seconds 60 --json 1234 > advice.json
  damon-hp advise -- workloads/bin/hotcold --hot 256M --cold 1G --sparse 256M --seconds 60
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys

from damon_hp import actuate, lifecycle, procfs
from damon_hp.advise import access, choices, growth, hazards, verdict
from damon_hp.advise.watch import StopOnSignal, Watched, watch
from damon_hp.commands.attach import open_target
from damon_hp.commands.run import HeldChild
from damon_hp.damon.sources import SourceRequest, parse_source
from damon_hp.errors import DamonHpError, EnvironmentProblem
from damon_hp.ranges import HUGE_PAGE_BYTES, PAGES_PER_HUGE, AddrRange


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = 0.0
    if not 0 < v <= 24 * 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in (0, 86400]")
    return v


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=_seconds, default=None, metavar="N",
                        help="how long to watch (default: 7 aggregations of the access "
                        "source, at least 10 s and at most 120 s; said in the first line)")
    parser.add_argument("--json", action="store_true",
                        help="print every number as one JSON object on stdout instead of the "
                        "text report")
    parser.add_argument("--source", type=parse_source, default=SourceRequest(),
                        metavar="auto|vaddr|paddr|passive[=PID]",
                        help="where access data comes from, as for run and attach (default "
                        "auto: the first that works here)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    parser.add_argument("target", nargs=argparse.REMAINDER, metavar="PID | -- CMD [ARGS...]",
                        help="the process to look at, or a command to start and look at")


def _parse_target(words: list[str]) -> int | list[str]:
    if words and words[0] == "--":
        if len(words) == 1:
            raise EnvironmentProblem("damon-hp advise: no command after --; usage: damon-hp "
                                     "advise [OPTIONS] PID | -- CMD [ARGS...]")
        return words[1:]
    if len(words) != 1:
        raise EnvironmentProblem(
            "damon-hp advise: give one PID, or -- CMD [ARGS...]; got "
            + (" ".join(words) or "nothing"))
    try:
        pid = int(words[0])
    except ValueError:
        pid = 0
    if pid <= 0:
        raise EnvironmentProblem(
            f"damon-hp advise: {words[0]!r} is not a process id (a positive integer); to start "
            "a command, put it after --")
    return pid


def _options_after_pid(args: argparse.Namespace) -> list[str]:
    """`advise PID --json`: argparse's REMAINDER took the options after the PID; parse them."""
    words = list(args.target)
    parser = getattr(args, "_parser", None)
    if len(words) > 1 and words[0] != "--" and parser is not None:
        late = parser.parse_args(words[1:])  # exits 2 with usage on a bad option
        for key, value in vars(late).items():
            if key != "target" and value != parser.get_default(key):
                setattr(args, key, value)
        return [words[0], *late.target]
    return words


def main(args: argparse.Namespace) -> int:
    try:
        what = _parse_target(_options_after_pid(args))
        lifecycle.require_root("advise")
        if isinstance(what, list) and shutil.which(what[0]) is None:
            raise EnvironmentProblem(
                f"damon-hp advise: command not found or not executable: {what[0]!r}")
        target = None if isinstance(what, list) else open_target(
            what, "advise", refuse_thp_disabled=False)
    except DamonHpError as e:
        print(e, file=sys.stderr)
        return e.exit_code
    stop = StopOnSignal().install()
    try:
        if target is not None:
            return _advise_pid(target, args, stop)
        assert isinstance(what, list)
        return _advise_command(what, args, stop)
    finally:
        stop.restore()


def _say(args: argparse.Namespace):  # noqa: ANN202
    def say(text: str) -> None:
        if not args.quiet:
            print(text, file=sys.stderr, flush=True)
    return say


def _advise_pid(target: actuate.Target, args: argparse.Namespace, stop: StopOnSignal) -> int:
    try:
        command = procfs.read_cmdline(target.pid)
        rules = growth.read_kind_rules()
        seen = watch(target.pid, lambda t: not target.exited(t), args.source, args.seconds,
                     stop, rules, _say(args))
    except DamonHpError as e:
        print(lifecycle.with_vm_hint(e, sys.argv[1:]) if isinstance(e, EnvironmentProblem)
              else e, file=sys.stderr)
        return e.exit_code
    except procfs.ProcessGone:
        print(f"damon-hp advise: process {target.pid} exited", file=sys.stderr)
        return 1
    finally:
        target.close()
    return _emit(_advice(target.pid, command, seen, rules), target.pid, seen, args, stop)


def _advise_command(argv: list[str], args: argparse.Namespace, stop: StopOnSignal) -> int:
    child = HeldChild(argv)
    released = False

    def release() -> None:
        nonlocal released
        try:
            child.release()
        except EnvironmentProblem as e:  # said as `run` says it
            raise EnvironmentProblem(str(e).replace("damon-hp run:", "damon-hp advise:")) \
                from None
        released = True

    advice = None
    try:
        rules = growth.read_kind_rules()
        seen = watch(child.pid, lambda t: not child.wait(t), args.source, args.seconds,
                     stop, rules, _say(args), after_open=release)
        advice = _advice(child.pid, argv, seen, rules)  # while the command lives (its memcg)
    except DamonHpError as e:
        print(e, file=sys.stderr)
        return e.exit_code
    finally:
        if not released:
            child.abort()
        else:
            child.terminate(stop.signum or signal.SIGTERM)
    return _emit(advice, child.pid, seen, args, stop)


def _advice(pid: int, command: list[str], seen: Watched,
            rules: growth.KindRules) -> verdict.Advice | None:
    """Everything the report says, from the watch and a last look at the machine; None when
    the process's memory was never read."""
    g, status = seen.growth, seen.status
    if g is None or status is None:
        return None
    anon = [AddrRange(m.start, m.end) for m in g.mappings if m.kind == growth.ANON]
    resident = g.always_resident
    made = choices.dry_run_policy(seen.snapshots, anon, resident, seen.source.get("name", ""))
    compared = choices.compare(g, seen.tally, resident, made,
                               shmem_collapsible=rules.shmem)
    shmem_rss = g.kinds[growth.SHMEM].rss_bytes
    facts = hazards.read_facts(pid, status, shmem_rss)
    # huge pages THP-always would need that the process does not hold (at least: a range
    # resident in full on 4 KiB pages needs one too)
    new_huge = sum(r < PAGES_PER_HUGE for r in resident.values()) * HUGE_PAGE_BYTES
    found = hazards.judge(facts, pid, g.added_bytes, new_huge)
    notes = list(seen.notes)
    if seen.stopped_by != "time":
        notes.append(f"the watch ended early: {seen.stopped_by}")
    if seen.source.get("name") in ("passive", "paddr"):
        notes.append("the access picture covers private anonymous memory only (the reverse "
                     "map reads those mappings' frames)")
    return verdict.Advice(
        pid=pid, command=command, seconds=seen.seconds, source=seen.source, growth=g,
        access=access.summarize(seen.tally), choices=compared, facts=facts, hazards=found,
        notes=notes, stopped_by=seen.stopped_by,
        mappings_access=seen.tally.per_mapping([AddrRange(m.start, m.end)
                                                for m in g.mappings]))


def _emit(advice: verdict.Advice | None, pid: int, seen: Watched, args: argparse.Namespace,
          stop: StopOnSignal) -> int:
    if advice is None:
        print(f"damon-hp advise: process {pid} exited before its memory could be read "
              f"({seen.stopped_by}); nothing to report", file=sys.stderr)
        return 130 if stop.signum is not None else 1
    if args.json:
        print(json.dumps(advice.to_dict(), indent=1))
    else:
        print(verdict.format_text(advice))
    sys.stdout.flush()
    return 130 if stop.signum is not None else 0
