"""The export tests build C with gcc, and compare libraries with `tg.compile`'s programs planned for what an
exported library may call (`EXPORT_FEATURES`: no OpenBLAS), bit for bit."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tensorgraphs.export import EXPORT_FEATURES
from tensorgraphs.plan.choices import targeting


@pytest.fixture(autouse=True)
def needs_gcc() -> None:
    if shutil.which("gcc") is None:
        pytest.skip("exported libraries are built with gcc")


@pytest.fixture(autouse=True)
def planned_for_export() -> Iterator[None]:
    with targeting(EXPORT_FEATURES):
        yield
