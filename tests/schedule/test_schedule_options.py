"""Schedule options change how a generated kernel runs, never its values: every option the kernel search may
choose, alone and combined, gives the numpy device's results, and renders what it says."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import tensorgraphs as tg
import tensorgraphs.nn.functional as F
from tensorgraphs.backends.cpu import CPU_TARGET
from tensorgraphs.codegen.loop_ir import Loop, ScheduleOptions, walk
from tensorgraphs.plan import kernel_search
from tensorgraphs.plan.kernel_search import KernelSearch, searchable
from tensorgraphs.schedule.fusion import schedule_kernels
from tensorgraphs.schedule.options import option_space, with_options
from tensorgraphs.testing import fuzz_programs

SCHEDULES = [
    ScheduleOptions(threads=1),
    ScheduleOptions(threads=2, collapse=2),
    ScheduleOptions(unroll=4, lanes=8),
    ScheduleOptions(vector_bits=128, lanes=32, unroll=8),
    ScheduleOptions(threads=2, collapse=2, unroll=2, vector_bits=256, lanes=8),
]


@pytest.fixture
def forced_schedule(monkeypatch: pytest.MonkeyPatch, isolated_kernels) -> list[ScheduleOptions]:
    """Every generated kernel of the programs built in the test runs `chosen[0]`'s schedule."""
    chosen: list[ScheduleOptions] = [ScheduleOptions()]

    def schedule(self, kernels, target, search, measure=None):
        return [with_options(k, chosen[0]) if searchable(k) else k for k in kernels]

    monkeypatch.setattr(KernelSearch, "schedule", schedule)
    return chosen


def _programs(rng: np.random.Generator) -> dict[str, tuple[Callable, list[np.ndarray], Callable]]:
    """name -> (function of tg tensors, its arguments, the same function of numpy float64 arrays)."""
    x = rng.standard_normal((40, 300)).astype(np.float32)
    tall = rng.standard_normal((3, 70000)).astype(np.float32)
    square = rng.standard_normal((48, 80)).astype(np.float32)
    positions = rng.integers(0, 40, (40, 300))

    def softmax(a):
        e = np.exp(a - a.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    return {
        "softmax": (lambda a: F.softmax(a * 2.0, dim=-1), [x], lambda a: softmax(a * 2.0)),
        "column sums": (lambda a: (a * a).sum(0), [x], lambda a: (a * a).sum(0)),
        "short outer loop": (lambda a: a.exp() * 2.0 + a.sum(1, keepdim=True), [tall],
                             lambda a: np.exp(a) * 2.0 + a.sum(1, keepdims=True)),
        "transpose": (lambda a: a.T * 3.0 + 1.0, [square], lambda a: a.T * 3.0 + 1.0),
        "cumsum": (lambda a: a.cumsum(1), [x], lambda a: a.cumsum(1)),
        "row max": (lambda a: a.amax(1) - a.amin(1), [x], lambda a: a.max(1) - a.min(1)),
        "scatter_add": (lambda a: tg.zeros(40, 300).scatter_add(0, tg.tensor(positions), a), [x],
                        lambda a: _scatter_add(positions, a)),
    }


def _scatter_add(positions: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.zeros(values.shape)
    np.add.at(out, (positions, np.arange(values.shape[1])), values)
    return out


@pytest.mark.parametrize("options", SCHEDULES, ids=str)
def test_every_schedule_gives_the_reference_values(forced_schedule, options):
    forced_schedule[0] = options
    rng = np.random.default_rng(0)
    for name, (function, arrays, reference) in _programs(rng).items():
        expected = reference(*(a.astype(np.float64) for a in arrays))
        got = tg.compile(function)(*map(tg.tensor, arrays)).numpy()
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5, err_msg=f"{name} with {options}")


@pytest.mark.parametrize("options", [ScheduleOptions(threads=1, unroll=4, lanes=8), SCHEDULES[-1]], ids=str)
def test_fuzzed_programs_agree_with_the_numpy_device_under_a_schedule(forced_schedule, options):
    forced_schedule[0] = options
    programs = [fuzz_programs.random_program(seed) for seed in range(1000, 1012)]
    assert fuzz_programs.check_batch(programs, modes=("cpu",)) == []


def test_options_render_what_they_say():
    x = tg.tensor(np.ones((3, 70000), np.float32))
    (kernel,) = [k for k in schedule_kernels([(x * x).sum(1).node], {x.node}.__contains__).kernels
                 if searchable(k)]
    render = lambda options: CPU_TARGET.renderer(with_options(kernel, options)).render()  # noqa: E731
    default = render(ScheduleOptions())
    assert "omp parallel" in default and "prefer-vector-width" not in default and "_lane[16]" in default
    assert "omp parallel" not in render(ScheduleOptions(threads=1))
    assert "num_threads(2)" in render(ScheduleOptions(threads=2))
    assert "collapse" not in render(ScheduleOptions(collapse=2))  # a reduction stands between the loops
    assert "_lane[8]" in render(ScheduleOptions(lanes=8))
    assert 'target("prefer-vector-width=128")' in render(ScheduleOptions(vector_bits=128))
    assert "#pragma GCC unroll 4" in render(ScheduleOptions(threads=1, unroll=4))
    columns = x[:, :69999]  # rows not one run: two loops (a contiguous plane is one, codegen.loop_merge)
    (elementwise,) = schedule_kernels([(columns * 2.0 + 1.0).node], {x.node}.__contains__).kernels
    assert "collapse(2)" in CPU_TARGET.renderer(with_options(elementwise, ScheduleOptions(collapse=2))).render()


def test_a_serial_kernel_never_runs_on_threads_and_option_space_offers_only_what_applies():
    base, values = tg.zeros(50, 4000), tg.tensor(np.ones((70, 4000), np.float32))
    positions = tg.tensor(np.arange(70 * 4000).reshape(70, 4000) % 50)
    roots = [base.scatter_add(0, positions, values).node]
    (scatter,) = [k for k in schedule_kernels(roots, {values.node, positions.node}.__contains__).kernels
                  if k.serial]
    threaded = with_options(scatter, ScheduleOptions(threads=2))
    assert not any(isinstance(s, Loop) and s.parallel for s in walk(threaded.body))
    assert set(option_space(scatter)) == {"unroll", "vector_bits"}


def test_the_default_schedule_is_the_lowering_own():
    x = tg.tensor(np.ones((40, 300), np.float32))
    for kernel in schedule_kernels([F.softmax(x, dim=-1).node], {x.node}.__contains__).kernels:
        assert with_options(kernel, ScheduleOptions()) == kernel
    assert kernel_search.searchable(kernel)
