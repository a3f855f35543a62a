"""The Python streamcluster reference (tests/reference/streamcluster_ref.py) against libc's
drand48 and against the original program's published results (workloads-spec.md A.15, A.18).

The C program is checked against this reference in tests/host/test_streamcluster.py; this file
makes sure the reference itself is right, so that comparison means something.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import sys
from pathlib import Path

import pytest

REF_PATH = Path(__file__).resolve().parents[1] / "reference" / "streamcluster_ref.py"


def _load_reference():
    spec = importlib.util.spec_from_file_location("streamcluster_ref", REF_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["streamcluster_ref"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


ref = _load_reference()

# workloads-spec.md A.15: md5 of output.txt and the (ID, weight) of each final centre.
SPEC_OUTPUT = {
    "test": ("d39ff2e704889e63774e88946391afe5", [(3, 6), (6, 4)]),
    "simdev": ("a679d569a84ffb6656104ee6fa55ed19", [(4, 3), (9, 8), (12, 5)]),
    "simsmall": (
        "b64e200338999bcb3152ca00444b0154",
        [(25, 357), (336, 196), (603, 293), (613, 326), (797, 732), (831, 342), (1090, 210),
         (1186, 229), (1897, 257), (2177, 290), (2516, 237), (2897, 424), (3093, 203)],
    ),
}

# workloads-spec.md A.18: pgain calls, accepted, pspeedy calls, speedy openings, pFL outer
# iterations, z-bisection steps, intermediate centres.
SPEC_COUNTS = {
    "test": (120, 3, 1, 1, 5, 2, 2),
    "simdev": (621, 6, 1, 2, 9, 4, 3),
    "simsmall": (1253, 21, 5, 33, 7, 5, 13),
    "simmedium": (1432, 18, 5, 29, 8, 5, 11),
}


def _centres(text: str) -> list[tuple[int, int]]:
    records = text.split("\n\n")[:-1]
    return [(int(r.split("\n")[0]), round(float(r.split("\n")[1]))) for r in records]


def test_drand48_follows_libc_sequence_including_batches():
    libc = ctypes.CDLL(None)
    libc.lrand48.restype = ctypes.c_long
    libc.srand48(ctypes.c_long(1))
    expected = [libc.lrand48() for _ in range(70_000)]  # crosses a 65 536-value batch edge

    one_by_one = ref.Drand48(1)
    assert [one_by_one.lrand48() for _ in range(1000)] == expected[:1000]
    batched = ref.Drand48(1)
    got = list(batched.lrand48_many(3)) + list(batched.lrand48_many(69_997))
    assert got == expected


def test_unit_draw_divides_by_two_to_the_31_in_float():
    gen = ref.Drand48(1)
    first = ref.Drand48(1).lrand48()
    assert gen.unit() == ref.F32(first) / ref.F32(2**31)


@pytest.mark.parametrize("name", sorted(SPEC_OUTPUT))
def test_reference_reproduces_original_output_bytes(name):
    md5, centres = SPEC_OUTPUT[name]
    result = ref.run_set(name)
    assert _centres(result.output) == centres
    assert hashlib.md5(result.output.encode()).hexdigest() == md5


@pytest.mark.parametrize("name", sorted(SPEC_COUNTS))
def test_reference_operation_counts_match_original(name):
    c = ref.run_set(name).counters
    got = (c.pgain, c.pgain_accepted, c.pspeedy, c.speedy_opened, c.pfl_iterations,
           c.bisection_steps, c.intermediate_centres)
    assert got == SPEC_COUNTS[name]


def test_thread_partition_changes_no_result_on_simsmall():
    one, three = ref.run_set("simsmall", nproc=1), ref.run_set("simsmall", nproc=3)
    assert one.output == three.output
    assert one.chunk_cost == three.chunk_cost


def test_multi_chunk_stream_keeps_total_weight_and_clusters_final_pass():
    # 4 chunks of 1000 points leave more than k2 intermediate centres, so the final pass is a
    # real clustering (the PARSEC sim sets only ever take its trivial path).
    result = ref.run_args(10, 20, 8, 4000, 1000, 200)
    assert result.counters.intermediate_centres > 20
    assert result.weight == 4000
    assert 10 <= result.centres <= 20
    assert result.final_cost > 0
    ids = [i for i, _ in _centres(result.output)]
    assert ids == sorted(ids) and ids[-1] < 4000


def test_assignment_cost_is_weighted_squared_distance():
    ps = ref.PointSet.new(3, 2)
    ps.coords[:] = [[0, 0], [3, 4], [1, 1]]
    ps.weight[:] = [1, 2, 5]
    ps.assign[:] = [0, 0, 0]
    ps.num = 3
    assert ref.StreamCluster.assignment_cost(ps) == 0 + 2 * 25 + 5 * 2
