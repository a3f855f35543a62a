"""Every command's --help runs, and what it says about exit codes is what the command does.

The commands come from `damon-hp --help` itself, so a new command without a help (or one whose
help crashes) fails here. For each help that states an exit code, one case of that statement is
run on this host and its exit code compared: a help text is a promise like the README's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
DAMON_HP = str(BIN / "damon-hp")


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def commands() -> list[str]:
    """The COMMAND list of `damon-hp --help` (argparse's subparser listing)."""
    out = run(DAMON_HP, "--help").stdout
    listing = out.split("positional arguments:")[1].split("options:")[0]
    return re.findall(r"^ {4}(\w[\w-]*)", listing, flags=re.M)


COMMANDS = ["doctor", "run", "attach", "advise", "status", "trace", "vm", "daemon", "experiment"]
SUBCOMMANDS = [("vm", "run"), ("vm", "shell"), ("experiment", "run"), ("experiment", "report")]


def test_the_top_level_help_lists_every_command_and_a_bad_one_exits_2() -> None:
    top = run(DAMON_HP, "--help")
    assert top.returncode == 0 and "exit codes: 0 ok, 1 runtime failure, 2 usage" in top.stdout
    assert sorted(commands()) == sorted(COMMANDS), "a command was added or removed: list it"
    bad = run(DAMON_HP, "no-such-command")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr, bad.stderr


@pytest.mark.parametrize("argv", [[c] for c in COMMANDS] + [list(s) for s in SUBCOMMANDS],
                         ids=lambda a: " ".join(a))
def test_every_command_has_a_help_that_runs(argv: list[str]) -> None:
    r = run(DAMON_HP, *argv, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: damon-hp {' '.join(argv)}"), r.stdout[:200]
    assert "Traceback" not in r.stdout + r.stderr
    # more than argparse's bare option list: a sentence of what it does
    assert len(r.stdout.split("\n\n")[1].strip()) > 20, r.stdout


def test_damon_hpd_help_is_the_daemon_help() -> None:
    r = run(str(BIN / "damon-hpd"), "--help")
    assert r.returncode == 0 and "--config FILE" in r.stdout, r.stdout
    assert "Exit 0 after a stop signal" in r.stdout


def exit_code_text(help_text: str) -> dict[int, str]:
    """doctor's `exit codes:` paragraph as {code: what it says about that code}."""
    para = help_text.split("exit codes:")[1].split("examples:")[0]
    para = " ".join(para.split())
    return {int(code): text.strip(" ;")
            for code, text in re.findall(r"(\d) (.*?)(?=; \d |$)", para)}


def test_doctor_exit_code_on_this_host_is_the_one_its_help_gives_for_what_it_found(
        foreign_kdamond) -> None:
    """This host runs a foreign paddr kdamond and has no vaddr: damon-hp runs through the
    passive source with limits, so doctor exits 1, and its help must say that 1 is what a
    foreign kdamond gives (it once said 2)."""
    said = exit_code_text(run(DAMON_HP, "doctor", "--help").stdout)
    assert set(said) == {0, 1, 2}, said
    r = run(DAMON_HP, "doctor", "--json")
    report = json.loads(r.stdout)
    statuses = {c["status"] for c in report["checks"]}
    assert r.returncode == report["exit_code"]
    # the rule the help states: 2 if a check is MISSING, else 1 if LIMITED, else 0
    assert r.returncode == (2 if "MISSING" in statuses else 1 if "LIMITED" in statuses else 0)
    assert r.returncode == 1, report["verdict"]  # the passive source works here
    assert "foreign kdamond" in said[1] and "foreign kdamond" not in said[2], said
    assert "MISSING" in said[2]


def test_run_exits_with_the_commands_exit_code_as_its_help_says(tmp_path) -> None:
    assert "exits with the command's exit code" in run(DAMON_HP, "run", "--help").stdout
    r = subprocess.run([DAMON_HP, "run", "-q", "--", "sh", "-c", "exit 3"], capture_output=True,
                       text=True, timeout=180,
                       env={**os.environ, "DAMON_HP_RUN_DIR": str(tmp_path)})
    assert r.returncode == 3, r.stderr


@pytest.mark.parametrize("argv,claim", [
    (["attach", "1"], "Refused (exit 2): PID 1"),
    (["trace", "--pid", "999999999"], "2 usage or environment error"),
    (["daemon", "--config", "/nonexistent/damon-hpd.toml"], "2 for a bad config"),
    (["experiment", "run", "/nonexistent/x.toml"], "2 bad experiment file"),
], ids=lambda a: a if isinstance(a, str) else " ".join(a))
def test_a_refusal_exits_2_as_the_commands_help_says(argv: list[str], claim: str) -> None:
    help_text = " ".join(run(DAMON_HP, argv[0], "--help").stdout.split())
    assert claim in help_text, help_text
    r = run(DAMON_HP, *argv)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.strip(), r.stderr
