"""Sizes and shares as people write them, for the CLI and the daemon's config alike.

    parse_size("512M") == parse_size("512MiB") == 512 << 20    K, M, G, T are 1024-based
    parse_share("25%") == 25.0; parse_share("512M") is None    a share of what, the caller says

A share's base differs by place (`--max-huge 25%` is of the target's RSS, a daemon `budget =
"25%"` of the machine's RAM), so it is returned as a bare percentage and each caller names it.
"""

from __future__ import annotations

import re
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_SHARE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_SHIFT = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}


def parse_size(value: Any) -> int:
    """'512M', '1G', '1.5GiB', 4096 -> bytes (1024-based); ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"{value!r} is not a size (use bytes or K, M, G, T: \"512M\")")
    return int(float(m[1]) * (1 << _SHIFT[m[2].upper()]))


def parse_share(value: Any) -> float | None:
    """'25%' -> 25.0; None when `value` is not written as a percentage."""
    m = _SHARE.match(value) if isinstance(value, str) else None
    return float(m[1]) if m else None
