"""Shared test helpers: the skip-locally-but-fail-in-CI rule for heavy dependencies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kioku.datasets import shared_dir


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def need(condition: bool, why: str) -> None:
    """Skip when a service or heavy build is missing — except in CI, where that is a failure."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"CI=true but {why}")
    pytest.skip(why)


def shared_file(*parts: str) -> Path:
    p = shared_dir().joinpath(*parts)
    need(p.exists(), f"shared data {p} is missing")
    return p
