"""Every planner test gets its own kernel database (nothing touches the user's cache) and fixed roofline peaks."""

from __future__ import annotations

import pytest
from plan_testing import FP, PEAKS

from tensorgraphs.kerneldb import KernelDB
from tensorgraphs.plan import CostModel, Planner


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def db(tmp_path) -> KernelDB:
    return KernelDB(tmp_path / "kernels.sqlite")


@pytest.fixture
def model(db) -> CostModel:
    return CostModel(db, fingerprint=FP, peaks=PEAKS)


@pytest.fixture
def planner(model) -> Planner:
    return Planner(model)
