"""Shared by every tier: kept tiny on purpose (all tests load it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def in_vm() -> bool:
    """True inside the test VM started by `damon-hp vm run` (the vm tier's harness)."""
    return os.environ.get("DAMON_HP_IN_VM") == "1"


@pytest.fixture(scope="session")
def project_root() -> Path:
    return PROJECT_ROOT
