"""The vm tier: tests that need a real, free DAMON run inside the pinned test kernel.

On the host (DAMON_HP_IN_VM unset) no vm test body or fixture ever runs: each collected vm
test's setup, call and teardown are replaced by a lookup of its result from ONE VM run. The
VM boots lazily at the first vm test, runs `.venv/bin/pytest` on the selected vm tests inside,
and each test then passes or fails on the host with the inside failure text. A test skipped
inside the VM fails on the host: the vm tier never skips. A VM that does not boot fails every
vm test with the VM's console tail.

Inside the VM (DAMON_HP_IN_VM=1 on a virtme-ng kernel) tests run normally and each result is
written as a JSON line to $DAMON_HP_VM_RESULTS for the host to read.

Knobs (environment): DAMON_HP_VM_MEM (default 6G), DAMON_HP_VM_TIMEOUT_S (default 2700).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from damon_hp import testvm

VM_DIR = Path(__file__).resolve().parent
VM_MEMORY = os.environ.get("DAMON_HP_VM_MEM", "6G")
VM_TIMEOUT_S = float(os.environ.get("DAMON_HP_VM_TIMEOUT_S", "2700"))
RESULTS_ENV = "DAMON_HP_VM_RESULTS"


def _inside_vm() -> bool:
    return os.environ.get("DAMON_HP_IN_VM") == "1"


def _really_a_virtme_guest() -> bool:
    # DAMON_HP_IN_VM=1 exported by mistake on the host must not let vm tests loose on the
    # host's DAMON: virtme-ng's guests boot with virtme_* kernel parameters.
    try:
        return "virtme" in Path("/proc/cmdline").read_text()
    except OSError:
        return False


def _is_vm_item(item: pytest.Item) -> bool:
    return VM_DIR in Path(str(item.path)).resolve().parents


# --------------------------------------------------------------------------------------------
# Inside the VM


@pytest.fixture(scope="session", autouse=True)
def _refuse_outside_vm() -> None:
    """Last line of defence: vm fixtures and tests only ever run in the test VM."""
    if not (_inside_vm() and _really_a_virtme_guest()):
        pytest.exit(
            "tests/vm run outside the test VM (DAMON_HP_IN_VM=1 and a virtme-ng guest are "
            "required); run them from the host with `pytest tests/vm`, which boots the VM",
            returncode=2,
        )


def _record(report: pytest.TestReport | pytest.CollectReport, kind: str) -> None:
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    if isinstance(report.longrepr, tuple):  # skip: (file, line, reason)
        text = str(report.longrepr[2])
    else:
        text = report.longreprtext
    sections = "".join(f"\n----- {title} -----\n{content}" for title, content in report.sections)
    line = {
        "kind": kind,
        "nodeid": report.nodeid,
        "when": getattr(report, "when", "collect"),
        "outcome": report.outcome,
        "xfail": bool(getattr(report, "wasxfail", None)) if kind == "test" else False,
        "text": text,
        "sections": sections if report.outcome == "failed" else "",
        "duration": getattr(report, "duration", 0.0),
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _inside_vm():
        _record(report, "test")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _inside_vm() and report.failed:
        _record(report, "collect")


# --------------------------------------------------------------------------------------------
# On the host


@dataclass
class InsideResult:
    outcome: str = "passed"  # worst of setup/call/teardown: passed < skipped < failed
    texts: list[str] = field(default_factory=list)
    xfail: bool = False


@dataclass
class VmTier:
    """One VM run for the whole session, started by the first vm test that needs it."""

    session: pytest.Session
    vm_result: testvm.VmResult | None = None
    setup_error: str | None = None
    results: dict[str, InsideResult] = field(default_factory=dict)
    collect_errors: list[str] = field(default_factory=list)
    started: bool = False

    def selected_nodeids(self) -> list[str]:
        return [it.nodeid for it in self.session.items if _is_vm_item(it)]

    def inside_args(self, run_dir: Path) -> list[str]:
        # Exact nodeids, so -k, -m and file selections on the host select inside too.
        return [
            "env", f"{RESULTS_ENV}={run_dir / 'results.jsonl'}",
            str(testvm.VENV_BIN / "pytest"), "-p", "no:cacheprovider", "-v", "-ra",
            f"--junitxml={run_dir / 'junit.xml'}", *self.selected_nodeids(),
        ]

    def run(self) -> None:
        self.started = True
        capman = self.session.config.pluginmanager.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled():
            self._run_streaming()

    def _run_streaming(self) -> None:
        out = sys.stdout
        try:
            run_dir = testvm.new_run_dir()
            cmd = self.inside_args(run_dir)
            print(f"\n===== vm tier: booting the test VM (mem {VM_MEMORY}, TCG, timeout "
                  f"{VM_TIMEOUT_S:.0f} s) to run {len(self.selected_nodeids())} vm tests inside "
                  f"(command: {run_dir / 'guest.sh'})", file=out)
            out.flush()
            self.vm_result = testvm.run_in_vm(
                cmd, memory=VM_MEMORY, timeout_s=VM_TIMEOUT_S, stdout=out, stderr=out,
                run_dir=run_dir,
            )
        except testvm.DamonHpError as err:
            self.setup_error = str(err)
            print(f"===== vm tier: cannot start the VM: {err}", file=out)
            return
        r = self.vm_result
        boot = f"{r.boot_seconds:.1f} s" if r.boot_seconds is not None else "never"
        print(f"===== vm tier: VM done in {r.wall_seconds:.1f} s (booted after {boot}), inside "
              f"pytest exit {r.exit_code if r.finished else 'n/a'}; files in {r.run_dir}",
              file=out)
        self._read_results(r.run_dir / "results.jsonl")

    def _read_results(self, path: Path) -> None:
        if not path.exists():
            return
        rank = {"passed": 0, "skipped": 1, "failed": 2}
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["kind"] == "collect":
                self.collect_errors.append(f"{rec['nodeid']}:\n{rec['text']}")
                continue
            res = self.results.setdefault(rec["nodeid"], InsideResult())
            res.xfail = res.xfail or rec["xfail"]
            if rank[rec["outcome"]] > rank[res.outcome]:
                res.outcome = rec["outcome"]
            if rec["outcome"] != "passed":
                res.texts.append(f"[inside the VM, {rec['when']}: {rec['outcome']}]\n"
                                 f"{rec['text']}{rec['sections']}")

    def check(self, nodeid: str) -> None:
        if not self.started:
            self.run()
        if self.setup_error:
            pytest.fail(f"vm tier: the test VM could not be started: {self.setup_error}",
                        pytrace=False)
        r = self.vm_result
        assert r is not None
        if r.vm_failed:
            pytest.fail(f"vm tier: {r.failure_text()}", pytrace=False)
        res = self.results.get(nodeid)
        if res is None:
            errors = "\n".join(self.collect_errors) or (
                f"(no collection error recorded; see {r.run_dir}/stdout)")
            pytest.fail(f"vm tier: {nodeid} did not run inside the VM (inside pytest exit "
                        f"{r.exit_code}). Inside collection errors:\n{errors}", pytrace=False)
        if res.outcome == "failed":
            pytest.fail("\n".join(res.texts), pytrace=False)
        if res.outcome == "skipped" and not res.xfail:
            pytest.fail("vm tier: skipped inside the VM, and the vm tier never skips:\n"
                        + "\n".join(res.texts), pytrace=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    if _inside_vm():
        return
    vm_items = [it for it in session.items if _is_vm_item(it)]
    if not vm_items:
        return
    tier = VmTier(session)
    for item in vm_items:
        # Bodies and fixtures stay in the VM: the host only looks results up.
        item.setup = lambda: None  # type: ignore[method-assign]
        item.teardown = lambda: None  # type: ignore[method-assign]
        item.runtest = lambda nodeid=item.nodeid: tier.check(nodeid)  # type: ignore[method-assign]
        # The whole VM run happens inside the first test's call.
        item.add_marker(pytest.mark.timeout(VM_TIMEOUT_S + 120))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """On the host, skip/skipif marks of vm tests are the VM's to judge, not the host's:
    `skipif(not in_vm())` must not turn the tier into host skips."""
    try:
        return (yield)
    except pytest.skip.Exception:
        if _inside_vm() or not _is_vm_item(item):
            raise
        return None
