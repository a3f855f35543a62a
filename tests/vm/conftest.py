"""The vm tier: tests that need a real, free DAMON run inside the pinned test kernel.

Two pinned kernels (kernel-config/README.md): the main one (Debian's 7.3, DAMON_STAT monitoring
from boot, THP `always`) and the lts one (6.12). Which tests run on which is the plan
(DAMON_HP_VM_PLAN, below `VM_PLAN`): `make test` runs the full plan, every test on 7.3 and
the core ones (`both_kernels`: vaddr agent, passive source, daemon, clean-up after SIGKILL) on
6.12 too; the lts plan runs every test on 6.12 and those that need 7.3 (DAMON_STAT, DAMOS
collapse: marked `damon_stat_on` or `main_kernel`) on 7.3.
Each test is parametrized by the kernel it runs on, so its id says so: `test_x[k7.3]`,
`test_x[k6.12]`; inside the VM the `vm_kernel` fixture fails a test whose kernel is not the
one running.

On the host (DAMON_HP_IN_VM unset) no vm test body or fixture ever runs: each collected vm
test's setup, call and teardown are replaced by a lookup of its result from ONE VM run per
kernel. A kernel's VM boots lazily at its first vm test, runs `.venv/bin/pytest` on that
kernel's selected vm tests inside, and each test then passes or fails on the host with the
inside failure text. A test skipped inside the VM fails on the host: the vm tier never skips.
A VM that does not boot fails every vm test of its kernel with the VM's console tail.

DAMON_STAT (7.3): its kdamond is exclusive, so no sysfs kdamond starts while it runs. Every
test gets it OFF (/sys/module/damon_stat/parameters/enabled, the VM is throwaway) unless it is
marked `damon_stat_on`, which gets it running as booted.

Inside the VM (DAMON_HP_IN_VM=1 on a virtme-ng kernel) tests run normally and each result is
written as a JSON line to $DAMON_HP_VM_RESULTS for the host to read.

Knobs (environment): DAMON_HP_VM_MEM (default 6G), DAMON_HP_VM_TIMEOUT_S (default 2700),
DAMON_HP_VM_PLAN (full or lts, default full).
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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "both_kernels: a core vm test, run on the lts test kernel (6.12) as well as "
        "the main one")
    config.addinivalue_line(
        "markers", "damon_stat_on: the test needs DAMON_STAT running (as the main kernel "
        "boots); every other vm test gets it stopped")
    config.addinivalue_line(
        "markers", "fresh_damon_stat: DAMON_STAT is restarted before the test, so its "
        "auto-tuned intervals start where they do at boot (test_damon_stat.py says why)")
    config.addinivalue_line(
        "markers", "main_kernel: the test needs what only the main kernel (7.3) has (DAMOS "
        "collapse, DAMON_STAT); it runs there in every plan")
    config.addinivalue_line(
        "markers", "lts_only(reason): the test runs on the lts kernel (6.12) in every plan, "
        "for the reason given")


def _kernel_param_id(name: str) -> str:
    return f"k{testvm.pinned_kernel(name).series}"


# Which kernels a vm test runs on (DAMON_HP_VM_PLAN):
#   full (the default, what `make test` runs): every test on the main kernel (7.3), those
#       marked `both_kernels` on the lts kernel (6.12) too;
#   lts (by hand: the whole tier on 6.12, the kernel most machines run): every test on the lts
#       kernel, tests that need the main kernel (`damon_stat_on`, `main_kernel`) on it only,
#       or on both where they are marked `both_kernels` too.
# `full` became the default once its fresh-clone failures of 2026-11-26 had causes: the pause-
# after-SIGKILL test's 10 s of EBUSY was the agent holding DAMON sysfs's lock (fixed in the
# vaddr source), DAMON_STAT's passive test missing its bound after 40 other tests is why the
# DAMON_STAT tests run first (pytest_collection_modifyitems), and the 7.3 guest lost in the
# smoke experiment is why that test is `lts_only` (tests/README.md).
VM_PLAN = os.environ.get("DAMON_HP_VM_PLAN", "full")


def _kernels_for(definition: pytest.Function) -> list[str]:
    if VM_PLAN not in ("full", "lts"):
        raise pytest.UsageError(f"DAMON_HP_VM_PLAN={VM_PLAN!r}: use full (the default) or lts")
    lts = [n for n in testvm.PIN_FILES if n != testvm.MAIN_KERNEL]
    needs_main = (definition.get_closest_marker("damon_stat_on")
                  or definition.get_closest_marker("main_kernel"))
    if definition.get_closest_marker("lts_only"):
        return lts
    if VM_PLAN == "full":
        return [testvm.MAIN_KERNEL] + (lts if definition.get_closest_marker("both_kernels")
                                       else [])
    if needs_main:
        return [testvm.MAIN_KERNEL] + (lts if definition.get_closest_marker("both_kernels")
                                       else [])
    return lts


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The kernels of VM_PLAN; the test id says which (`[k7.3]`, `[k6.12]`)."""
    if "vm_kernel" not in metafunc.fixturenames:
        return
    names = _kernels_for(metafunc.definition)
    metafunc.parametrize("vm_kernel", names, ids=[_kernel_param_id(n) for n in names],
                         indirect=True)


def _item_kernel(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("vm_kernel", testvm.MAIN_KERNEL) if callspec else testvm.MAIN_KERNEL


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


DAMON_STAT_ENABLED = Path("/sys/module/damon_stat/parameters/enabled")


def damon_stat_running() -> bool:
    try:
        return DAMON_STAT_ENABLED.read_text().strip() == "Y"
    except OSError:
        return False


def set_damon_stat(on: bool) -> None:
    """Start or stop DAMON_STAT (VM only) and wait until its kdamond is (not) running."""
    if not DAMON_STAT_ENABLED.exists():
        if on:
            pytest.fail("this kernel has no DAMON_STAT (/sys/module/damon_stat missing)")
        return
    if damon_stat_running() != on:
        DAMON_STAT_ENABLED.write_text("Y" if on else "N")
    if damon_stat_running() != on:
        pytest.fail(f"DAMON_STAT did not turn {'on' if on else 'off'}: "
                    f"{DAMON_STAT_ENABLED} reads {DAMON_STAT_ENABLED.read_text().strip()!r}")


@pytest.fixture(autouse=True)
def vm_kernel(request: pytest.FixtureRequest) -> str:
    """The pinned kernel this test is for (its id says which); fails on any other kernel.

    Also gives the test the DAMON_STAT state it asks for (see the module docstring)."""
    name = getattr(request, "param", testvm.MAIN_KERNEL)
    if _inside_vm():
        want = testvm.pinned_kernel(name).release
        if os.uname().release != want:
            pytest.fail(f"this test is for the {name} kernel {want}, but the VM runs "
                        f"{os.uname().release}")
        set_damon_stat(request.node.get_closest_marker("damon_stat_on") is not None)
    return name


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
    """One VM run of one kernel for the whole session, started by its first vm test."""

    session: pytest.Session
    kernel: testvm.PinnedKernel
    vm_result: testvm.VmResult | None = None
    setup_error: str | None = None
    results: dict[str, InsideResult] = field(default_factory=dict)
    collect_errors: list[str] = field(default_factory=list)
    started: bool = False

    def selected_nodeids(self) -> list[str]:
        return [it.nodeid for it in self.session.items
                if _is_vm_item(it) and _item_kernel(it) == self.kernel.name]

    def inside_args(self, run_dir: Path) -> list[str]:
        # Exact nodeids, so -k, -m and file selections on the host select inside too; the
        # plan goes along, or the guest would parametrize by its default plan and not find a
        # test id of another one (`test_x[k7.3]` of the full plan).
        return [
            "env", f"{RESULTS_ENV}={run_dir / 'results.jsonl'}", f"DAMON_HP_VM_PLAN={VM_PLAN}",
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
            print(f"\n===== vm tier: booting the test VM on {self.kernel.release} "
                  f"({self.kernel.name}; mem {VM_MEMORY}, TCG, timeout {VM_TIMEOUT_S:.0f} s) to "
                  f"run {len(self.selected_nodeids())} vm tests inside "
                  f"(command: {run_dir / 'guest.sh'})", file=out)
            out.flush()
            self.vm_result = testvm.run_in_vm(
                cmd, memory=VM_MEMORY, timeout_s=VM_TIMEOUT_S, stdout=out, stderr=out,
                run_dir=run_dir, kernel=self.kernel,
            )
        except testvm.VmTerminated as err:
            # SIGTERM stops the session: no other kernel's VM may boot after it.
            pytest.exit(str(err), returncode=err.exit_code)
        except testvm.DamonHpError as err:
            self.setup_error = str(err)
            print(f"===== vm tier: cannot start the VM: {err}", file=out)
            return
        r = self.vm_result
        boot = f"{r.boot_seconds:.1f} s" if r.boot_seconds is not None else "never"
        print(f"===== vm tier: {self.kernel.release} VM done in {r.wall_seconds:.1f} s "
              f"(booted after {boot}), inside "
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
    tiers = {name: VmTier(session, testvm.pinned_kernel(name)) for name in testvm.PIN_FILES}
    for item in vm_items:
        tier = tiers[_item_kernel(item)]
        # Bodies and fixtures stay in the VM: the host only looks results up.
        item.setup = lambda: None  # type: ignore[method-assign]
        item.teardown = lambda: None  # type: ignore[method-assign]
        item.runtest = lambda nodeid=item.nodeid, tier=tier: tier.check(nodeid)  # type: ignore[method-assign]
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


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Main-kernel vm tests first, then the lts ones: each VM boots once and its tests report
    together (a stable sort keeps every other order). Within a kernel, the tests that read
    DAMON_STAT's kdamond (`damon_stat_on`) come first, on the freshly booted guest as a user's
    machine has it: a physical source reads a process only as well as its frames cluster, and
    after the tier's other tests the guest's free memory is scattered (a fresh-clone run of the
    full plan, 2026-11-26: DAMON_STAT's regions showed the hot buffer half huge after 300 s,
    where it passed in 66 s as the 21st test of another run)."""
    order = {name: i for i, name in enumerate(testvm.PIN_FILES)}
    items.sort(key=lambda it: (order[_item_kernel(it)], it.get_closest_marker("damon_stat_on")
                               is None) if _is_vm_item(it) else (-1, False))
