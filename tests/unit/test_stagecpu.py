"""stagecpu: a stage's CPU is the calling thread's CPU time inside it, summed per name and
reported in pipeline order."""

from __future__ import annotations

import time

from damon_hp import stagecpu
from damon_hp.stagecpu import StageCpu


def test_a_stage_counts_the_cpu_spent_inside_it_and_not_time_asleep() -> None:
    cpu = StageCpu()
    with cpu.stage(stagecpu.DECIDE):
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
    with cpu.stage(stagecpu.EVENTS):
        time.sleep(0.2)  # waiting for the stream costs no CPU
    assert cpu.seconds[stagecpu.DECIDE] >= 0.05
    assert cpu.seconds[stagecpu.EVENTS] < 0.05


def test_stages_add_up_merge_and_come_out_in_pipeline_order() -> None:
    cpu = StageCpu()
    cpu.add("status", 0.5)
    cpu.add(stagecpu.MEASURE, 0.25)
    cpu.add(stagecpu.EVENTS, 1.0)
    cpu.merge({stagecpu.EVENTS: 1.0, stagecpu.PROCFS: 0.5})
    assert list(cpu.to_dict().items()) == [
        (stagecpu.EVENTS, 2.0), (stagecpu.PROCFS, 0.5), (stagecpu.MEASURE, 0.25), ("status", 0.5)]
    assert stagecpu.describe(cpu.to_dict(), 100.0).startswith("events 2.00 s (2.00 %), procfs")
    assert stagecpu.describe({}, 100.0) == "n/a"
