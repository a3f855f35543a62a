"""The bad-input matrix: every subcommand and the experiment file, fed wrong input.

One table, one parametrized test. Each case checks the exit code (2 for usage and
environment errors unless the table says otherwise), that stderr names what failed (the
`says` fragments), that no Python traceback escaped, and that nothing was left on the system:
no kdamond changed, no tracefs instance of the damon-hp process, no file (status record,
kdamond record, --json output, experiment directory) in the case's scratch directory, no
process left in its session, no damon-hp cgroup, THP settings as they were.

Runs on the host; the non-root cases use setpriv to become nobody. Nothing here needs DAMON to
be free: every case is refused before (or, for the exec-format case, cleaned up after) the
agent starts. `BAD_INPUTS_TRIED` counts the cases that passed every check (printed at the end
of the module's run).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from leftovers import instances_of, kdamond_states, session_members
from thp_settings import thp_settings

ROOT = Path(__file__).resolve().parents[2]
DAMON_HP = str(Path(sys.executable).parent / "damon-hp")
ADMIN = Path("/sys/kernel/mm/damon/admin")
INSTANCES = Path("/sys/kernel/tracing/instances")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def as_nobody(argv: list[str], stash: Path) -> list[str]:
    """`argv` run as uid 65534, with the project reachable although the clone may sit below a
    mode-0700 folder (a home, a mktemp -d: CI's case). In a private mount namespace the
    topmost such folder is covered by an empty 0755 tmpfs and the project is bind-mounted back
    at its own path, so nobody runs the same files at the same paths; the host is unchanged."""
    blocked = [p for p in ROOT.parents if not p.stat().st_mode & 0o001]
    if not blocked:
        return [*NOBODY, *argv]
    top = blocked[-1]
    script = (f'mount --bind "{ROOT}" "{stash}" && '
              f'mount -t tmpfs -o mode=0755 damon-hp-test "{top}" && '
              f'mkdir -p "{ROOT}" && mount --bind "{stash}" "{ROOT}" && '
              'exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            *NOBODY, *argv]

BAD_INPUTS_TRIED: list[str] = []


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]  # after `damon-hp`; {pid} {exited} {zombie} {tid} {thpoff} {tmp} {nopid}
    # filled in
    says: list[str]  # fragments stderr must contain
    code: int = 2
    nobody: bool = False  # run as uid/gid 65534
    env: dict[str, str] = field(default_factory=dict)  # {tmp} filled in


TOML_HEAD = '[experiment]\nname = "t"\nwhere = "host"\nrepetitions = 1\n'
GOOD_ARMS = 'arms = ["thp-never"]\nmemory = ["sufficient"]\n'
HOTCOLD = '[[workloads]]\nprogram = "hotcold"\nargs = ["--seconds", "1"]\n'
EXPERIMENT_FILES = {
    "bad.toml": "this is [not toml\n",
    "unknown-workload.toml": TOML_HEAD + GOOD_ARMS
    + '[[workloads]]\nprogram = "nosuchprog"\nargs = ["--x"]\n',
    "unknown-arm.toml": TOML_HEAD + 'arms = ["thp-nope"]\nmemory = ["sufficient"]\n' + HOTCOLD,
    "no-experiment.toml": HOTCOLD,
    "zero-repetitions.toml": TOML_HEAD.replace("repetitions = 1", "repetitions = 0")
    + GOOD_ARMS + HOTCOLD,
    "unknown-key.toml": TOML_HEAD + GOOD_ARMS + "colour = 3\n" + HOTCOLD,
    "bad-where.toml": TOML_HEAD.replace('"host"', '"mars"') + GOOD_ARMS + HOTCOLD,
    "workload-without-args.toml": TOML_HEAD + GOOD_ARMS + '[[workloads]]\nprogram = "hotcold"\n',
    "no-workloads.toml": TOML_HEAD + GOOD_ARMS,
}


def exp(file: str, *more: str) -> list[str]:
    return ["experiment", "run", f"{{tmp}}/{file}", "--out", "{tmp}/out", *more]


CASES = [
    # the command line itself
    Case("no-command", [], ["no command given", "choose one of"]),
    Case("unknown-command", ["bogus"], ["invalid choice: 'bogus'"]),
    Case("unknown-global-flag", ["--bogus"], ["unrecognized arguments: --bogus"]),
    # run
    Case("run-unknown-flag", ["run", "--bogus", "--", "true"],
         ["damon-hp run: error: unrecognized arguments: --bogus"]),
    Case("run-no-command", ["run"], ["no command given", "damon-hp run [OPTIONS] -- CMD"]),
    Case("run-flag-without-value", ["run", "--json"], ["argument --json: expected one argument"]),
    Case("run-not-a-number", ["run", "--hot-pct", "abc", "--", "true"],
         ["argument --hot-pct: invalid float value: 'abc'"]),
    Case("run-percent-out-of-range", ["run", "--hot-pct", "150", "--", "true"],
         ["bad option", "hot_access_pct must be within 0..100"]),
    Case("run-bad-size", ["run", "--max-huge", "lots", "--", "true"],
         ["'lots' is not a size", "256M"]),
    Case("run-bad-budget-percent", ["run", "--max-huge", "150%", "--", "true"],
         ["percentage of RSS must be 0..100%"]),
    Case("run-zero-count", ["run", "--promote-after", "0", "--", "true"],
         ["--promote-after", "is not a positive integer"]),
    Case("run-negative-seconds", ["run", "--progress-s", "-1", "--", "true"],
         ["--progress-s", "not a non-negative number"]),
    Case("run-too-few-regions", ["run", "--min-regions", "2", "--", "true"],
         ["need 3 <= --min-regions (2)"]),
    Case("run-sample-longer-than-aggregation",
         ["run", "--sample-us", "500000", "--aggr-us", "400000", "--", "true"], ["sample_us"]),
    Case("run-unknown-source", ["run", "--source", "bogus", "--", "true"], ["is not a source"]),
    Case("run-pid-on-own-source", ["run", "--source", "vaddr=7", "--", "true"],
         ["only passive takes a kdamond pid"]),
    Case("run-passive-no-such-kdamond", ["run", "--source", "passive={nopid}", "--", "true"],
         ["no running kdamond has pid", "running:"]),
    Case("run-command-not-found", ["run", "--", "/nonexistent/program"],
         ["command not found or not executable: '/nonexistent/program'"]),
    Case("run-command-not-executable", ["run", "--", "{tmp}/not-executable"],
         ["not executable", "not-executable"]),
    Case("run-command-is-a-directory", ["run", "--", "{tmp}/a-directory"], ["not executable"]),
    Case("run-command-exec-format-error", ["run", "-q", "--", "{tmp}/garbage"],
         ["cannot execute", "Exec format error"]),
    Case("run-json-directory-missing", ["run", "--json", "{tmp}/no/such/out.json", "--", "true"],
         ["cannot write --json", "does not exist"]),
    Case("run-json-is-a-directory", ["run", "--json", "{tmp}/a-directory", "--", "true"],
         ["cannot write --json", "it is a directory"]),
    Case("run-json-under-proc", ["run", "--json", "/proc/damon-hp-out.json", "--", "true"],
         ["cannot write --json /proc/damon-hp-out.json"]),
    Case("run-record-parent-is-a-file", ["run", "--record", "{tmp}/garbage/x.json", "--", "true"],
         ["cannot write --record", "is not a directory"]),
    Case("run-not-root", ["run", "--", "true"], ["needs root", "sudo"], nobody=True),
    # attach
    Case("attach-no-pid", ["attach"], ["the following arguments are required: PID"]),
    Case("attach-pid-not-a-number", ["attach", "--", "abc"], ["'abc' is not a process id"]),
    Case("attach-pid-zero", ["attach", "--", "0"], ["'0' is not a process id"]),
    Case("attach-pid-negative", ["attach", "--", "-5"], ["'-5' is not a process id"]),
    Case("attach-two-pids", ["attach", "{pid}", "{pid}"], ["unrecognized arguments"]),
    Case("attach-pid-never-existed", ["attach", "{nopid}"], ["no process {nopid}", "ps -p"]),
    Case("attach-pid-exited", ["attach", "{exited}"], ["no process {exited}"]),
    Case("attach-zombie", ["attach", "{zombie}"], ["process {zombie} has already exited"]),
    Case("attach-pid-1", ["attach", "1"], ["refusing PID 1"]),
    Case("attach-kernel-thread", ["attach", "2"], ["2 (kthreadd) is a kernel thread"]),
    Case("attach-thread-id", ["attach", "{tid}"], ["{tid} is a thread of process {pid}",
                                                   "damon-hp attach {pid}"]),
    Case("attach-bad-option", ["attach", "--demote-after", "-3", "{pid}"],
         ["--demote-after", "not a non-negative number"]),
    Case("attach-json-directory-missing", ["attach", "--json", "{tmp}/no/out.json", "{pid}"],
         ["cannot write --json", "does not exist"]),
    Case("attach-not-root", ["attach", "{pid}"], ["needs root"], nobody=True),
    Case("attach-thp-disabled-by-the-process", ["attach", "--json", "{tmp}/out.json", "{thpoff}"],
         ["process {thpoff} has turned transparent huge pages off for itself",
          "THP_enabled: 0", "PR_THP_DISABLE_EXCEPT_ADVISED", "Not attached."]),
    # advise (read-only; a process that turned THP off is looked at, not refused)
    Case("advise-no-target", ["advise"], ["give one PID, or -- CMD", "got nothing"]),
    Case("advise-pid-not-a-number", ["advise", "abc"], ["'abc' is not a process id",
                                                        "put it after --"]),
    Case("advise-pid-zero", ["advise", "0"], ["'0' is not a process id"]),
    Case("advise-two-pids", ["advise", "{pid}", "{pid}"], ["give one PID"]),
    Case("advise-pid-never-existed", ["advise", "{nopid}"], ["no process {nopid}", "ps -p"]),
    Case("advise-pid-exited", ["advise", "{exited}"], ["no process {exited}"]),
    Case("advise-zombie", ["advise", "{zombie}"], ["process {zombie} has already exited"]),
    Case("advise-pid-1", ["advise", "1"], ["damon-hp advise: refusing PID 1"]),
    Case("advise-kernel-thread", ["advise", "2"], ["2 (kthreadd) is a kernel thread"]),
    Case("advise-thread-id", ["advise", "{tid}"], ["{tid} is a thread of process {pid}",
                                                   "damon-hp advise {pid}"]),
    Case("advise-bad-seconds", ["advise", "--seconds", "-3", "{pid}"],
         ["--seconds", "is not a number of seconds"]),
    Case("advise-unknown-option-after-pid", ["advise", "{pid}", "--bogus"],
         ["unrecognized arguments: --bogus"]),
    Case("advise-unknown-source", ["advise", "--source", "bogus", "{pid}"],
         ["is not a source"]),
    Case("advise-no-command", ["advise", "--"], ["no command after --"]),
    Case("advise-command-not-found", ["advise", "--", "/nonexistent/program"],
         ["damon-hp advise: command not found or not executable: '/nonexistent/program'"]),
    Case("advise-command-exec-format-error", ["advise", "-q", "--", "{tmp}/garbage"],
         ["damon-hp advise: cannot execute", "Exec format error"]),
    Case("advise-not-root", ["advise", "{pid}"], ["damon-hp advise: needs root"], nobody=True),
    # status
    Case("status-extra-argument", ["status", "extra"],
         ["damon-hp status: error: unrecognized arguments: extra"]),
    Case("status-unknown-flag", ["status", "--bogus"], ["unrecognized arguments: --bogus"]),
    Case("status-private-run-dir-not-root", ["status"],
         ["may not read the status records", "run damon-hp status as root"], nobody=True,
         env={"DAMON_HP_RUN_DIR": "{tmp}/private"}),
    Case("status-run-dir-is-a-file", ["status"], ["is not a directory", "DAMON_HP_RUN_DIR"],
         env={"DAMON_HP_RUN_DIR": "{tmp}/garbage"}),
    Case("status-corrupt-record", ["status"], ["ignored", "agent-7.json",
                                               "not a status record"], code=0,
         env={"DAMON_HP_RUN_DIR": "{tmp}/corrupt"}),
    # doctor
    Case("doctor-extra-argument", ["doctor", "extra"], ["unrecognized arguments: extra"]),
    Case("doctor-not-root", ["doctor"], [], nobody=True),  # its report goes to stdout
    # trace
    Case("trace-pid-not-a-number", ["trace", "--pid", "abc"],
         ["argument --pid/-p: invalid int value: 'abc'"]),
    Case("trace-pid-zero", ["trace", "--pid", "0"], ["--pid 0: expected a positive process id"]),
    Case("trace-pid-exited", ["trace", "--pid", "{exited}", "-d", "1"],
         ["no process with PID {exited}"]),
    Case("trace-interval-zero", ["trace", "-i", "0"], ["'0' must be more than 0 seconds"]),
    Case("trace-duration-not-a-number", ["trace", "-d", "abc"],
         ["'abc' is not a number of seconds"]),
    Case("trace-json-and-table", ["trace", "--json", "--table"],
         ["argument --table: not allowed with argument --json"]),
    Case("trace-not-root", ["trace", "-d", "1"], ["BPF is not permitted", "as root"],
         nobody=True),
    # experiment and its file
    Case("experiment-no-action", ["experiment"], ["say `run FILE` or `report DIR`"]),
    Case("experiment-unknown-action", ["experiment", "bogus"], ["invalid choice: 'bogus'"]),
    Case("experiment-run-no-file", ["experiment", "run"],
         ["the following arguments are required: file"]),
    Case("experiment-file-missing", exp("nofile.toml"),
         ["cannot read experiment file", "No such file or directory", "experiments/smoke.toml"]),
    Case("experiment-file-is-a-directory", exp("a-directory"), ["Is a directory"]),
    Case("experiment-file-unreadable-not-root", exp("bad.toml"), ["Permission denied"],
         nobody=True),
    Case("experiment-file-invalid-toml", exp("bad.toml"), ["bad.toml: not valid TOML", "line 1"]),
    Case("experiment-unknown-workload", exp("unknown-workload.toml"),
         ["no program nosuchprog", "built: "]),
    Case("experiment-unknown-arm", exp("unknown-arm.toml"),
         ["unknown value 'thp-nope'", "choose from thp-never"]),
    Case("experiment-no-experiment-table", exp("no-experiment.toml"), ["[experiment]", "missing"]),
    Case("experiment-zero-repetitions", exp("zero-repetitions.toml"),
         ["repetitions", "must be an integer >= 1"]),
    Case("experiment-unknown-key", exp("unknown-key.toml"), ["unknown keys ['colour']"]),
    Case("experiment-bad-where-in-file", exp("bad-where.toml"), ["[experiment].where", "'mars'"]),
    Case("experiment-bad-where-flag", exp("bad.toml", "--where", "mars"),
         ["argument --where: invalid choice: 'mars'"]),
    Case("experiment-workload-without-args", exp("workload-without-args.toml"),
         ["give exactly one of 'input'"]),
    Case("experiment-no-workloads", exp("no-workloads.toml"), ["at least one workload"]),
    Case("experiment-report-not-an-experiment", ["experiment", "report", "{tmp}/a-directory"],
         ["is not an experiment directory", "--out directory"]),
    # vm
    Case("vm-no-action", ["vm"], ["say `run -- CMD ...` or `shell`"]),
    Case("vm-unknown-action", ["vm", "bogus"], ["invalid choice: 'bogus'"]),
    Case("vm-run-no-command", ["vm", "run"], ["no command given"]),
    Case("vm-run-bad-memory", ["vm", "run", "--mem", "6X", "--", "true"],
         ["'6X' is not a memory size", "6G"]),
    Case("vm-run-zero-cpus", ["vm", "run", "--cpus", "0", "--", "true"],
         ["'0' is not a number of vCPUs"]),
    Case("vm-run-cpus-not-a-number", ["vm", "run", "--cpus", "abc", "--", "true"],
         ["'abc' is not a number of vCPUs"]),
    Case("vm-run-negative-timeout", ["vm", "run", "--timeout", "-5", "--", "true"],
         ["'-5' is not a number of seconds >= 0"]),
    Case("vm-shell-bad-memory", ["vm", "shell", "--mem", "lots"], ["'lots' is not a memory size"]),
]


# --------------------------------------------------------------------------------------------
# the system's state that no bad input may change




def damon_hp_cgroups() -> list[str]:
    root = Path("/sys/fs/cgroup")
    return sorted(str(p) for p in [*root.glob("damon-hp*"), *root.glob("*/damon-hp*")])






def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def system_state() -> dict[str, object]:
    return {"kdamonds": kdamond_states(), "thp": thp_settings(), "cgroups": damon_hp_cgroups()}


# --------------------------------------------------------------------------------------------
# targets and files the cases refer to


@pytest.fixture(scope="module")
def targets() -> Iterator[dict[str, str]]:
    """A live process with a second thread, an exited (reaped) pid, a zombie, a pid that can
    never exist, a live process that turned THP off for itself (PR_SET_THP_DISABLE)."""
    live = subprocess.Popen(
        [sys.executable, "-c", "import threading, time\n"
         "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
         "time.sleep(600)"])
    thpoff = subprocess.Popen([sys.executable, str(Path(__file__).with_name("thp_prctl.py")),
                               "off", "--", "sleep", "600"])
    zombie = subprocess.Popen(["true"])
    exited = subprocess.Popen(["true"])
    exited.wait()
    try:
        deadline = time.monotonic() + 30
        tids: list[str] = []
        while time.monotonic() < deadline:
            tids = [t for t in os.listdir(f"/proc/{live.pid}/task") if t != str(live.pid)]
            if tids:
                break
            time.sleep(0.05)
        assert tids, "the helper's second thread never started"
        while Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline, "`true` never became a zombie"
            time.sleep(0.05)
        while "THP_enabled:\t0" not in Path(f"/proc/{thpoff.pid}/status").read_text():
            assert time.monotonic() < deadline, "thp_prctl.py never disabled THP"
            time.sleep(0.05)
        yield {"pid": str(live.pid), "tid": tids[0], "exited": str(exited.pid),
               "zombie": str(zombie.pid), "thpoff": str(thpoff.pid),
               "nopid": str(int(Path("/proc/sys/kernel/pid_max").read_text()) + 1)}
    finally:
        for proc in (live, thpoff):
            proc.kill()
            proc.wait()
        zombie.wait()


def prepare(tmp: Path) -> None:
    (tmp / "run").mkdir()  # DAMON_HP_RUN_DIR, as /run/damon-hp exists once damon-hp ran
    (tmp / "a-directory").mkdir()
    (tmp / "not-executable").write_text("#!/bin/sh\nexit 0\n")
    (tmp / "not-executable").chmod(0o644)
    (tmp / "garbage").write_bytes(b"\x00\x01 not a program\n")
    (tmp / "garbage").chmod(0o755)
    for name, text in EXPERIMENT_FILES.items():
        (tmp / name).write_text(text)
    (tmp / "private").mkdir(mode=0o700)
    (tmp / "corrupt").mkdir()
    (tmp / "corrupt" / "agent-7.json").write_text('{"agent_pid": "seven"}\n')


def fill(text: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        text = text.replace("{" + k + "}", v)
    return text


@pytest.fixture(scope="module", autouse=True)
def _tally(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    say(request, f"bad-input matrix: {len(BAD_INPUTS_TRIED)} of {len(CASES)} bad inputs tried "
        "and passed (exit code, message, no traceback, nothing left behind)")


def say(request: pytest.FixtureRequest, line: str) -> None:
    """A line on the terminal, past pytest's output capture."""
    plugins = request.config.pluginmanager
    reporter, capman = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capman is not None:
        with capman.global_and_fixture_disabled():
            reporter.write_line("\n" + line)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_with_a_message_and_changes_nothing(
        case: Case, targets: dict[str, str], tmp_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    if case.nobody and shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed for the non-root cases")
    prepare(tmp_path)
    values = {**targets, "tmp": str(tmp_path)}
    argv = [fill(a, values) for a in case.argv]
    env = {**os.environ, "DAMON_HP_RUN_DIR": str(tmp_path / "run")}
    env.update({k: fill(v, values) for k, v in case.env.items()})
    files_before = tree(tmp_path)
    before = system_state()
    command = [DAMON_HP, *argv]
    if case.nobody:
        stash = tmp_path_factory.mktemp("stash")
        command = as_nobody(command, stash)
    proc = subprocess.Popen(command, cwd=ROOT,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == case.code, f"exit {proc.returncode}\nstderr:\n{err}\nstdout:\n{out}"
    for fragment in case.says:
        assert fill(fragment, values) in err, err
    assert "Traceback" not in err + out, err
    assert session_members(proc.pid, with_leader=False) == [], "a process of the case outlived it"
    assert instances_of(proc.pid) == [], "a tracefs instance was left"
    assert tree(tmp_path) == files_before, "a file was created (record, output, directory)"
    assert system_state() == before
    if case.id == "doctor-not-root":
        assert "MISSING  root" in out and "run damon-hp as root" in out, out
    BAD_INPUTS_TRIED.append(case.id)


def test_the_matrix_covers_every_subcommand() -> None:
    covered = {c.argv[0] if c.argv else "" for c in CASES}
    assert {"run", "attach", "advise", "status", "doctor", "trace", "experiment",
            "vm"} <= covered
    assert len({c.id for c in CASES}) == len(CASES)
