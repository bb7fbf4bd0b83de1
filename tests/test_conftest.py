"""The suite's own fixtures: the `device` marker decides whether the cpu device compiles small graphs."""

from __future__ import annotations

from collections import Counter
from typing import Callable

import numpy as np
import pytest

import tensorgraphs as tg
from tensorgraphs.backends.cpu import CPU
from tensorgraphs.backends.native import NativeBackend

CallCounter = Callable[..., Counter]  # the count_calls fixture


def double_a_small_tensor() -> np.ndarray:
    with tg.device("cpu"):
        return (tg.tensor(np.arange(6, dtype=np.float32)) * 2).numpy()


@pytest.mark.device("cpu", compile=True)
def test_the_compile_option_makes_a_six_element_graph_compile(count_calls: CallCounter, device_under_test: str) -> None:
    calls = count_calls(NativeBackend, "program")  # an interpreted graph needs no program
    np.testing.assert_array_equal(double_a_small_tensor(), np.arange(6) * 2)
    assert (device_under_test, CPU.interpret_below, calls["program"]) == ("cpu", 0, 1)


@pytest.mark.device("cpu")
def test_without_it_the_same_graph_is_interpreted(count_calls: CallCounter, device_under_test: str) -> None:
    calls = count_calls(NativeBackend, "program")
    np.testing.assert_array_equal(double_a_small_tensor(), np.arange(6) * 2)
    assert (device_under_test, calls["program"]) == ("cpu", 0) and CPU.interpret_below > 6


def test_count_calls_counts_each_function_by_name(count_calls: CallCounter) -> None:
    calls = count_calls(np, "zeros", "ones")
    np.zeros(2), np.zeros(3), np.ones(1)
    assert calls == {"zeros": 2, "ones": 1}


def test_an_unmarked_test_names_no_device(device_under_test: str | None) -> None:
    assert device_under_test is None



def test_test_modules_have_unique_basenames() -> None:
    """pytest's default import mode imports test files by basename (their folders have no __init__.py): two
    test_x.py in different folders make one of them an import error."""
    from pathlib import Path

    names = Counter(path.name for path in Path(__file__).parent.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
