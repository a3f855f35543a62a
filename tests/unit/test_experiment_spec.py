"""Experiment files: validation messages and the run matrix they expand to."""

from __future__ import annotations

from pathlib import Path

import pytest
from damon_hp.experiment import spec
from damon_hp.experiment.spec import SpecError

ROOT = Path(__file__).resolve().parents[2]


def doc(**over):
    d = {
        "experiment": {
            "name": "t",
            "repetitions": 2,
            "arms": ["thp-never", "thp-always", "oracle"],
            "memory": ["sufficient", "insufficient"],
        },
        "workloads": [
            {"program": "hotcold", "args": ["--threads", "{threads}"], "threads": [1, 2]},
            {"program": "streamcluster", "input": "simdev"},
        ],
    }
    for k, v in over.items():
        if k == "workloads":
            d["workloads"] = v
        else:
            d["experiment"][k] = v
    return d


def test_matrix_is_the_product_minus_inapplicable_pairs():
    exp = spec.parse(doc())
    cells, skipped = spec.expand(exp)
    # hotcold: 3 arms x 2 thread counts x 2 memory x 2 reps = 24
    # streamcluster: oracle left out -> 2 arms x 1 x 2 x 2 = 8
    assert len(cells) == 24 + 8
    assert [(s.workload, s.arm) for s in skipped] == [("streamcluster-simdev", "oracle")]
    assert "does not print its hot ranges" in skipped[0].reason
    assert len({c.id for c in cells}) == len(cells)


def test_each_repetition_runs_every_arm_before_the_next_repetition():
    cells, _ = spec.expand(spec.parse(doc()))
    reps = [c.rep for c in cells]
    assert reps == sorted(reps)


def test_arm_order_rotates_between_repetitions():
    cells, _ = spec.expand(spec.parse(doc()))
    def first_group(rep):
        return [c.arm for c in cells if c.rep == rep and c.workload.program == "hotcold"
                and c.threads == 1 and c.memory == "sufficient"]
    assert first_group(0) == ["thp-never", "thp-always", "oracle"]
    assert first_group(1) == ["thp-always", "oracle", "thp-never"]


def test_sufficient_cells_run_before_insufficient_ones_of_the_same_workload():
    cells, _ = spec.expand(spec.parse(doc()))
    for i, c in enumerate(cells):
        if c.memory == "insufficient":
            earlier = cells[:i]
            assert any(e.arm == "thp-always" and e.memory == "sufficient"
                       and e.workload == c.workload and e.threads == c.threads
                       and e.rep == c.rep for e in earlier)


def test_workload_can_narrow_arms_and_memory():
    d = doc(workloads=[{"program": "hotcold", "args": [], "arms": ["thp-never", "oracle"],
                        "memory": ["sufficient"]}])
    cells, _ = spec.expand(spec.parse(d))
    assert {c.arm for c in cells} == {"thp-never", "oracle"}
    assert {c.memory for c in cells} == {"sufficient"}


def test_workload_names_come_from_program_and_input():
    exp = spec.parse(doc())
    assert [w.name for w in exp.workloads] == ["hotcold", "streamcluster-simdev"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arms": ["thp-always"]}, "must include 'thp-never'"),
        ({"arms": ["thp-never", "thp-sometimes"]}, "unknown value 'thp-sometimes'"),
        ({"arms": ["thp-never", "oracle"]}, "needs 'thp-always'"),
        ({"memory": ["insufficient"]}, "needs 'sufficient' too"),
        ({"where": "cloud"}, "where"),
        ({"repetitions": 0}, "repetitions"),
        ({"colour": "blue"}, "unknown keys ['colour']"),
    ],
)
def test_bad_experiment_section_is_rejected_with_the_key_named(change, message):
    with pytest.raises(SpecError, match=None) as e:
        spec.parse(doc(**change))
    assert message in str(e.value)


def test_workload_needs_exactly_one_of_input_and_args():
    with pytest.raises(SpecError) as e:
        spec.parse(doc(workloads=[{"program": "streamcluster", "input": "test", "args": []}]))
    assert "exactly one of 'input'" in str(e.value)
    with pytest.raises(SpecError):
        spec.parse(doc(workloads=[{"program": "streamcluster"}]))


def test_two_workloads_with_the_same_name_are_rejected():
    w = {"program": "hotcold", "args": []}
    with pytest.raises(SpecError) as e:
        spec.parse(doc(workloads=[w, dict(w)]))
    assert "add 'label'" in str(e.value)


def test_agent_args_only_for_damon_hp_arms():
    d = doc()
    d["arm"] = {"oracle": {"agent_args": ["--x"]}}
    with pytest.raises(SpecError):
        spec.parse(d)
    d["arm"] = {"damon-hp": {"agent_args": ["--max-huge", "50%"], "thp": "never"}}
    exp = spec.parse(d)
    assert exp.options("damon-hp").agent_args == ("--max-huge", "50%")
    assert exp.options("damon-hp").thp == "never"
    assert exp.options("oracle").agent_args == ()


def test_files_from_before_the_arms_were_named_still_parse():
    old = doc()
    old["experiment"]["policies"] = old["experiment"].pop("arms")
    old["workloads"][0]["policies"] = ["thp-never", "thp-always"]
    old["insufficient"] = {"policies": ["thp-never", "thp-always"]}
    old["policy"] = {"damon-hp": {"agent_args": ["--max-huge", "50%"]}}
    new = doc()
    new["workloads"][0]["arms"] = ["thp-never", "thp-always"]
    new["insufficient"] = {"arms": ["thp-never", "thp-always"]}
    new["arm"] = {"damon-hp": {"agent_args": ["--max-huge", "50%"]}}
    assert spec.parse(old) == spec.parse(new)


def test_an_arm_list_under_both_its_names_is_rejected():
    d = doc()
    d["experiment"]["policies"] = ["thp-never"]
    with pytest.raises(SpecError) as e:
        spec.parse(d)
    assert "both 'arms' and its old name 'policies'" in str(e.value)


@pytest.mark.parametrize(("text", "value"), [("4096", 4096), ("512M", 512 << 20),
                                             ("2G", 2 << 30), ("1.5K", 1536), (64, 64)])
def test_sizes_use_1024_based_suffixes(text, value):
    assert spec.parse_size(text) == value


def test_bad_toml_names_the_file(tmp_path):
    p = tmp_path / "x.toml"
    p.write_text("[experiment\n")
    with pytest.raises(SpecError) as e:
        spec.load(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("name", ["smoke", "quick", "thesis"])
def test_bundled_experiment_files_are_valid(name):
    exp = spec.load(ROOT / "experiments" / f"{name}.toml")
    cells, _ = spec.expand(exp)
    assert cells
    assert exp.expected_duration


def test_insufficient_memory_can_be_limited_to_some_arms():
    d = doc()
    d["experiment"]["arms"] = ["thp-never", "thp-always", "oracle"]
    d["insufficient"] = {"arms": ["thp-never", "thp-always"]}
    cells, _ = spec.expand(spec.parse(d))
    assert {c.arm for c in cells if c.memory == "insufficient"} == {"thp-never",
                                                                         "thp-always"}
    assert "oracle" in {c.arm for c in cells if c.memory == "sufficient"}
    d["insufficient"] = {"arms": ["thp-always", "oracle"]}
    with pytest.raises(SpecError) as e:
        spec.parse(d)
    assert "must include 'thp-never'" in str(e.value)
