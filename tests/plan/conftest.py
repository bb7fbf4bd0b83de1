"""Every planner test gets its own kernel database (nothing touches the user's cache) and fixed roofline peaks; a
test that searches kernel schedules measures them by a fixed function (`measured`)."""

from __future__ import annotations

import pytest
from plan_testing import FP, PEAKS, fixed_seconds

from tensorgraphs.codegen.loop_ir import Kernel, ScheduleOptions
from tensorgraphs.kerneldb import KernelDB
from tensorgraphs.plan import CostModel, Planner, kernel_search, step_check
from tensorgraphs.plan.implementations import IMPLEMENTATIONS
from tensorgraphs.plan.library import native_implementations


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def without_native_implementations():
    """The tests reason about injected numpy/torch timings; the native GEMMs (present only on AVX-512
    machines, unmeasured here) would otherwise win every matmul by their roofline estimate."""
    native = [k for k in native_implementations() if _registered(k.name)]
    for kernel in native:
        IMPLEMENTATIONS.unregister(kernel.name)
    yield
    for kernel in native:
        IMPLEMENTATIONS.register(kernel, verify=False)


def _registered(name: str) -> bool:
    try:
        IMPLEMENTATIONS.get(name)
    except KeyError:
        return False
    return True


@pytest.fixture
def db(tmp_path) -> KernelDB:
    return KernelDB(tmp_path / "kernels.sqlite")


@pytest.fixture
def model(db) -> CostModel:
    return CostModel(db, fingerprint=FP, peaks=PEAKS)


@pytest.fixture
def planner(model) -> Planner:
    return Planner(model)


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch, isolated_kernels) -> list[tuple[str, ScheduleOptions]]:
    """Every (kernel, schedule) measured, in order; the measurement is `fixed_seconds`, never a clock (and a step
    check finds the tuned program faster: `plan.step_check` keeps what the search chose)."""
    calls: list[tuple[str, ScheduleOptions]] = []

    def measure_on(target):
        def measure(kernel: Kernel, schedules: list[ScheduleOptions]) -> list[float]:
            calls.extend((kernel.name, options) for options in schedules)
            return [fixed_seconds(options) for options in schedules]

        return measure

    monkeypatch.setattr(kernel_search, "timed_on", measure_on)
    monkeypatch.setattr(kernel_search, "_SEARCHES", {})
    monkeypatch.setattr(step_check, "time_programs", lambda tuned, default: (1.0, 2.0))
    monkeypatch.setattr(step_check, "_CHECKS", {})
    return calls
