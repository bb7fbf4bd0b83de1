"""The export tests build C with gcc."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(autouse=True)
def needs_gcc() -> None:
    if shutil.which("gcc") is None:
        pytest.skip("exported libraries are built with gcc")
