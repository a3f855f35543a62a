"""How the vm tier splits its tests into VMs run side by side (tests/vm_runs.py), and how a
host vm test reads its VM's results."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import vm_runs
from damon_hp import testvm


def ids(module: str, n: int, kernel: str = "7.3") -> list[str]:
    return [f"tests/vm/{module}::test_{i}[k{kernel}]" for i in range(n)]


def seconds(table: dict[str, float]) -> Callable[[str], float]:
    return lambda nodeid: table.get(vm_runs.module_of(nodeid).rsplit("/", 1)[-1], 1.0)


def test_a_split_keeps_modules_whole_in_collection_order_and_balances_their_weight() -> None:
    nodeids = ids("test_a.py", 3) + ids("test_b.py", 2) + ids("test_c.py", 4) + ids("test_d.py", 1)
    weight = seconds({"test_a.py": 100.0, "test_b.py": 10.0, "test_c.py": 20.0, "test_d.py": 50.0})
    shards = vm_runs.split_modules(nodeids, 2, weight)
    # a: 300 s; c: 80 s, d: 50 s, b: 20 s -> 150 s.
    assert shards == [ids("test_a.py", 3),
                      ids("test_b.py", 2) + ids("test_c.py", 4) + ids("test_d.py", 1)]


def test_a_split_never_makes_more_shards_than_modules() -> None:
    nodeids = ids("test_a.py", 5)
    assert vm_runs.split_modules(nodeids, 3, lambda _n: 1.0) == [nodeids]


def test_one_worker_runs_one_vm_per_kernel_and_two_split_the_bigger_kernel() -> None:
    main = ids("test_a.py", 20) + ids("test_b.py", 20)
    lts = ids("test_a.py", 10, "6.12")
    by_kernel = {"main": main, "lts": lts}
    one = vm_runs.plan(by_kernel, 1, lambda _n: 1.0)
    assert [(j.label, j.nodeids) for j in one] == [("k7.3", main), ("k6.12", lts)]
    two = vm_runs.plan(by_kernel, 2, lambda _n: 1.0)
    assert [(j.label, len(j.nodeids)) for j in two] == [
        ("k7.3 1/2", 20), ("k7.3 2/2", 20), ("k6.12", 10)]
    assert sorted(n for j in two for n in j.nodeids) == sorted(main + lts)
    assert {j.kernel.release for j in two} == {testvm.pinned_kernel("main").release,
                                               testvm.pinned_kernel("lts").release}


def test_prefixed_output_holds_a_partial_line_until_it_ends() -> None:
    lines: list[str] = []
    stream = vm_runs._Prefixed(lines.append, "[k7.3 1/2] ")
    stream.write("tests/vm/test_a.py::t PAS")
    stream.flush()
    assert lines == []
    stream.write("SED\nnext ")
    stream.write("line\nlast")
    stream.finish()
    assert lines == ["[k7.3 1/2] tests/vm/test_a.py::t PASSED", "[k7.3 1/2] next line",
                     "[k7.3 1/2] last"]


def finished_job(tmp_path: Path, records: list[dict]) -> vm_runs.VmJob:
    job = vm_runs.VmJob(testvm.pinned_kernel("main"), ["a", "b", "c", "d"], "k7.3")
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    job.vm_result = testvm.VmResult(exit_code=1, booted=True, finished=True, timed_out=False,
                                    run_dir=tmp_path, boot_seconds=9.0, wall_seconds=60.0)
    job.read_results(tmp_path / "results.jsonl")
    return job


def record(nodeid: str, when: str, outcome: str, text: str = "") -> dict:
    return {"kind": "test", "nodeid": nodeid, "when": when, "outcome": outcome, "xfail": False,
            "text": text, "sections": "", "duration": 1.0}


def test_a_host_vm_test_fails_on_its_worst_inside_phase_on_a_skip_and_on_no_result(
        tmp_path: Path) -> None:
    job = finished_job(tmp_path, [
        record("a", "setup", "passed"), record("a", "call", "passed"),
        record("b", "call", "passed"), record("b", "teardown", "failed", "leftover kdamond"),
        record("c", "setup", "skipped", "needs zram"),
    ])
    assert job.failure("a") is None
    assert "teardown: failed" in (job.failure("b") or "")
    assert "leftover kdamond" in (job.failure("b") or "")
    assert "never skips" in (job.failure("c") or "")
    assert "did not run inside the VM" in (job.failure("d") or "")


def test_every_test_of_a_vm_that_timed_out_fails_with_the_vms_label(tmp_path: Path) -> None:
    job = vm_runs.VmJob(testvm.pinned_kernel("main"), ["a"], "k7.3 2/2")
    job.vm_result = testvm.VmResult(exit_code=testvm.EXIT_TIMEOUT, booted=True, finished=False,
                                    timed_out=True, run_dir=tmp_path, boot_seconds=9.0,
                                    wall_seconds=2700.0, console_tail=["last line"])
    why = job.failure("a") or ""
    assert why.startswith("vm tier (k7.3 2/2): the test VM was killed after its timeout (2700 s)")
    assert "last line" in why


def test_two_workers_get_about_two_vms_each_of_equal_weight() -> None:
    main = ids("test_a.py", 10) + ids("test_b.py", 10) + ids("test_c.py", 10)
    lts = ids("test_a.py", 10, "6.12")
    jobs = vm_runs.plan({"main": main, "lts": lts}, 2, lambda _n: 1.0)
    assert sorted((j.label, len(j.nodeids)) for j in jobs) == [
        ("k6.12", 10), ("k7.3 1/3", 10), ("k7.3 2/3", 10), ("k7.3 3/3", 10)]
