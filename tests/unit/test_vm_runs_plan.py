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


def test_shards_keep_modules_whole_in_collection_order_and_under_the_cap() -> None:
    nodeids = ids("test_a.py", 3) + ids("test_b.py", 2) + ids("test_c.py", 4) + ids("test_d.py", 1)
    weight = seconds({"test_a.py": 100.0, "test_b.py": 10.0, "test_c.py": 20.0, "test_d.py": 50.0})
    # a: 300 s, over the cap: a shard of its own; c: 80 s, then d: 50 s fits (130), b: 20 s
    # does not (150): a third shard.
    assert vm_runs.shards_under(nodeids, 140.0, weight) == [
        ids("test_a.py", 3), ids("test_c.py", 4) + ids("test_d.py", 1), ids("test_b.py", 2)]
    assert vm_runs.shards_under(nodeids, 1000.0, weight) == [nodeids]


def test_makespan_runs_the_heaviest_first_each_on_the_first_free_worker() -> None:
    assert vm_runs.makespan([700.0, 1400.0, 1390.0, 710.0], 2) == 2100.0
    assert vm_runs.makespan([1160.0, 1160.0, 1160.0, 700.0], 2) == 2320.0
    assert vm_runs.makespan([5.0, 3.0], 1) == 8.0


def test_one_worker_runs_one_vm_per_kernel() -> None:
    main = ids("test_a.py", 20) + ids("test_b.py", 20)
    lts = ids("test_a.py", 10, "6.12")
    one = vm_runs.plan({"main": main, "lts": lts}, 1, lambda _n: 100.0)
    assert [(j.label, j.nodeids) for j in one] == [("k7.3", main), ("k6.12", lts)]


def test_two_workers_get_vms_that_end_together_not_equal_shards() -> None:
    # 7.3: modules of 850, 630, 540, 320, 290, 250, 170, 150, 100 s (3,300 s); 6.12: 700 s.
    # Three equal 7.3 shards of ~1,100 and the 6.12 VM end at ~2,300 (one worker idle for
    # ~400 s); shards sized so that one pairs with the 6.12 VM end at ~2,100.
    hefts = [850, 630, 540, 320, 290, 250, 170, 150, 100]
    table = {f"test_{n}.py": float(h) for n, h in enumerate(hefts)} | {"test_lts.py": 700.0}
    main = [i for n in range(len(hefts)) for i in ids(f"test_{n}.py", 1)]
    lts = ids("test_lts.py", 1, "6.12")
    weight = seconds(table)
    jobs = vm_runs.plan({"main": main, "lts": lts}, 2, weight)
    loads = [sum(weight(i) for i in j.nodeids) + vm_runs.VM_START_S for j in jobs]
    assert vm_runs.makespan(loads, 2) <= (3300 + 700) / 2 + 2 * vm_runs.VM_START_S + 50
    assert all(sum(weight(i) for i in j.nodeids) <= vm_runs.MAX_VM_S for j in jobs)
    assert loads == sorted(loads, reverse=True), "the heaviest VM first"
    assert sorted(n for j in jobs for n in j.nodeids) == sorted(main + lts)
    assert {j.kernel.release for j in jobs} == {testvm.pinned_kernel("main").release,
                                               testvm.pinned_kernel("lts").release}
    labels = sorted(j.label for j in jobs)
    assert labels[0] == "k6.12" and all(lb.startswith("k7.3 ") for lb in labels[1:])


def test_a_module_heavier_than_the_cap_is_a_vm_of_its_own() -> None:
    main = ids("test_big.py", 1) + ids("test_small.py", 1)
    weight = seconds({"test_big.py": 5000.0, "test_small.py": 10.0})
    jobs = vm_runs.plan({"main": main, "lts": []}, 2, weight)
    assert [j.nodeids for j in jobs] == [ids("test_big.py", 1), ids("test_small.py", 1)]


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


def test_two_modules_with_tests_that_must_run_first_never_share_a_vm() -> None:
    # Both fit one VM by weight, but only one can run first on the freshly booted guest.
    main = ids("test_stat.py", 2) + ids("test_src.py", 2) + ids("test_rest.py", 2)
    weight = seconds({"test_stat.py": 50.0, "test_src.py": 50.0, "test_rest.py": 50.0})
    first = set(ids("test_stat.py", 1) + ids("test_src.py", 1))
    shards = vm_runs.shards_under(main, 1000.0, weight, leads=first.__contains__)
    assert len(shards) == 2
    assert all(sum(n in first for n in shard) == 1 for shard in shards)
    assert vm_runs.shards_under(main, 1000.0, weight) == [main]
    jobs = vm_runs.plan({"main": main, "lts": []}, 2, weight, leads=first.__contains__)
    assert all(sum(n in first for n in j.nodeids) == 1 for j in jobs)
