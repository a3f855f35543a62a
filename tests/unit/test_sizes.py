"""One size parser for the CLI and the daemon's config; shares carry no unit of their own."""

from __future__ import annotations

import pytest
from damon_hp.sizes import parse_share, parse_size


@pytest.mark.parametrize(("text", "want"), [
    ("512M", 512 << 20), ("512MiB", 512 << 20), ("512mb", 512 << 20), ("1.5G", 3 << 29),
    ("4096", 4096), (4096, 4096), (" 2k ", 2048), ("1T", 1 << 40),
])
def test_sizes_are_1024_based_with_an_optional_suffix(text, want) -> None:
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "M", "-1M", "12Q", "25%", True, -5, None, 1.5])
def test_what_is_not_a_size_is_refused(text) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


def test_a_share_is_a_bare_percentage_and_anything_else_is_none() -> None:
    assert parse_share("25%") == 25.0 and parse_share(" 2.5 % ") == 2.5
    assert parse_share("512M") is None and parse_share(25) is None
