"""The suite's own fixtures: the `device` marker decides whether the cpu device compiles small graphs."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.backends.cpu import CPU, CpuBackend


def programs_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the programs the cpu device looks up or builds from now on (an interpreted graph needs none)."""
    calls = [0]
    program = CpuBackend.program

    def counting(self: CpuBackend, *args: object, **kwargs: object) -> object:
        calls[0] += 1
        return program(self, *args, **kwargs)

    monkeypatch.setattr(CpuBackend, "program", counting)
    return calls


def double_a_small_tensor() -> np.ndarray:
    with tg.device("cpu"):
        return (tg.tensor(np.arange(6, dtype=np.float32)) * 2).numpy()


@pytest.mark.device("cpu", compile=True)
def test_the_compile_option_makes_a_six_element_graph_compile(monkeypatch: pytest.MonkeyPatch,
                                                              device_under_test: str) -> None:
    calls = programs_built(monkeypatch)
    np.testing.assert_array_equal(double_a_small_tensor(), np.arange(6) * 2)
    assert (device_under_test, CPU.interpret_below, calls) == ("cpu", 0, [1])


@pytest.mark.device("cpu")
def test_without_it_the_same_graph_is_interpreted(monkeypatch: pytest.MonkeyPatch, device_under_test: str) -> None:
    calls = programs_built(monkeypatch)
    np.testing.assert_array_equal(double_a_small_tensor(), np.arange(6) * 2)
    assert (device_under_test, calls) == ("cpu", [0]) and CPU.interpret_below > 6


def test_an_unmarked_test_names_no_device(device_under_test: str | None) -> None:
    assert device_under_test is None
