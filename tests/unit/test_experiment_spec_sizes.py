"""Sizes in experiment files: spec.parse_size is sizes.parse_size with the spec's own floor (a
swap device of 0 bytes is no swap device) and the inputs the spec's earlier parser accepted."""

from __future__ import annotations

import pytest
from damon_hp.experiment import spec
from damon_hp.experiment.spec import SpecError


def experiment(swap_size: object) -> dict:
    return {
        "experiment": {"name": "t", "repetitions": 1, "arms": ["thp-never", "thp-always"],
                       "memory": ["sufficient", "insufficient"]},
        "workloads": [{"program": "hotcold", "args": []}],
        "insufficient": {"swap_size": swap_size},
    }


@pytest.mark.parametrize(("value", "want"), [
    ("512MiB", 512 << 20), (" 2g ", 2 << 30), ("1T", 1 << 40),
    # TOML hands `swap_size = 1e9` over as a float; it was read as its bytes and still is
    (1e9, 10**9), (4096.0, 4096),
])
def test_the_sizes_module_syntax_and_toml_floats_are_read(value, want) -> None:
    assert spec.parse_size(value) == want


@pytest.mark.parametrize("value", [0, -5, "0", "0M", "0.0001K"])
def test_a_size_of_no_bytes_is_refused_as_before(value) -> None:
    with pytest.raises(ValueError, match="size must be > 0"):
        spec.parse_size(value)


@pytest.mark.parametrize("value", ["", "M", "12Q", "25%", "-1M", True, None])
def test_what_is_not_a_size_is_refused(value) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        spec.parse_size(value)


def test_an_experiment_file_gets_its_swap_size_and_a_bad_one_is_named() -> None:
    assert spec.parse(experiment("256M")).insufficient.swap_bytes == 256 << 20
    with pytest.raises(SpecError, match=r"\[insufficient\]\.swap_size.*is not a size"):
        spec.parse(experiment("lots"))
    with pytest.raises(SpecError, match=r"\[insufficient\]\.swap_size.*must be > 0"):
        spec.parse(experiment(0))
